package gitsnap

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"github.com/rs/zerolog"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"

	"github.com/homelab/bootstrap/internal/testcert"
)

func serveFixture(t *testing.T) (fixture, *Server, chan os.Signal) {
	t.Helper()
	fx := newFixture(t)
	srv, refresh := startServer(t, ServerOptions{
		Build: BuildOptions{Dir: fx.dir, Branch: testRepoBranch, Excludes: fx.excludes, Protect: fx.protect, FluxPath: fixtureFluxPath, ServeWholeTree: true},
	})
	return fx, srv, refresh
}

func TestGitCLIClonesTheSnapshot(t *testing.T) {
	fx, srv, _ := serveFixture(t)
	hash := srv.Snapshot().Hash.String()

	// ls-remote: the branch and a symbolic HEAD pointing at it.
	out := git(t, fx.dir, "ls-remote", "--symref", srv.URL())
	for _, want := range []string{
		"ref: refs/heads/main\tHEAD",
		hash + "\tHEAD",
		hash + "\trefs/heads/main",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("ls-remote output lacks %q:\n%s", want, out)
		}
	}

	for _, tc := range []struct {
		name string
		args []string
	}{
		{"full", nil},
		{"depth 1", []string{"--depth", "1"}},
		{"depth 1 protocol v0", []string{"--depth", "1", "-c", "protocol.version=0"}},
		{"bare", []string{"--bare"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "clone")
			args := append([]string{"clone", "-q"}, tc.args...)
			git(t, "", append(args, srv.URL(), dst)...)
			git(t, dst, "fsck", "--full", "--strict", "--no-dangling")
			if got := strings.TrimSpace(git(t, dst, "rev-parse", "HEAD")); got != hash {
				t.Errorf("cloned HEAD = %s, want %s", got, hash)
			}
			if got := strings.TrimSpace(git(t, dst, "rev-parse", "--abbrev-ref", "HEAD")); got != "main" {
				t.Errorf("checked-out branch = %s, want main", got)
			}
			if got := strings.TrimSpace(git(t, dst, "rev-parse", "HEAD^{tree}")); got != srv.Snapshot().Tree.String() {
				t.Errorf("tree = %s, want %s", got, srv.Snapshot().Tree)
			}
			if got := strings.TrimSpace(git(t, dst, "rev-list", "--count", "HEAD")); got != "1" {
				t.Errorf("history has %s commits, want 1", got)
			}
			if !slicesContain(tc.args, "--bare") {
				checkClone(t, fx, dst)
			}
		})
	}
}

// checkClone compares a checked-out clone with the fixture's expectations.
func checkClone(t *testing.T, fx fixture, dst string) {
	t.Helper()
	listed := strings.Fields(git(t, dst, "ls-tree", "-r", "--name-only", "HEAD"))
	if got, want := strings.Join(listed, " "), strings.Join(sortedKeys(fx.included), " "); got != want {
		t.Errorf("cloned files:\n got  %s\n want %s", got, want)
	}
	for p, want := range fx.included {
		full := filepath.Join(dst, filepath.FromSlash(p))
		var got string
		if fx.modes[p] == filemode.Symlink {
			target, err := os.Readlink(full)
			if err != nil {
				t.Errorf("%s is not a symlink in the clone: %v", p, err)
				continue
			}
			got = target
		} else {
			b, err := os.ReadFile(full)
			if err != nil {
				t.Errorf("reading %s from the clone: %v", p, err)
				continue
			}
			got = string(b)
		}
		if got != want {
			t.Errorf("%s in the clone = %q, want %q", p, got, want)
		}
	}
	fi, err := os.Stat(filepath.Join(dst, "scripts", "run.sh"))
	if err != nil || fi.Mode().Perm()&0o111 == 0 {
		t.Errorf("scripts/run.sh lost its exec bit in the clone: %v %v", fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "README.md")); err != nil || fi.Mode().Perm()&0o111 != 0 {
		t.Errorf("README.md gained an exec bit: %v %v", fi.Mode(), err)
	}
	if out := git(t, dst, "ls-tree", "HEAD", "scripts/run.sh", "link"); !strings.Contains(out, "100755 blob") || !strings.Contains(out, "120000 blob") {
		t.Errorf("modes in the cloned tree:\n%s", out)
	}
	for p := range fx.excluded {
		if _, err := os.Lstat(filepath.Join(dst, filepath.FromSlash(p))); err == nil {
			t.Errorf("excluded %s is in the clone", p)
		}
		if out, err := gitErr(dst, "cat-file", "-e", "HEAD:"+p); err == nil {
			t.Errorf("excluded %s is in the cloned tree %s", p, out)
		}
	}
	if _, err := os.Lstat(filepath.Join(dst, "gone.txt")); err == nil {
		t.Errorf("gone.txt, deleted in the work tree, is in the clone")
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "README.md")); string(b) != "edited, not committed\n" {
		t.Errorf("the uncommitted README edit is missing: %q", b)
	}
}

func slicesContain(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestRefreshSwapsOnlyOnChange(t *testing.T) {
	fx, srv, refresh := serveFixture(t)
	first := srv.Snapshot().Hash
	clone := filepath.Join(t.TempDir(), "clone")
	git(t, "", "clone", "-q", srv.URL(), clone)

	snap, changed, err := srv.Refresh(context.Background())
	if err != nil || changed || snap.Hash != first {
		t.Fatalf("Refresh of an unchanged tree: %v %v %v, want %s unchanged", snap.Hash, changed, err, first)
	}

	writeFile(t, fx.dir, "infra/app.yaml", "kind: Changed\n", 0o644)
	snap, changed, err = srv.Refresh(context.Background())
	if err != nil || !changed || snap.Hash == first {
		t.Fatalf("Refresh after an edit: %v %v %v, want a new hash", snap.Hash, changed, err)
	}
	second := snap.Hash
	if out := git(t, "", "ls-remote", srv.URL(), "refs/heads/main"); !strings.HasPrefix(out, second.String()) {
		t.Errorf("ls-remote after refresh: %s, want %s", out, second)
	}
	// An existing clone fetches the new, unrelated commit.
	git(t, clone, "fetch", "-q", "origin")
	git(t, clone, "reset", "-q", "--hard", "origin/main")
	if b, _ := os.ReadFile(filepath.Join(clone, "infra", "app.yaml")); string(b) != "kind: Changed\n" {
		t.Errorf("fetched app.yaml = %q", b)
	}
	git(t, clone, "fsck", "--full", "--no-dangling")

	// The refresh channel (SIGHUP in the CLI) triggers a re-snapshot.
	writeFile(t, fx.dir, "infra/app.yaml", "kind: ChangedAgain\n", 0o644)
	refresh <- syscall.SIGHUP
	waitServed(t, srv.URL(), func(h plumbing.Hash) bool { return h != second })

	// A snapshot that was just replaced stays fetchable for clients that
	// listed refs before the swap.
	resp := uploadPackRaw(t, srv.URL(), "want "+second.String()+" ofs-delta\n", true)
	if !strings.Contains(resp, "PACK") {
		t.Errorf("fetching the previous snapshot's commit failed: %.200q", resp)
	}
	resp = uploadPackRaw(t, srv.URL(), "want "+strings.Repeat("ab", 20)+"\n", true)
	if !strings.Contains(resp, "ERR upload-pack: not our ref") {
		t.Errorf("fetching an unknown commit: %.200q", resp)
	}
}

func TestIntervalRefresh(t *testing.T) {
	fx := newFixture(t)
	srv, _ := startServer(t, ServerOptions{
		Build:    BuildOptions{Dir: fx.dir, Branch: testRepoBranch, FluxPath: fixtureFluxPath, ServeWholeTree: true},
		Interval: 100 * time.Millisecond,
	})
	first := srv.Snapshot().Hash
	writeFile(t, fx.dir, "infra/interval.yaml", "new: file\n", 0o644)
	waitServed(t, srv.URL(), func(h plumbing.Hash) bool { return h != first })
}

func waitServed(t *testing.T, url string, ok func(plumbing.Hash) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last plumbing.Hash
	for time.Now().Before(deadline) {
		h, err := Probe(context.Background(), url, testRepoBranch, nil)
		if err == nil && ok(h) {
			return
		}
		last = h
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the server at %s still serves %s after 10s", url, last)
}

// uploadPackRaw posts one upload-pack request (want line, flush, then
// "done" if done) and returns the response.
func uploadPackRaw(t *testing.T, repoURL string, want string, done bool) string {
	t.Helper()
	lines := []string{want, ""}
	if done {
		lines = append(lines, "done\n")
	}
	return uploadPackLines(t, repoURL, lines...)
}

// uploadPackLines posts pkt-lines ("" is a flush) to git-upload-pack.
func uploadPackLines(t *testing.T, repoURL string, lines ...string) string {
	t.Helper()
	var b strings.Builder
	for _, l := range lines {
		if l == "" {
			b.WriteString("0000")
			continue
		}
		fmt.Fprintf(&b, "%04x%s", len(l)+4, l)
	}
	resp, err := http.Post(repoURL+"/git-upload-pack", "application/x-git-upload-pack-request", strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload-pack: HTTP %d %s", resp.StatusCode, body)
	}
	return string(body)
}

// TestUploadPackRounds pins the stateless protocol-v0 answers the clients rely on.
func TestUploadPackRounds(t *testing.T) {
	_, srv, _ := serveFixture(t)
	h := srv.Snapshot().Hash.String()
	unknown := strings.Repeat("cd", 20)
	for _, tc := range []struct {
		name  string
		lines []string
		want  func(string) bool
	}{
		{"deepen without done: only the (empty) shallow list",
			[]string{"want " + h + " shallow ofs-delta\n", "deepen 1\n", ""},
			func(r string) bool { return r == "0000" }},
		{"deepen with done: shallow list, NAK, pack",
			[]string{"want " + h + " shallow ofs-delta\n", "deepen 1\n", "", "done\n"},
			func(r string) bool { return strings.HasPrefix(r, "00000008NAK\nPACK") }},
		{"full clone: NAK, pack",
			[]string{"want " + h + " ofs-delta\n", "", "done\n"},
			func(r string) bool { return strings.HasPrefix(r, "0008NAK\nPACK") }},
		{"negotiation with a common have: ACK",
			[]string{"want " + h + "\n", "", "have " + h + "\n", ""},
			func(r string) bool { return r == "0031ACK "+h+"\n" }},
		{"negotiation without a common have: NAK",
			[]string{"want " + h + "\n", "", "have " + unknown + "\n", ""},
			func(r string) bool { return r == "0008NAK\n" }},
		{"unknown have with done still gets the pack",
			[]string{"want " + h + "\n", "", "have " + unknown + "\n", "done\n"},
			func(r string) bool { return strings.HasPrefix(r, "0008NAK\nPACK") }},
		{"a shallow client fetching without deepen gets the pack",
			[]string{"want " + h + " shallow\n", "shallow " + unknown + "\n", "", "done\n"},
			func(r string) bool { return strings.HasPrefix(r, "0008NAK\nPACK") }},
		{"unsupported capability",
			[]string{"want " + h + " side-band-64k\n", "", "done\n"},
			func(r string) bool { return strings.Contains(r, "ERR upload-pack: unsupported capability") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := uploadPackLines(t, srv.URL(), tc.lines...); !tc.want(got) {
				t.Errorf("response %.120q", got)
			}
		})
	}

	// Clients gzip large requests.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	fmt.Fprintf(zw, "%04xwant %s\n0000%04xdone\n", len(h)+10, h, 9)
	zw.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL()+"/git-upload-pack", &gz)
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(string(body), "0008NAK\nPACK") {
		t.Errorf("gzipped request: HTTP %d %.80q", resp.StatusCode, body)
	}

	resp, err = http.Post(srv.URL()+"/git-upload-pack", "application/x-git-upload-pack-request", strings.NewReader("garbage"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("malformed request: HTTP %d, want 400", resp.StatusCode)
	}
}

func TestPushIsRefused(t *testing.T) {
	fx, srv, _ := serveFixture(t)
	clone := filepath.Join(t.TempDir(), "clone")
	git(t, "", "clone", "-q", srv.URL(), clone)
	writeFile(t, clone, "pushed.txt", "x\n", 0o644)
	git(t, clone, "add", "pushed.txt")
	git(t, clone, "commit", "-q", "-m", "try to push")
	out, err := gitErr(clone, "push", "origin", "HEAD:refs/heads/main")
	if err == nil {
		t.Fatalf("git push succeeded:\n%s", out)
	}
	if !strings.Contains(out, "403") {
		t.Errorf("git push output does not show HTTP 403:\n%s", out)
	}
	if got := git(t, fx.dir, "ls-remote", srv.URL(), "refs/heads/main"); !strings.HasPrefix(got, srv.Snapshot().Hash.String()) {
		t.Errorf("the served branch moved after a refused push: %s", got)
	}

	for _, r := range []struct{ method, path string }{
		{http.MethodGet, "/info/refs?service=git-receive-pack"},
		{http.MethodPost, "/git-receive-pack"},
	} {
		req, _ := http.NewRequest(r.method, srv.URL()+r.path, strings.NewReader("0000"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "read-only") {
			t.Errorf("%s %s: %d %q, want 403 read-only", r.method, r.path, resp.StatusCode, body)
		}
	}
}

func TestNothingOutsideTheSnapshotIsReachable(t *testing.T) {
	fx, srv, _ := serveFixture(t)
	u, _ := url.Parse(srv.URL())

	// Paths are sent raw over TCP so no client cleans them first.
	for _, tc := range []struct {
		path string
		want int
	}{
		{"/", 404},
		{"/homelab.git", 404},
		{"/homelab.git/HEAD", 404},
		{"/homelab.git/config", 404},
		{"/homelab.git/objects/info/packs", 404},
		{"/homelab.git/info/refs", 403}, // dumb protocol
		{"/other.git/info/refs?service=git-upload-pack", 404},
		{"/homelab.git/../other.git/info/refs?service=git-upload-pack", 404},
		{"/homelab.git/../../../etc/passwd", 404},
		{"/homelab.git/%2e%2e/%2e%2e/etc/passwd", 404},
		{"/../homelab.git/info/refs?service=git-upload-pack", 404},
		{"//homelab.git/info/refs?service=git-upload-pack", 404},
		{"/homelab.git/.git/info/refs?service=git-upload-pack", 404},
		{"/homelab.git/README.md", 404},
		{"/homelab.git/info/refs?service=git-upload-pack", 200},
	} {
		if got := rawGet(t, u.Host, tc.path); got != tc.want {
			t.Errorf("GET %s: %d, want %d", tc.path, got, tc.want)
		}
	}

	// Other repositories on the host, including the work tree's own, are not served.
	base := "http://" + u.Host
	for _, other := range []string{base + "/", base + "/other.git", base + fx.dir, base + "/homelab.git/../" + filepath.Base(fx.dir)} {
		if out, err := gitErr("", "ls-remote", other); err == nil {
			t.Errorf("git ls-remote %s succeeded:\n%s", other, out)
		}
	}
}

// rawGet sends a GET with the path exactly as given and returns the status.
func rawGet(t *testing.T, host, path string) int {
	t.Helper()
	conn, err := net.DialTimeout("tcp", host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, host)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestConcurrentClonesDuringRefresh(t *testing.T) {
	fx, srv, _ := serveFixture(t)
	served := sync.Map{}
	served.Store(srv.Snapshot().Hash.String(), true)

	ctx, cancel := context.WithCancel(context.Background())
	refresher := make(chan struct{})
	go func() {
		defer close(refresher)
		for i := 0; ctx.Err() == nil; i++ {
			writeFile(t, fx.dir, "infra/counter.yaml", fmt.Sprintf("n: %d\n", i), 0o644)
			snap, _, err := srv.Refresh(ctx)
			if err != nil && ctx.Err() == nil {
				t.Errorf("Refresh: %v", err)
				return
			}
			served.Store(snap.Hash.String(), true)
			// Faster than any real refresh, slow enough that a clone spans
			// fewer swaps than the server keeps fetchable.
			time.Sleep(50 * time.Millisecond)
		}
	}()

	var (
		wg    sync.WaitGroup
		heads sync.Map
	)
	count := func() int {
		n := 0
		served.Range(func(any, any) bool { n++; return true })
		return n
	}
	// Rounds of clones until the refresher swapped snapshots under them at
	// least twice: on a loaded machine one round can finish between swaps.
	for round := 0; round < 5 && (round == 0 || count() < 3); round++ {
		for i := round * 6; i < round*6+6; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				dst := filepath.Join(t.TempDir(), fmt.Sprintf("clone%d", i))
				args := []string{"clone", "-q", srv.URL(), dst}
				if i%2 == 0 {
					args = []string{"clone", "-q", "--depth", "1", srv.URL(), dst}
				}
				if out, err := gitErr("", args...); err != nil {
					t.Errorf("concurrent clone %d: %v\n%s", i, err, out)
					return
				}
				if out, err := gitErr(dst, "fsck", "--full", "--strict", "--no-dangling"); err != nil {
					t.Errorf("fsck of concurrent clone %d: %v\n%s", i, err, out)
				}
				head, err := gitErr(dst, "rev-parse", "HEAD")
				if err != nil {
					t.Errorf("clone %d: rev-parse HEAD: %v %s", i, err, head)
				}
				heads.Store(i, strings.TrimSpace(head))
			}(i)
		}
		wg.Wait()
	}
	cancel()
	<-refresher
	if n := count(); n < 3 {
		t.Errorf("only %d snapshots were served during five rounds of clones; the test did not exercise swaps", n)
	}
	heads.Range(func(i, head any) bool {
		if _, ok := served.Load(head); !ok {
			t.Errorf("clone %d got HEAD %s, which was never served", i, head)
		}
		return true
	})
}

// withAuth puts a credential into a clone URL, as a user would for the git CLI.
func withAuth(raw string, a BasicAuth) string {
	u, err := url.Parse(raw)
	if err != nil {
		panic(err)
	}
	u.User = url.UserPassword(a.Username, a.Password)
	return u.String()
}

// TestAuthRequired: with a credential set, the real git CLI cannot list or
// clone anonymously or with a wrong password (401), and clones with the
// right one; the credential file is created once, 0600, and kept.
func TestAuthRequired(t *testing.T) {
	stateDir := t.TempDir()
	auth, path, err := EnsureAuth(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 || len(auth.Password) < 40 {
		t.Fatalf("credential file: %v %v, password of %d characters", fi, err, len(auth.Password))
	}
	again, _, err := EnsureAuth(stateDir)
	if err != nil || again != auth {
		t.Fatalf("a second EnsureAuth rewrote the credential: %v", err)
	}
	fx := newFixture(t)
	srv, _ := startServer(t, ServerOptions{Build: BuildOptions{Dir: fx.dir, Branch: testRepoBranch, Excludes: fx.excludes, Protect: fx.protect, FluxPath: fixtureFluxPath, ServeWholeTree: true}, Auth: &auth})

	env := append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "GIT_ASKPASS=/bin/false", "SSH_ASKPASS=/bin/false")
	gitFails := func(what, u string) {
		t.Helper()
		cmd := exec.Command("git", "ls-remote", u)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "Authentication failed") && !strings.Contains(string(out), "could not read Username") {
			t.Errorf("git ls-remote %s: %v\n%s", what, err, out)
		}
	}
	gitFails("anonymously", srv.URL())
	gitFails("with a wrong password", withAuth(srv.URL(), BasicAuth{Username: auth.Username, Password: "not-the-password-at-all"}))
	resp, err := http.Get(srv.URL() + "/info/refs?service=git-upload-pack")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" || bytes.Contains(body, []byte(testRepoBranch)) {
		t.Fatalf("anonymous refs: %s %q %q", resp.Status, resp.Header.Get("WWW-Authenticate"), body)
	}
	if _, err := Probe(context.Background(), srv.URL(), testRepoBranch, nil); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("anonymous probe: %v", err)
	}
	if h, err := Probe(context.Background(), srv.URL(), testRepoBranch, &auth); err != nil || h != srv.Snapshot().Hash {
		t.Errorf("probe with the credential: %s %v", h, err)
	}
	dst := filepath.Join(t.TempDir(), "clone")
	git(t, "", "clone", "-q", withAuth(srv.URL(), auth), dst)
	checkClone(t, fx, dst)

	// A credential file others can read is refused.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadAuth(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable credential: %v", err)
	}
}

// TestTLS: with a certificate the server speaks only HTTPS; the git CLI
// clones when it trusts the certificate (and presents the credential),
// refuses otherwise, and the detached server's probe trusts it.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := testcert.SelfSigned(t, dir)
	auth, _, err := EnsureAuth(dir)
	if err != nil {
		t.Fatal(err)
	}
	fx := newFixture(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "https://" + ln.Addr().String() + "/homelab.git"
	srv, err := NewServer(context.Background(), ServerOptions{Build: BuildOptions{Dir: fx.dir, Branch: testRepoBranch, Excludes: fx.excludes, Protect: fx.protect, FluxPath: fixtureFluxPath, ServeWholeTree: true},
		URL: u, Auth: &auth, TLSCert: certFile, TLSKey: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, nil) }()
	t.Cleanup(func() { cancel(); <-done })

	env := append(os.Environ(), "GIT_TERMINAL_PROMPT=0")
	clone := func(extra ...string) (string, error) {
		cmd := exec.Command("git", "clone", "-q", withAuth(u, auth), filepath.Join(t.TempDir(), "clone"))
		cmd.Env = append(env, extra...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := clone(); err == nil || !strings.Contains(out, "certificate") {
		t.Errorf("clone without trusting the certificate: %v %s", err, out)
	}
	if out, err := clone("GIT_SSL_CAINFO=" + certFile); err != nil {
		t.Fatalf("clone trusting the certificate: %v %s", err, out)
	}
	if resp, err := http.Get(strings.Replace(u, "https://", "http://", 1) + "/info/refs?service=git-upload-pack"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if bytes.Contains(body, []byte(testRepoBranch)) {
			t.Errorf("plain HTTP was answered with refs: %s", body)
		}
	}
	st := &State{URL: u, Branch: testRepoBranch, TLSCert: certFile, AuthFile: filepath.Join(dir, AuthFileName)}
	if h, _, err := probe(context.Background(), st.client(), st.URL, st.Branch, st.auth()); err != nil || h != srv.Snapshot().Hash {
		t.Errorf("probe of a TLS server: %s %v", h, err)
	}
}

// TestServeIsSecureByDefault: `gitsnap serve` without --auth-file uses the
// credential in --state-dir (creating it), refuses to start with neither,
// and serves anonymously only with --anonymous.
func TestServeIsSecureByDefault(t *testing.T) {
	fx := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	flags := func(mod func(*ServeFlags)) ServeFlags {
		addr := freeAddr(t)
		f := ServeFlags{Repo: fx.dir, Listen: addr, URL: "http://" + addr + "/homelab.git", Branch: testRepoBranch, Exclude: fx.excludes, Protect: fx.protect, Path: fixtureFluxPath}
		mod(&f)
		return f
	}
	log := zerolog.New(zerolog.NewTestWriter(t))
	if err := Serve(ctx, flags(func(*ServeFlags) {}), log, nil); err == nil || !strings.Contains(err.Error(), "--anonymous") {
		t.Errorf("serve without a credential: %v, want a refusal naming the choices", err)
	}
	if err := Serve(ctx, flags(func(f *ServeFlags) { f.Anonymous, f.AuthFile = true, "/x" }), log, nil); err == nil {
		t.Error("serve with --anonymous and --auth-file started")
	}

	stateDir := filepath.Join(t.TempDir(), "state")
	secured := flags(func(f *ServeFlags) { f.StateDir = stateDir })
	anon := flags(func(f *ServeFlags) { f.Anonymous = true })
	for _, f := range []ServeFlags{secured, anon} {
		go func() {
			if err := Serve(ctx, f, log, nil); err != nil && ctx.Err() == nil {
				t.Errorf("Serve: %v", err)
			}
		}()
	}
	statusOf := func(url string) int {
		resp, err := http.Get(url + "/info/refs?service=git-upload-pack")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	waitFor(t, "both servers to answer", func() bool { return statusOf(secured.URL) != 0 && statusOf(anon.URL) != 0 })
	if got := statusOf(secured.URL); got != http.StatusUnauthorized {
		t.Errorf("anonymous request to the default server: %d, want 401", got)
	}
	auth, err := ReadAuth(filepath.Join(stateDir, AuthFileName))
	if err != nil {
		t.Fatalf("the default server did not create the state directory's credential: %v", err)
	}
	if _, err := Probe(ctx, secured.URL, testRepoBranch, &auth); err != nil {
		t.Errorf("probe with the state directory's credential: %v", err)
	}
	if got := statusOf(anon.URL); got != http.StatusOK {
		t.Errorf("--anonymous server: %d, want 200", got)
	}
}
