package e2e_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/e2e"
)

// corpusDir is the bad-config corpus of the config package.
const corpusDir = "../config/testdata"

// TestBadConfigCorpus runs `bootstrap run --stage all` on every config of
// the bad-config corpus. The corpus points at pve.lan, which nothing here
// answers, so "no call reached Proxmox" would hold whatever the binary did.
// Each case's proxmox section (url host, node, tokenID, tlsFingerprint) is
// therefore pointed at a running lab's pvesim, with the token secret in
// PROXMOX_TOKEN_SECRET, except for the keys that are the case's own
// mistake (those its golden file names): values are replaced in place, so
// every line and column of the golden stays valid. Each case must exit 2,
// print exactly its golden (with the same substitutions) and make no call
// at all to the simulators. A control run of the corpus's good config,
// rewritten the same way, must reach pvesim: the redirection works.
func TestBadConfigCorpus(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 3*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1})
	pve := h.Lab.PVE
	id, secret := pve.Token()
	base := strings.TrimSuffix(pve.APIURL(), "/api2/json")
	sub := func(golden string) string { return strings.ReplaceAll(golden, "https://pve.lan:8006", base) }

	work := t.TempDir()
	for _, d := range []string{"bad", "good"} {
		if err := os.CopyFS(filepath.Join(work, "testdata", d), os.DirFS(filepath.Join(corpusDir, d))); err != nil {
			t.Fatal(err)
		}
	}
	// Credential files 0600 as a user's are (the copy, like a git
	// checkout, has 0644), except the one the world-readable case is about.
	files := filepath.Join(work, "testdata", "bad", "files")
	entries, _ := os.ReadDir(files)
	for _, e := range entries {
		if e.Type().IsRegular() && !strings.Contains(e.Name(), "world-readable") {
			if err := os.Chmod(filepath.Join(files, e.Name()), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases, _ := filepath.Glob(filepath.Join(work, "testdata", "bad", "*.yaml"))
	if len(cases) < 60 {
		t.Fatalf("the corpus has %d cases", len(cases))
	}
	// No age identity from this machine's own ~/.config/sops, and no S3
	// credentials from its ~/.aws: the goldens are the config package's,
	// which loads without an environment.
	env := append(cleanEnv(), "PROXMOX_TOKEN_SECRET="+secret, "XDG_CONFIG_HOME="+t.TempDir())
	binary := h.Binary()
	before := pve.Counts()

	redirect := func(t *testing.T, path string, golden []byte) {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		inProxmox := false
		for i, l := range lines {
			if len(l) > 0 && l[0] != ' ' && l[0] != '#' {
				inProxmox = strings.HasPrefix(l, "proxmox:")
				continue
			}
			if !inProxmox {
				continue
			}
			key, _, ok := strings.Cut(strings.TrimSpace(l), ":")
			if !ok || bytes.Contains(golden, []byte("proxmox."+key)) && key != "url" {
				continue // the case's own mistake stays
			}
			indent := l[:len(l)-len(strings.TrimLeft(l, " "))]
			switch key {
			case "url":
				lines[i] = sub(l)
			case "node":
				lines[i] = indent + "node: " + pve.NodeName()
			case "tokenID":
				lines[i] = indent + "tokenID: " + id
			case "tlsFingerprint":
				lines[i] = indent + "tlsFingerprint: " + pve.Fingerprint()
			}
		}
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	seededSecret := regexp.MustCompile(`marker-[a-z0-9]+-0x5eed|Marker0x5eed`)
	fieldPath := regexp.MustCompile(`:\d+(?::\d+)?: ([A-Za-z0-9_.\[\]-]+):`)

	for _, path := range cases {
		name := strings.TrimSuffix(filepath.Base(path), ".yaml")
		t.Run(name, func(t *testing.T) {
			golden, err := os.ReadFile(strings.TrimSuffix(path, ".yaml") + ".golden")
			if err != nil {
				t.Fatal(err)
			}
			redirect(t, path, golden)
			rel, _ := filepath.Rel(work, path)
			cmd := exec.CommandContext(ctx, binary, "run", "--stage", "all", "--config", rel)
			cmd.Dir, cmd.Env = work, env
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			_ = cmd.Run()
			if code := cmd.ProcessState.ExitCode(); code != 2 {
				t.Errorf("exit %d, want 2\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
			}
			want := "bootstrap: " + sub(string(golden))
			if got := stderr.String(); got != want {
				t.Errorf("stderr:\n%s\nwant:\n%s", got, want)
			}
			paths := fieldPath.FindAllStringSubmatch(string(golden), -1)
			if len(paths) == 0 && !strings.Contains(string(golden), "empty") && !strings.Contains(string(golden), "tab character") {
				t.Errorf("golden names no field path:\n%s", golden)
			}
			for _, p := range paths {
				if !strings.Contains(stderr.String(), p[1]+":") {
					t.Errorf("field path %s not reported", p[1])
				}
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout not empty:\n%s", stdout.String())
			}
			// A secret typed where none belongs (the corpus writes it
			// marker-<where>-0x5eed) is never printed back.
			if m := seededSecret.FindString(stdout.String() + stderr.String()); m != "" {
				t.Errorf("the output holds the seeded secret %q", m)
			}
		})
	}
	if after := pve.Counts(); !equalCounts(before, after) {
		t.Errorf("the bad configs reached Proxmox: %v → %v", before, after)
	}
	if n := len(h.Lab.Talos.Nodes()); n != 0 {
		t.Errorf("%d Talos nodes run", n)
	}
	if _, err := h.Lab.Kube.Cluster(); err == nil {
		t.Errorf("a control plane was bootstrapped")
	}
	if _, err := os.Stat(filepath.Join(work, "ai")); err == nil {
		t.Errorf("a bad config left state behind in %s", filepath.Join(work, "ai"))
	}

	// The control: the good config, redirected the same way, reaches pvesim.
	good := filepath.Join(work, "testdata", "good", "three-plus-two.yaml")
	redirect(t, good, nil)
	cmd := exec.CommandContext(ctx, binary, "run", "--stage", "provision", "--dry-run", "--config", good)
	cmd.Dir, cmd.Env = work, env
	out, _ := cmd.CombinedOutput()
	if total(pve.Counts()) == total(before) {
		t.Fatalf("the redirected good config did not reach pvesim, so the zero above proves nothing:\n%s", out)
	}
	if pve.MutatingCalls() != 0 {
		t.Errorf("a dry run mutated: %v", pve.MutatingCallList())
	}
}

func total(counts map[string]int) int {
	n := 0
	for _, v := range counts {
		n += v
	}
	return n
}

func equalCounts(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// cleanEnv is the environment without anything that overrides the config
// or supplies credentials from this machine (its $HOME: ~/.aws, ~/.kube).
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		for _, p := range []string{"PROXMOX_TOKEN_SECRET=", "TALOS_", "GIT_REPO=", "GIT_BRANCH=", "USE_LOCAL_GIT_SNAPSHOT=", "BOOTSTRAP_CONFIG=", "SOPS_AGE_", "AWS_", "HOME="} {
			if strings.HasPrefix(kv, p) {
				kv = ""
				break
			}
		}
		if kv != "" {
			env = append(env, kv)
		}
	}
	return env
}

// TestUnreachableProxmoxIsOneCause: a dry run whose Proxmox host name does
// not resolve prints one failing row for it and every other Proxmox row as
// skipped because of it, counts the cause once, prints each row once (the
// table, not the log as well) and does not retry a name the resolver says
// does not exist.
func TestUnreachableProxmoxIsOneCause(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1})
	if err := h.EditConfig(func(s string) (string, error) {
		return regexp.MustCompile(`(?m)^(\s*url: )https://127\.0\.0\.1:\d+/api2/json$`).ReplaceAllString(s, "${1}https://pve.invalid:8006/api2/json"), nil
	}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := run(t, ctx, h, "run", "--stage", "precheck", "--dry-run", "--log-format", "console")
	took := time.Since(start)
	if r.ExitCode != 1 {
		t.Fatalf("exit %d, want 1:\n%s", r.ExitCode, r.Tail(40))
	}
	out := r.Stdout + r.Stderr
	var fails, skips int
	for _, line := range strings.Split(r.Stdout, "\n") {
		if !strings.HasPrefix(line, "proxmox: ") {
			continue
		}
		switch f := strings.Fields(line[len("proxmox: "):]); {
		case strings.Contains(line, " FAIL "):
			fails++
			if !strings.HasPrefix(line, "proxmox: API and version") {
				t.Errorf("a failing row besides the cause: %s", line)
			}
		case strings.Contains(line, " SKIP "):
			skips++
			if !strings.Contains(line, "see proxmox: API and version") {
				t.Errorf("a skipped row that does not name its cause: %s", line)
			}
		default:
			t.Errorf("a Proxmox row neither failing nor skipped against a dead host (%v): %s", f, line)
		}
	}
	if fails != 1 || skips < 9 {
		t.Errorf("%d failing and %d skipped Proxmox rows, want 1 and every other:\n%s", fails, skips, r.Stdout)
	}
	if !strings.Contains(r.Stdout, "skipped because of a failure above") {
		t.Errorf("the summary does not count the skipped rows apart:\n%s", r.Stdout)
	}
	if n := strings.Count(out, "see proxmox: API and version"); n != skips {
		t.Errorf("the skipped rows are printed %d times for %d rows: once in the table only", n, skips)
	}
	if took > 20*time.Second {
		t.Errorf("the dry run took %s: a name that does not resolve is not worth retrying", took)
	}
}
