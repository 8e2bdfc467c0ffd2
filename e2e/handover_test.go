package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/flux"
)

// TestFluxTakesOverHelmReleases hands the NFS provisioner the infra stage
// installed to Flux, as a user would: `bootstrap handover` prints the
// HelmRepository and HelmRelease, they are committed under ./infra, and
// the flux stage waits until the real helm-controller has adopted the
// release (and installed another HelmRelease of the tree from the lab's
// chart repository). A chart bump in git is then rolled out by Flux, and neither a
// re-run of the infra stage nor of the whole pipeline (whose config still
// names the old chart) writes a Helm revision or reverts it. Cilium is
// handed over with them; when the file leaves the repository Flux prunes
// the NFS provisioner's objects but not Cilium's (the handover marks them
// prune: disabled: uninstalling the CNI would cut every pod's network).
func TestFluxTakesOverHelmReleases(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 6*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1, CNI: "cilium"})
	// The infra stage installs the previous chart release.
	if err := h.EditConfig(func(s string) (string, error) {
		return strings.Replace(s, "  nfs:\n", "  nfs:\n    chartVersion: 4.0.17\n", 1), nil
	}); err != nil {
		t.Fatal(err)
	}
	first := run(t, ctx, h, "run", "--stage", "all")
	if first.ExitCode != 0 {
		t.Fatalf("first run failed:\n%s", first.Tail(40))
	}
	if err := h.PostcheckGreen(); err != nil {
		t.Fatalf("after the first run: %v", err)
	}
	if !strings.Contains(first.Stdout+first.Stderr, "1 of 1 Kustomization(s) and HelmRelease(s) Ready") {
		t.Errorf("the flux stage did not judge every Flux object:\n%s", first.Tail(30))
	}
	if r := counters(t, ctx, h).HelmReleases[nfsRelease]; r.Revision != 1 {
		t.Fatalf("the infra stage's release: %+v", r)
	}

	// The handover objects, committed where Flux syncs from.
	ho := run(t, ctx, h, "handover")
	if ho.ExitCode != 0 || !strings.Contains(ho.Stdout, "kind: HelmRelease") || !strings.Contains(ho.Stdout, "version: 4.0.17") {
		t.Fatalf("bootstrap handover (exit %d):\n%s\n%s", ho.ExitCode, ho.Stdout, ho.Stderr)
	}
	infraDir := filepath.Join(h.Lab.GitDir(), "infra")
	writeFile(t, filepath.Join(infraDir, "nfs-provisioner.yaml"), []byte(ho.Stdout))
	kustomization, err := os.ReadFile(filepath.Join(infraDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(infraDir, "kustomization.yaml"), append(kustomization, "  - nfs-provisioner.yaml\n  - demo-app.yaml\n"...))
	// And a release Flux installs from scratch, from the same chart
	// repository: the stand-in chart without a StorageClass.
	writeFile(t, filepath.Join(infraDir, "demo-app.yaml"), []byte(`apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata:
  name: demo-app
  namespace: homelab
spec:
  interval: 10m
  chart:
    spec:
      chart: nfs-subdir-external-provisioner
      version: 4.0.18
      sourceRef: {kind: HelmRepository, name: nfs-subdir-external-provisioner, namespace: flux-system}
  values:
    nfs: {server: 127.0.0.1, path: /export/demo}
    storageClass: {create: false}
`))

	adopt := run(t, ctx, h, "run", "--stage", "flux")
	if adopt.ExitCode != 0 {
		t.Fatalf("flux stage with the HelmRelease failed:\n%s", adopt.Tail(40))
	}
	if !strings.Contains(adopt.Stdout+adopt.Stderr, "4 of 4 Kustomization(s) and HelmRelease(s) Ready") {
		t.Errorf("the flux stage did not wait for the HelmRelease:\n%s", adopt.Tail(30))
	}
	// helm-controller took the release it had no history of as unmanaged
	// and upgraded it: one revision, written by Flux.
	adopted := counters(t, ctx, h)
	if r := adopted.HelmReleases[nfsRelease]; r.Revision != 2 || r.Status != "deployed" {
		t.Fatalf("after the takeover the release is %+v, want revision 2 deployed", r)
	}
	if v := helmReleaseChart(t, ctx, h); v != "4.0.17" {
		t.Errorf("HelmRelease reports chart %q after the takeover, want 4.0.17", v)
	}
	if r := adopted.HelmReleases["homelab/demo-app"]; r.Revision != 1 || r.Status != "deployed" {
		t.Errorf("the release Flux installs: %+v (all: %v)", r, adopted.HelmReleases)
	}
	if r := adopted.HelmReleases[ciliumRelease]; r.Revision != 2 || r.Status != "deployed" {
		t.Errorf("Cilium after the takeover: %+v, want revision 2 deployed", r)
	}

	verify := run(t, ctx, h, "run", "--stage", "infra")
	if verify.ExitCode != 0 {
		t.Fatalf("infra stage on the adopted release failed:\n%s", verify.Tail(40))
	}
	if want := "nfs-provisioner: managed by Flux HelmRelease flux-system/nfs-provisioner; verifying only"; !strings.Contains(verify.Stdout+verify.Stderr, want) {
		t.Errorf("the infra stage does not say %q:\n%s", want, verify.Tail(20))
	}
	if r := counters(t, ctx, h).HelmReleases[nfsRelease]; r.Revision != 2 {
		t.Errorf("the infra stage wrote a revision of the adopted release: %+v", r)
	}

	// A chart bump in git: Flux rolls it out.
	hrFile := filepath.Join(infraDir, "nfs-provisioner.yaml")
	b, err := os.ReadFile(hrFile)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, hrFile, []byte(strings.Replace(string(b), "version: 4.0.17", "version: 4.0.18", 1)))
	bump := run(t, ctx, h, "run", "--stage", "flux")
	if bump.ExitCode != 0 {
		t.Fatalf("flux stage with the chart bump failed:\n%s", bump.Tail(40))
	}
	if r := counters(t, ctx, h).HelmReleases[nfsRelease]; r.Revision != 3 || r.Status != "deployed" {
		t.Fatalf("after the bump in git the release is %+v, want revision 3 deployed", r)
	}
	if v := helmReleaseChart(t, ctx, h); v != "4.0.18" {
		t.Fatalf("HelmRelease reports chart %q after the bump, want 4.0.18", v)
	}

	// The whole pipeline again, its config still at 4.0.17: nothing reverts.
	before := counters(t, ctx, h)
	again := run(t, ctx, h, "run", "--stage", "all")
	if again.ExitCode != 0 {
		t.Fatalf("re-run after the handover failed:\n%s", again.Tail(40))
	}
	if err := h.PostcheckGreen(); err != nil {
		t.Fatalf("after the re-run: %v", err)
	}
	after := counters(t, ctx, h)
	if r := after.HelmReleases[nfsRelease]; r.Revision != 3 {
		t.Errorf("the re-run wrote a revision of the release Flux owns: %+v", r)
	}
	if v := helmReleaseChart(t, ctx, h); v != "4.0.18" {
		t.Errorf("the re-run reverted the chart to %q", v)
	}
	if !strings.Contains(again.Stdout+again.Stderr, "runs chart 4.0.18 where the config says 4.0.17") {
		t.Errorf("the re-run does not say the config and the release disagree:\n%s", again.Tail(30))
	}
	for _, e := range after.NewWrites(before) {
		if e.ObjectRef.Resource == "secrets" && e.ObjectRef.Namespace == "nfs-provisioner" {
			t.Errorf("the re-run wrote Helm's release storage: %s", e)
		}
	}
	st, err := h.State()
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Outputs.Infra.ChartVersion; got != "4.0.18" {
		t.Errorf("state records chart %q, want the live 4.0.18", got)
	}
	checkPostcheckTable(t, again)

	// The handover file leaves the repository: Flux prunes what it
	// applied from it, except Cilium's objects.
	writeFile(t, filepath.Join(infraDir, "kustomization.yaml"), append(kustomization, "  - demo-app.yaml\n"...))
	prune := run(t, ctx, h, "run", "--stage", "flux")
	if prune.ExitCode != 0 {
		t.Fatalf("flux stage without the handover file failed:\n%s", prune.Tail(40))
	}
	dyn := labDynamic(t, h)
	if _, err := dyn.Resource(flux.HelmReleaseGVR).Namespace("flux-system").Get(ctx, "nfs-provisioner", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the NFS provisioner's HelmRelease was not pruned (%v): the prune check below proves nothing", err)
	}
	if _, err := dyn.Resource(flux.HelmReleaseGVR).Namespace("flux-system").Get(ctx, "cilium", metav1.GetOptions{}); err != nil {
		t.Errorf("Cilium's HelmRelease was pruned with the file: %v", err)
	}
	if r := counters(t, ctx, h).HelmReleases[ciliumRelease]; r.Status != "deployed" {
		t.Errorf("Cilium's release after the prune: %+v", r)
	}
}

const ciliumRelease = "kube-system/cilium"

const nfsRelease = "nfs-provisioner/nfs-provisioner"

// helmReleaseChart reads the chart version the HelmRelease's newest
// release runs, from the object helm-controller wrote.
func helmReleaseChart(t *testing.T, ctx context.Context, h *e2e.Harness) string {
	t.Helper()
	u, err := labDynamic(t, h).Resource(flux.HelmReleaseGVR).Namespace("flux-system").Get(ctx, "nfs-provisioner", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hist, _, _ := unstructured.NestedSlice(u.Object, "status", "history")
	if len(hist) == 0 {
		return ""
	}
	v, _ := hist[0].(map[string]any)["chartVersion"].(string)
	return v
}

// labDynamic is a dynamic client for the lab's API server, as admin.
func labDynamic(t *testing.T, h *e2e.Harness) dynamic.Interface {
	t.Helper()
	kc, err := h.Lab.Kube.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(kc.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	return dyn
}
