package flux

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/lab/fluxmanifests"
	"github.com/homelab/bootstrap/lab/kube"
)

// TestInstallUsesTheClusterDomain: Flux's controllers send events to
// notification-controller by its Service's DNS name; on a cluster whose
// Talos dnsDomain is not cluster.local the rendered addresses follow it
// (flux2 v2.9.5 pkg/manifestgen/install/manifests.go EventsAddr), as
// `flux install --cluster-domain` renders them.
func TestInstallUsesTheClusterDomain(t *testing.T) {
	bins, err := kube.LoadBinaries("")
	if err != nil {
		if os.Getenv("BOOTSTRAP_REQUIRE_LAB") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	src, err := fluxmanifests.SourcesFromBinaries(context.Background(), bins)
	if err != nil {
		t.Fatal(err)
	}
	tarball, err := fluxmanifests.Build(src)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "manifests.tar.gz")
	if err := os.WriteFile(path, tarball, 0o600); err != nil {
		t.Fatal(err)
	}
	render := func(domain string) string {
		objs, err := InstallObjects(context.Background(), InstallOptions{Version: config.DefaultFluxVersion, Manifests: path,
			Components: fluxmanifests.Components, Namespace: "flux-system", ClusterDomain: domain})
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, o := range objs {
			data, _ := o.MarshalJSON()
			b.Write(data)
		}
		return b.String()
	}
	if got := render("homelab.internal"); !strings.Contains(got, ".svc.homelab.internal.") || strings.Contains(got, ".svc.cluster.local.") {
		t.Error("with dnsDomain homelab.internal the controllers still address cluster.local")
	}
	if got := render(""); !strings.Contains(got, ".svc.cluster.local.") {
		t.Error("the default domain is not cluster.local")
	}
}
