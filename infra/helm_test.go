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
	host, port, _, err := APIEndpoint(7445, "https://10.0.20.10:6443")
	if err != nil || host != "localhost" || port != 7445 {
		t.Fatalf("KubePrism endpoint: %s %d %v", host, port, err)
	}
	r := Cilium(CiliumOptions{RepoURL: "https://helm.cilium.io/", Version: "1.20.2", APIHost: host, APIPort: port, Nodes: 1})
	if r.Values["k8sServiceHost"] != "localhost" || r.Values["k8sServicePort"] != 7445 || r.Values["kubeProxyReplacement"] != true {
		t.Fatalf("values: %v", r.Values)
	}
	if got := r.Values["operator"].(map[string]any)["replicas"]; got != 1 {
		t.Fatalf("single-node operator replicas = %v, want 1", got)
	}
	for nodes, want := range map[int]int{0: 1, 1: 1, 2: 2, 5: 2} {
		if got := CiliumOperatorSize(nodes); got != want {
			t.Errorf("CiliumOperatorSize(%d) = %d, want %d", nodes, got, want)
		}
	}
	host, port, why, err := APIEndpoint(0, "https://10.0.20.10:6443")
	if err != nil || host != "10.0.20.10" || port != 6443 || !strings.Contains(why, "not enabled") {
		t.Fatalf("without KubePrism: %s %d %q %v", host, port, why, err)
	}
}

func TestManifestObjects(t *testing.T) {
	m := "---\n# Source: x/templates/sa.yaml\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: sa\n---\n# Source: x/templates/deploy.yaml\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: nfs-provisioner\n  namespace: nfs\n"
	got := ManifestObjects(m, "Deployment")
	if len(got) != 1 || got[0].Name != "nfs-provisioner" || got[0].Namespace != "nfs" {
		t.Fatalf("%+v", got)
	}
}
