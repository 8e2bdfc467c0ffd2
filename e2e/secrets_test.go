package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/gitsnap"
	"github.com/homelab/bootstrap/internal/targz"
	"github.com/homelab/bootstrap/sops"
)

// TestSecretsStaySecret runs the whole pipeline on a lab, then puts a copy
// of the cluster's Talos machine config and a plaintext Secret manifest
// into the work tree Flux is served from, re-runs the flux stage and the
// postcheck, and looks for every secret the run handled (the Proxmox token
// secret, the snapshot credential, every key, secret and token of the
// Talos secrets bundle, the admin kubeconfig's client key) in every file
// under ai/state/ (inside every archive too), in everything each command
// printed, and in a clone of the served snapshot: zero hits. The etcd
// snapshots hold every Secret by nature: they must be 0600 in a 0700
// directory instead. The flux stage, the snapshot server's log and
// bootstrap status must name the two files left out, with their rules; a
// plaintext Secret the build reads refuses the flux stage (exit 2) and a
// re-snapshot of the running server, which keeps serving what it served.
func TestSecretsStaySecret(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1})
	var printed []*e2e.Result
	mustRun := func(args ...string) {
		t.Helper()
		r := run(t, ctx, h, args...)
		printed = append(printed, r)
		if r.ExitCode != 0 {
			t.Fatalf("bootstrap %v: exit %d\n%s", args, r.ExitCode, r.Tail(30))
		}
	}
	// A marker secret in every credential file the config can name that
	// the lab's run does not use otherwise: validate reads each, and none
	// may reach any output.
	credDir := filepath.Join(filepath.Dir(filepath.Dir(h.ConfigPath())), "creds")
	if err := os.MkdirAll(credDir, 0o700); err != nil {
		t.Fatal(err)
	}
	ageIdentity, _, err := sops.GenerateIdentity()
	if err != nil {
		t.Fatal(err)
	}
	const fluxToken = "marker-flux-token-0x5eed"
	writeSecretFile(t, filepath.Join(credDir, "flux-token"), fluxToken+"\n")
	writeSecretFile(t, filepath.Join(credDir, "age.agekey"), "# created: 2026-11-28\n"+ageIdentity+"\n")
	if err := h.EditConfig(func(s string) (string, error) {
		s = strings.Replace(s, "\nflux:\n", "\nflux:\n  auth:\n    tokenFile: "+filepath.Join(credDir, "flux-token")+"\n", 1)
		// The whole tree, so that the guard judges and names every file
		// planted below (served need-to-know, those no build reads are
		// never served nor named: TestNeedToKnowIsProvenByKustomize).
		if !strings.Contains(s, "\n  localSnapshot:\n") {
			return "", fmt.Errorf("no flux.localSnapshot in the lab's config")
		}
		s = strings.Replace(s, "\n  localSnapshot:\n", "\n  localSnapshot:\n    serve: tree\n", 1)
		return s + "secrets:\n  age:\n    keyFile: " + filepath.Join(credDir, "age.agekey") + "\n", nil
	}); err != nil {
		t.Fatal(err)
	}
	mustRun("config", "validate")
	// A dry run of a cluster that does not exist yet plans every stage and
	// fails the postcheck's reads: what it prints counts all the same.
	printed = append(printed, run(t, ctx, h, "run", "--stage", "all", "--dry-run"))
	mustRun("run", "--stage", "all")

	paths := h.Paths()
	tree := h.Config().Flux.LocalSnapshot.Source
	cp, err := os.ReadFile(filepath.Join(paths.TalosDir, "controlplane.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(tree, "rendered_configs", "controlplane.yaml"), cp)
	writeFile(t, filepath.Join(tree, "apps", "db-secret.yaml"), []byte("apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\n  namespace: homelab\nstringData:\n  password: plaintext-db-password-0x5eed\n"))
	// Excluded files do not change the snapshot's hash, so the running
	// server keeps serving: the flux stage's own build names them.
	mustRun("run", "--stage", "flux")
	withheld := []string{"rendered_configs/controlplane.yaml (" + gitsnap.RuleTalosMachineConfig + ")", "apps/db-secret.yaml (" + gitsnap.RuleUnencryptedSecret + ")"}
	for _, w := range withheld {
		if last := printed[len(printed)-1]; !strings.Contains(last.Stderr, "withholds "+w) {
			t.Errorf("the flux stage does not name %q:\n%s", w, last.Tail(10))
		}
	}

	// A plaintext Secret the build reads (listed in ./infra's
	// kustomization) refuses the stage, naming the file and what to do, and
	// a running server asked to re-snapshot keeps what it served.
	ks := filepath.Join(tree, "infra", "kustomization.yaml")
	ksBefore, err := os.ReadFile(ks)
	if err != nil {
		t.Fatal(err)
	}
	served := snapshotStatus(t, ctx, h)
	writeFile(t, filepath.Join(tree, "infra", "db.yaml"), []byte("apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\n  namespace: homelab\nstringData:\n  password: needed-db-password-0x5eed\n"))
	writeFile(t, ks, append(ksBefore, []byte("  - db.yaml\n")...))
	r := run(t, ctx, h, "run", "--stage", "flux")
	printed = append(printed, r)
	if r.ExitCode != 2 || !strings.Contains(r.Stderr, "infra/db.yaml (unencrypted Secret; listed in infra/kustomization.yaml)") || !strings.Contains(r.Stderr, "sops encrypt") {
		t.Errorf("run --stage flux with a needed plaintext Secret: exit %d, want 2 naming infra/db.yaml and what to do:\n%s", r.ExitCode, r.Tail(15))
	}
	st, err := gitsnap.ReadState(paths.StateDir)
	if err != nil || st == nil {
		t.Fatalf("the snapshot server's state: %v %v", st, err)
	}
	if err := syscall.Kill(st.PID, syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(paths.StateDir, "gitsnap.log")
	waitUntil(t, 20*time.Second, "the snapshot server to refuse the re-snapshot", func() bool {
		b, _ := os.ReadFile(logPath)
		return bytes.Contains(b, []byte("re-snapshot failed")) && bytes.Contains(b, []byte("infra/db.yaml"))
	})
	if now := snapshotStatus(t, ctx, h); now != served {
		t.Errorf("after a refused re-snapshot the server serves %s, want the previous %s", now, served)
	}
	if err := os.Remove(filepath.Join(tree, "infra", "db.yaml")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, ks, ksBefore)

	mustRun("gitsnap", "stop")
	mustRun("run", "--stage", "flux")
	mustRun("run", "--stage", "postcheck")
	mustRun("status")
	for _, w := range withheld {
		if last := printed[len(printed)-1]; !strings.Contains(last.Stdout, "withheld "+w) {
			t.Errorf("bootstrap status does not name %q:\n%s", w, last.Stdout)
		}
	}

	needles := map[string]string{"plaintext Secret value": "plaintext-db-password-0x5eed", "needed plaintext Secret value": "needed-db-password-0x5eed",
		"flux token in flux.auth.tokenFile": fluxToken, "age identity in secrets.age.keyFile": ageIdentity}
	_, pveSecret := h.Lab.PVE.Token()
	needles["Proxmox token secret"] = pveSecret
	auth, err := gitsnap.ReadAuth(filepath.Join(paths.StateDir, gitsnap.AuthFileName))
	if err != nil {
		t.Fatal(err)
	}
	needles["snapshot password"] = auth.Password
	bundle, err := os.ReadFile(paths.Secrets)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range secretLeaves(t, bundle) {
		needles["secrets bundle "+k] = v
	}
	kc, err := os.ReadFile(paths.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range secretLeaves(t, kc) {
		needles["kubeconfig "+k] = v
	}
	if len(needles) < 8 {
		t.Fatalf("only %d secrets to look for: %v", len(needles), keys(needles))
	}

	hay := map[string][]byte{}
	for i, r := range printed {
		hay[strings.Join(r.Args, " ")+" stdout #"+string(rune('0'+i))] = []byte(r.Stdout)
		hay[strings.Join(r.Args, " ")+" stderr #"+string(rune('0'+i))] = []byte(r.Stderr)
	}
	etcdDir := filepath.Join(paths.StateDir, "etcd")
	snapshots := 0
	err = filepath.WalkDir(paths.StateDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == gitsnap.AuthFileName {
			// The credential file is the one place the password lives.
			return err
		}
		if filepath.Dir(p) == etcdDir {
			// An etcd snapshot holds every Secret of the cluster by
			// nature: what matters is that only its owner can read it.
			snapshots++
			if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("etcd snapshot %s: mode %v %v, want 0600", p, fi.Mode(), err)
			}
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		hay[p] = b
		if strings.HasSuffix(p, ".tar.gz") {
			members, err := targz.Unpack(b)
			if err != nil {
				return err
			}
			for name, content := range members {
				hay[p+"!"+name] = content
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(etcdDir); err != nil || fi.Mode().Perm() != 0o700 || snapshots == 0 {
		t.Errorf("etcd snapshot directory: %v %v with %d snapshots, want 0700 and the postcheck's snapshots", fi, err, snapshots)
	}
	clone := filepath.Join(t.TempDir(), "clone")
	u, _ := url.Parse(h.Config().Flux.LocalSnapshot.URL)
	u.User = url.UserPassword(auth.Username, auth.Password)
	if out, err := exec.Command("git", "clone", "-q", u.String(), clone).CombinedOutput(); err != nil {
		t.Fatalf("cloning the snapshot: %v %s", err, out)
	}
	var cloned []string
	filepath.WalkDir(clone, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.Contains(p, "/.git/") {
			return err
		}
		rel, _ := filepath.Rel(clone, p)
		cloned = append(cloned, rel)
		b, err := os.ReadFile(p)
		hay["snapshot:"+rel] = b
		return err
	})
	if len(cloned) < 3 {
		t.Fatalf("the snapshot clone holds only %v", cloned)
	}
	for _, f := range []string{"rendered_configs/controlplane.yaml", "apps/db-secret.yaml", "infra/db.yaml"} {
		if _, ok := hay["snapshot:"+f]; ok {
			t.Errorf("the snapshot serves %s", f)
		}
	}

	for what, needle := range needles {
		for where, b := range hay {
			if bytes.Contains(b, []byte(needle)) {
				t.Errorf("the %s is in %s", what, where)
			}
		}
	}
	log, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range withheld {
		if !bytes.Contains(log, []byte(w)) {
			t.Errorf("the snapshot server's log does not name %q:\n%s", w, lastN(string(log), 10))
		}
	}
	t.Logf("looked for %d secrets in %d files, outputs and archive members (%d files in the snapshot)", len(needles), len(hay), len(cloned))
}

// snapshotStatus is the snapshot hash `bootstrap gitsnap status` says the
// server answers with.
func snapshotStatus(t *testing.T, ctx context.Context, h *e2e.Harness) string {
	t.Helper()
	r := run(t, ctx, h, "gitsnap", "status")
	for _, line := range strings.Split(r.Stdout, "\n") {
		if rest, ok := strings.CutPrefix(line, "serving "); ok {
			return strings.Fields(rest)[0]
		}
	}
	t.Fatalf("gitsnap status names no served snapshot:\n%s", r.Stdout)
	return ""
}

// secretLeaves returns the string values under keys that name secrets
// (key, secret, token, password, client-key-data...) in a YAML document.
func secretLeaves(t *testing.T, data []byte) map[string]string {
	t.Helper()
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, c := range x {
				walk(path+"."+k, c)
			}
		case []any:
			for _, c := range x {
				walk(path+"[]", c)
			}
		case string:
			last := strings.ToLower(path[strings.LastIndex(path, ".")+1:])
			if len(x) >= 16 && (strings.Contains(last, "key") || strings.Contains(last, "secret") || strings.Contains(last, "token") || strings.Contains(last, "password")) {
				out[path] = x
			}
		}
	}
	walk("", doc)
	return out
}

func writeFile(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func lastN(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitUntil polls cond every 100 ms until it holds, failing the test after
// timeout with what it waited for.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
