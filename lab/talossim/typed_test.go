package talossim

import (
	"strings"
	"testing"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
)

// talos114Config is a control plane config in Talos v1.14's form, as
// machinery's generator writes it for that contract.
func talos114Config(t *testing.T) config.Provider {
	t.Helper()
	return talos114ConfigOf(t, "1.37.2")
}

// talos112Config is a control plane config in Talos v1.12's form for
// Kubernetes kube, encoded.
func talos112Config(t *testing.T, kube string) []byte {
	t.Helper()
	in, err := generate.NewInput("lab", "https://10.10.0.11:6443", kube,
		generate.WithVersionContract(config.TalosVersion1_12),
		generate.WithInstallDisk("/dev/sda"),
		generate.WithInstallImage("factory.talos.dev/nocloud-installer/abc:v1.12.6"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := in.Config(machine.TypeControlPlane)
	if err != nil {
		t.Fatal(err)
	}
	data, err := cfg.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// talos114ConfigOf is talos114Config for Kubernetes kube.
func talos114ConfigOf(t *testing.T, kube string) config.Provider {
	t.Helper()
	in, err := generate.NewInput("lab", "https://10.10.0.11:6443", kube,
		generate.WithVersionContract(config.TalosVersion1_14),
		generate.WithInstallDisk("/dev/sda"),
		generate.WithInstallImage("factory.talos.dev/nocloud-installer/abc:v1.14.1"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := in.Config(machine.TypeControlPlane)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// A Talos v1.14 node takes a config with the typed documents, and refuses
// one that holds a v1alpha1 field beside the document that replaces it, as
// machinery's container validation does (config/container/validate.go at
// v1.14.1: V1Alpha1ConflictValidate of every document).
func TestTypedDocumentsAndTheMixedConfig(t *testing.T) {
	cfg := talos114Config(t)
	data, err := cfg.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "install:") {
		t.Fatal("the v1.14 config carries .machine.install")
	}
	parsed, _, err := parseAndValidate(data, "v1.14.1")
	if err != nil {
		t.Fatalf("v1.14 config refused: %v", err)
	}
	if got := kubeletImage(parsed); got != "ghcr.io/siderolabs/kubelet:v1.37.2" {
		t.Errorf("kubelet image %q", got)
	}
	if got := StaticPodImages(parsed)["kube-apiserver"]; got != "registry.k8s.io/kube-apiserver:v1.37.2" {
		t.Errorf("kube-apiserver image %q", got)
	}
	if clusterID(parsed) == "" {
		t.Error("no cluster ID from DiscoveryIdentityConfig")
	}
	if len(BootstrapManifests(parsed)) == 0 {
		t.Error("no bootstrap manifests from the typed documents")
	}

	mixed, err := cfg.PatchV1Alpha1(func(c *v1alpha1.Config) error {
		c.ClusterConfig.ProxyConfig = &v1alpha1.ProxyConfig{Disabled: new(true)} //nolint:staticcheck // the conflict under test
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	data, err = mixed.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := parseAndValidate(data, "v1.14.1"); err == nil || !strings.Contains(err.Error(), "KubeProxyConfig") {
		t.Fatalf("mixed config: %v, want the KubeProxyConfig conflict", err)
	}

}

// The typed documents' images are checked against the Talos the node runs
// as the v1alpha1 ones are: Kubernetes 1.31 is too old for Talos v1.14
// (compatibility/talos114 at machinery v1.14.1).
func TestTypedDocumentImagesCheckedAgainstTheNodesTalos(t *testing.T) {
	data, err := talos114ConfigOf(t, "1.31.0").EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := parseAndValidate(data, "v1.14.1"); err == nil || !strings.Contains(err.Error(), "too old") {
		t.Fatalf("Kubernetes 1.31 on Talos v1.14: %v", err)
	}
}

// A node refuses a document kind its Talos does not register, as the real
// decoder does ("not registered": config/internal/registry/registry.go at
// v1.13.3): a config in v1.14's form on a v1.13 node (the trap of a minor
// upgrade that applies the new form first), and a v1.13 document on v1.12.
func TestNodeRefusesDocumentsItsTalosDoesNotKnow(t *testing.T) {
	data, err := talos114Config(t).EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"v1.13.3", "v1.12.6"} {
		if _, _, err := parseAndValidate(data, v); err == nil || !strings.Contains(err.Error(), "not registered") {
			t.Errorf("a v1.14 config on Talos %s: %v, want a document not registered", v, err)
		}
	}
	env := "\n---\napiVersion: v1alpha1\nkind: EnvironmentConfig\nvariables:\n  HTTP_PROXY: http://proxy:3128\n"
	old := talos112Config(t, "1.35.4")
	withEnv := append(old, env...)
	if _, _, err := parseAndValidate(withEnv, "v1.12.6"); err == nil || !strings.Contains(err.Error(), `"EnvironmentConfig" "v1alpha1": not registered`) {
		t.Errorf("EnvironmentConfig on Talos v1.12.6: %v", err)
	}
	for _, v := range []string{"v1.13.3", "v1.14.1"} {
		if _, _, err := parseAndValidate(withEnv, v); err != nil {
			t.Errorf("EnvironmentConfig on Talos %s: %v", v, err)
		}
	}
	if _, _, err := parseAndValidate(old, "v1.14.1"); err != nil {
		t.Errorf("a v1.12 config on Talos v1.14.1 (a node upgraded across two minors keeps its config): %v", err)
	}
}

// TestKubernetesImagesJudgedByTheNodesTalos: a node judges the Kubernetes
// images of a config against the Talos it runs, as a real node does
// against its own build (compatibility.ValidateKubernetesImageTag). A
// v1.12 node takes Kubernetes 1.30, which Talos v1.14 (the machinery the
// simulator is built with) refuses, and refuses 1.36, which v1.12 does
// not run.
func TestKubernetesImagesJudgedByTheNodesTalos(t *testing.T) {
	cfgAt := func(kube string) []byte { return talos112Config(t, kube) }
	if _, _, err := parseAndValidate(cfgAt("1.30.14"), "v1.12.6"); err != nil {
		t.Fatalf("a v1.12.6 node refuses Kubernetes 1.30.14: %v", err)
	}
	if _, _, err := parseAndValidate(cfgAt("1.30.14"), "v1.14.1"); err == nil || !strings.Contains(err.Error(), "too old to be used with Talos 1.14") {
		t.Fatalf("a v1.14.1 node takes Kubernetes 1.30.14: %v", err)
	}
	if _, _, err := parseAndValidate(cfgAt("1.36.1"), "v1.12.6"); err == nil || !strings.Contains(err.Error(), "1.36.1") {
		t.Fatalf("a v1.12.6 node takes Kubernetes 1.36.1: %v", err)
	}
}
