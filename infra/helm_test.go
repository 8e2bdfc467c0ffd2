package infra

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDiffValues(t *testing.T) {
	live := map[string]any{"nfs": map[string]any{"server": "10.0.0.5", "path": "/export"}, "replicaCount": float64(1)}
	want := map[string]any{"nfs": map[string]any{"server": "10.0.0.5", "path": "/export/k8s"}, "replicaCount": 1}
	if got := strings.Join(diffValues(live, want), ","); got != "nfs.path" {
		t.Fatalf("diff %q (int vs float64 must compare equal)", got)
	}
	if d := diffValues(NFSProvisioner(NFSOptions{Server: "a", Path: "/p"}).Values, NFSProvisioner(NFSOptions{Server: "a", Path: "/p"}).Values); len(d) != 0 {
		t.Fatalf("identical values differ: %v", d)
	}
}

func TestMergeValuesFileUserWins(t *testing.T) {
	p := filepath.Join(t.TempDir(), "values.yaml")
	os.WriteFile(p, []byte("nfs:\n  mountOptions: [nfsvers=3]\nresources:\n  limits: {memory: 64Mi}\n"), 0o600)
	base := NFSProvisioner(NFSOptions{Server: "10.0.0.5", Path: "/export", MountOptions: []string{"nfsvers=4.1"}, StorageClass: "nfs-storage"}).Values
	got, err := MergeValuesFile(base, p)
	if err != nil {
		t.Fatal(err)
	}
	nfs := got["nfs"].(map[string]any)
	if nfs["server"] != "10.0.0.5" || nfs["mountOptions"].([]any)[0] != "nfsvers=3" || got["resources"] == nil {
		t.Fatalf("merged: %v", got)
	}
	if base["nfs"].(map[string]any)["mountOptions"].([]string)[0] != "nfsvers=4.1" {
		t.Fatal("merge changed the base values")
	}
}

func TestCiliumValues(t *testing.T) {
	r, err := Cilium("https://helm.cilium.io/", "1.18.4", "https://10.0.20.10:6443", 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.Values["k8sServiceHost"] != "10.0.20.10" || r.Values["k8sServicePort"] != 6443 || r.Values["kubeProxyReplacement"] != true {
		t.Fatalf("values: %v", r.Values)
	}
}

func TestManifestObjects(t *testing.T) {
	m := "---\n# Source: x/templates/sa.yaml\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: sa\n---\n# Source: x/templates/deploy.yaml\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: nfs-provisioner\n  namespace: nfs\n"
	got := ManifestObjects(m, "Deployment")
	if len(got) != 1 || got[0].Name != "nfs-provisioner" || got[0].Namespace != "nfs" {
		t.Fatalf("%+v", got)
	}
}
