package flux

import (
	"context"
	"os"
	"path/filepath"
	"runtime/debug"
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
	path := labManifests(t)
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

// TestRenderCache: a rendering is kept under the hash of what it was
// rendered from and read back instead of rendering again; other options
// or other manifests render anew.
func TestRenderCache(t *testing.T) {
	path := labManifests(t)
	cache := t.TempDir()
	opts := InstallOptions{Version: config.DefaultFluxVersion, Manifests: path, Components: fluxmanifests.Components,
		Namespace: "flux-system", CacheDir: cache}
	first, err := RenderInstall(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(cache, "*.yaml"))
	if len(files) != 1 {
		t.Fatalf("cache holds %v after one rendering", files)
	}
	if b, _ := os.ReadFile(files[0]); string(b) != first {
		t.Fatal("the cached rendering differs from the one returned")
	}
	// Marked, so a read from the cache shows.
	if err := os.WriteFile(files[0], []byte(first+"# from the cache\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if again, err := RenderInstall(context.Background(), opts); err != nil || !strings.HasSuffix(again, "# from the cache\n") {
		t.Fatalf("the same options rendered again instead of reading the cache (%v)", err)
	}
	opts.ClusterDomain = "homelab.internal"
	other, err := RenderInstall(context.Background(), opts)
	if err != nil || strings.Contains(other, "# from the cache") || !strings.Contains(other, "homelab.internal") {
		t.Fatalf("another cluster domain read the cache (%v)", err)
	}
	// Other manifests (a directory holding the same files but one) are
	// another key.
	dir := t.TempDir()
	if err := fetchManifests(context.Background(), InstallOptions{Manifests: path}, dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "policies.yaml"), []byte("---\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts.Manifests = dir
	if _, err := RenderInstall(context.Background(), opts); err != nil {
		t.Fatal(err)
	}
	if files, _ = filepath.Glob(filepath.Join(cache, "*.yaml")); len(files) != 3 {
		t.Errorf("cache holds %d renderings after three different ones", len(files))
	}
}

// labManifests builds Flux's manifests.tar.gz from the lab's controllers.
func labManifests(t *testing.T) string {
	t.Helper()
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
	return path
}

// A rendering lowers the GC target while kustomize runs and puts back the
// one it found, also when renderings overlap.
func TestTightGCRestoresTheTarget(t *testing.T) {
	before := debug.SetGCPercent(150)
	defer debug.SetGCPercent(before)
	first := tightGC()
	second := tightGC()
	if got := debug.SetGCPercent(renderGCPercent); got != renderGCPercent {
		t.Fatalf("GC target %d while rendering, want %d", got, renderGCPercent)
	}
	first()
	if got := debug.SetGCPercent(renderGCPercent); got != renderGCPercent {
		t.Fatalf("GC target %d while a second rendering runs, want %d", got, renderGCPercent)
	}
	second()
	if got := debug.SetGCPercent(150); got != 150 {
		t.Fatalf("GC target %d after the renderings, want the 150 it was", got)
	}
}
