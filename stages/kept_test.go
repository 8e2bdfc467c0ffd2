package stages

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"filippo.io/age"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/internal/sealed"
	"github.com/homelab/bootstrap/talos"
)

// TestSealKeptFiles: a cluster directory written before
// secrets.age.recipients was set (or by an older bootstrap) holds its
// configs, talosconfig and kubeconfig in plaintext; `secrets encrypt`
// (SealKeptFiles) leaves each only as <name>.age, which opens to the same
// bytes, and a second pass writes nothing.
func TestSealKeptFiles(t *testing.T) {
	dir := t.TempDir()
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "key.txt")
	if err := os.WriteFile(key, []byte(id.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	yaml := "cluster: {name: lab}\nsecrets:\n  age:\n    recipients: [" + id.Recipient().String() + "]\n    keyFile: key.txt\n"
	cfg, err := config.Parse(filepath.Join(dir, "bootstrap.yaml"), []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Paths()
	plain := map[string][]byte{}
	for _, f := range []string{"controlplane.yaml", "worker.yaml", "nodes/cp-1.yaml", "talosconfig", "kubeconfig"} {
		path := filepath.Join(p.TalosDir, f)
		plain[path] = []byte("key: " + f + "\n")
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, plain[path], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	wrote, err := SealKeptFiles(cfg)
	if err != nil || len(wrote) != len(plain) {
		t.Fatalf("sealed %v, %v", wrote, err)
	}
	files := KeptFiles(cfg)
	for path, want := range plain {
		if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is still plaintext", path)
		}
		if got, err := files.Read(path); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s%s opens to %q (%v)", path, sealed.Suffix, got, err)
		}
	}
	if again, err := SealKeptFiles(cfg); err != nil || len(again) != 0 {
		t.Fatalf("second pass wrote %v, %v", again, err)
	}
}

// TestTalosPlanShowsSealedConfigDiffs: the plan of a node still in
// maintenance shows its rendered config's diff whether the file is kept
// sealed (<name>.yaml.age) or not.
func TestTalosPlanShowsSealedConfigDiffs(t *testing.T) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		t.Fatal(err)
	}
	for _, files := range []*sealed.Files{nil, {Recipients: []age.Recipient{id.Recipient()}}} {
		dir := t.TempDir()
		res := &talos.Result{Rendered: &talos.Rendered{Nodes: []talos.RenderedNode{{Name: "cp-1", IP: "10.0.20.11"}}}, Dir: dir, Files: files,
			Changes: []talos.FileChange{{Path: files.Path(talos.NodeConfigPath(dir, "cp-1")), Diff: "-  hostname: old\n+  hostname: new\n"}}}
		conv := &talos.ConvergeResult{Nodes: map[string]talos.EnsureResult{"cp-1": {Found: talos.ModeMaintenance}}}
		var out bytes.Buffer
		env := prepEnv(t)
		env.Out = &out
		printTalosPlan(env, res, conv)
		if !strings.Contains(out.String(), "its rendered config changes") || !strings.Contains(out.String(), "hostname: new") {
			t.Errorf("sealing %v: plan\n%s", files.Sealing(), out.String())
		}
	}
}
