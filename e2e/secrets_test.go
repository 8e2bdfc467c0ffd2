package e2e_test

import (
	"bytes"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/gitsnap"
	"github.com/homelab/bootstrap/internal/targz"
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
// directory instead. The snapshot server's log must count the two files
// it left out by rule.
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
	// server keeps serving: the flux stage's own build counts them, and a
	// server started afresh logs them.
	mustRun("run", "--stage", "flux")
	for _, rule := range []string{gitsnap.RuleTalosMachineConfig, gitsnap.RuleUnencryptedSecret} {
		if last := printed[len(printed)-1]; !strings.Contains(last.Stderr, rule+": 1") {
			t.Errorf("the flux stage's log does not count %q:\n%s", rule, last.Tail(10))
		}
	}
	mustRun("gitsnap", "stop")
	mustRun("run", "--stage", "flux")
	mustRun("run", "--stage", "postcheck")
	mustRun("status")

	needles := map[string]string{"plaintext Secret value": "plaintext-db-password-0x5eed"}
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
	for _, f := range []string{"rendered_configs/controlplane.yaml", "apps/db-secret.yaml"} {
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
	log, err := os.ReadFile(filepath.Join(paths.StateDir, "gitsnap.log"))
	if err != nil {
		t.Fatal(err)
	}
	for _, rule := range []string{gitsnap.RuleTalosMachineConfig, gitsnap.RuleUnencryptedSecret} {
		if !bytes.Contains(log, []byte(rule+": 1")) {
			t.Errorf("the snapshot server's log does not count %q:\n%s", rule, lastN(string(log), 10))
		}
	}
	t.Logf("looked for %d secrets in %d files, outputs and archive members (%d files in the snapshot)", len(needles), len(hay), len(cloned))
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
