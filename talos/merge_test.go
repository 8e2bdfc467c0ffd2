package talos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"k8s.io/client-go/tools/clientcmd"
)

const userTalosconfig = `context: home
contexts:
  home:
    endpoints: [192.168.1.5]
    ca: aG9tZQ==
    crt: aG9tZQ==
    key: aG9tZQ==
  lab:
    endpoints: [10.0.0.99]
    ca: b2xk
    crt: b2xk
    key: b2xk
`

func TestMergeTalosconfig(t *testing.T) {
	dir := clusterDir(t, "secrets.yaml")
	res, err := Generate(oneCP(dir))
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	path := filepath.Join(home, ".talos", "config")
	os.MkdirAll(filepath.Dir(path), 0o700)
	if err := os.WriteFile(path, []byte(userTalosconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := MergeTalosconfig(path, res.Talosconfig, fixedNow)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Changed || m.Backup == "" {
		t.Fatalf("merge result %+v", m)
	}
	if string(mustRead(t, m.Backup)) != userTalosconfig {
		t.Error("backup does not hold the previous file")
	}
	cfg, err := clientconfig.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Context != "lab" {
		t.Errorf("current context %q, want lab", cfg.Context)
	}
	if cfg.Contexts["home"] == nil || cfg.Contexts["home"].Endpoints[0] != "192.168.1.5" {
		t.Error("unrelated context dropped or changed")
	}
	if len(cfg.Contexts) != 2 {
		t.Errorf("contexts %v: same-name context must be replaced, not renamed", keys(cfg.Contexts))
	}
	if cfg.Contexts["lab"].Endpoints[0] != "10.10.0.11" {
		t.Errorf("lab context not replaced: %v", cfg.Contexts["lab"].Endpoints)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v", fi.Mode().Perm())
	}
	// Merging again changes nothing and makes no new backup.
	m2, err := MergeTalosconfig(path, res.Talosconfig, fixedNow)
	if err != nil {
		t.Fatal(err)
	}
	if m2.Changed || m2.Backup != "" {
		t.Errorf("second merge %+v, want no change", m2)
	}
	// A missing file is created.
	fresh := filepath.Join(home, "new", "config")
	if m3, err := MergeTalosconfig(fresh, res.Talosconfig, fixedNow); err != nil || !m3.Changed || m3.Backup != "" {
		t.Errorf("merge into a new file: %+v, %v", m3, err)
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

const userKubeconfig = `apiVersion: v1
kind: Config
current-context: home
clusters:
- name: home
  cluster: {server: "https://192.168.1.5:6443"}
- name: lab
  cluster: {server: "https://10.0.0.99:6443"}
users:
- name: home-admin
  user: {token: abc}
- name: admin@lab
  user: {token: old}
contexts:
- name: home
  context: {cluster: home, user: home-admin}
- name: admin@lab
  context: {cluster: lab, user: admin@lab}
`

const labKubeconfig = `apiVersion: v1
kind: Config
current-context: admin@lab
clusters:
- name: lab
  cluster: {server: "https://10.10.0.10:6443", certificate-authority-data: Y2E=}
users:
- name: admin@lab
  user: {client-certificate-data: Y3J0, client-key-data: a2V5}
contexts:
- name: admin@lab
  context: {cluster: lab, namespace: default, user: admin@lab}
`

func TestMergeKubeconfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".kube", "config")
	os.MkdirAll(filepath.Dir(path), 0o700)
	if err := os.WriteFile(path, []byte(userKubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := MergeKubeconfig(path, []byte(labKubeconfig), fixedNow)
	if err != nil {
		t.Fatal(err)
	}
	if !m.Changed || m.Backup == "" || string(mustRead(t, m.Backup)) != userKubeconfig {
		t.Fatalf("merge %+v: want a change and a backup of the old file", m)
	}
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.CurrentContext != "admin@lab" {
		t.Errorf("current context %q", cfg.CurrentContext)
	}
	if cfg.Clusters["home"] == nil || cfg.AuthInfos["home-admin"] == nil || cfg.Contexts["home"] == nil {
		t.Error("unrelated entries dropped")
	}
	if cfg.Clusters["lab"].Server != "https://10.10.0.10:6443" || cfg.AuthInfos["admin@lab"].Token != "" {
		t.Errorf("same-name entries not replaced: %s, token %q", cfg.Clusters["lab"].Server, cfg.AuthInfos["admin@lab"].Token)
	}
	if len(cfg.Contexts) != 2 {
		t.Errorf("contexts %v", keys(cfg.Contexts))
	}
	m2, err := MergeKubeconfig(path, []byte(labKubeconfig), fixedNow)
	if err != nil || m2.Changed {
		t.Errorf("second merge %+v %v, want no change", m2, err)
	}
	// A broken user file is left alone.
	if err := os.WriteFile(path, []byte("clusters: [broken"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := MergeKubeconfig(path, []byte(labKubeconfig), fixedNow); err == nil || !strings.Contains(err.Error(), "nothing was changed") {
		t.Errorf("broken file: %v", err)
	}
	if string(mustRead(t, path)) != "clusters: [broken" {
		t.Error("broken user file was overwritten")
	}
}

func TestParseDryRun(t *testing.T) {
	for _, tc := range []struct {
		in      string
		changed bool
		diff    string
	}{
		{"Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\nConfig diff:\n\nNo changes.", false, ""},
		{"Dry run summary:\nApplied configuration with a reboot (skipped in dry-run).\nConfig diff:\n\n--- a\n+++ b\n-x\n+y\n", true, "--- a\n+++ b\n-x\n+y"},
		{"Dry run summary:\nNode is running in maintenance mode and does not have a config yet.", true, "Dry run summary:\nNode is running in maintenance mode and does not have a config yet."},
	} {
		diff, changed := parseDryRun(tc.in)
		if changed != tc.changed || diff != tc.diff {
			t.Errorf("parseDryRun(%q) = %q, %v", tc.in, diff, changed)
		}
	}
}
