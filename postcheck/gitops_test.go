package postcheck

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/flux"
)

func fluxObject(gvr schema.GroupVersionResource, kind, status, reason string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.GroupVersion().String(), "kind": kind,
		"metadata": map[string]any{"name": "flux-system", "namespace": "flux-system", "generation": int64(1)},
		"status": map[string]any{"observedGeneration": int64(1), "lastAppliedRevision": "main@sha1:abc",
			"artifact":   map[string]any{"revision": "main@sha1:abc"},
			"conditions": []any{map[string]any{"type": "Ready", "status": status, "reason": reason, "message": "m"}}},
	}}
	return u
}

// A reconcile in flight (Ready Unknown, Progressing) is what every Flux
// object shows for a moment on each interval: the Flux rows wait for it
// to end instead of failing a healthy night; one that ends failing fails,
// and a failure being retried (ProgressingWithRetry) fails at once.
func TestFluxRowsWaitForAReconcileInFlight(t *testing.T) {
	scheme := runtime.NewScheme()
	lists := map[schema.GroupVersionResource]string{flux.GitRepositoryGVR: "GitRepositoryList", flux.KustomizationGVR: "KustomizationList", flux.HelmReleaseGVR: "HelmReleaseList"}
	cases := []struct {
		then, thenReason string
		want             check.Status
		reason           string
	}{
		{"True", "ReconciliationSucceeded", check.Pass, "1 of 1"},
		{"False", "BuildFailed", check.Fail, "BuildFailed"},
	}
	for _, tc := range cases {
		repo := fluxObject(flux.GitRepositoryGVR, "GitRepository", "True", "Succeeded")
		ks := fluxObject(flux.KustomizationGVR, "Kustomization", "Unknown", "Progressing")
		dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(scheme, lists, repo, ks)
		go func() {
			time.Sleep(600 * time.Millisecond)
			done := fluxObject(flux.KustomizationGVR, "Kustomization", tc.then, tc.thenReason)
			_, _ = dyn.Resource(flux.KustomizationGVR).Namespace("flux-system").Update(context.Background(), done, metav1.UpdateOptions{})
		}()
		c := &checker{o: Options{FluxNamespace: "flux-system", FluxName: "flux-system"}, dyn: dyn}
		st, reason := c.fluxObjects(context.Background())
		if st != tc.want || !strings.Contains(reason, tc.reason) {
			t.Errorf("reconcile ending %s: objects %s %q", tc.then, st, reason)
		}
		st, reason = c.flux(context.Background())
		if st != tc.want {
			t.Errorf("reconcile ending %s: sync pair %s %q", tc.then, st, reason)
		}
	}

	retry := fluxObject(flux.KustomizationGVR, "Kustomization", "Unknown", "ProgressingWithRetry")
	dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(scheme, lists, retry)
	c := &checker{dyn: dyn}
	start := time.Now()
	if st, reason := c.fluxObjects(context.Background()); st != check.Fail || time.Since(start) > 5*time.Second {
		t.Errorf("a failure being retried: %s %q after %s", st, reason, time.Since(start))
	}
}
