package flux

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/fluxcd/cli-utils/pkg/object"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
)

func fluxObject(kind, ns, name string, generation int64, status map[string]any, suspend bool) *unstructured.Unstructured {
	gv := KustomizationGVK.GroupVersion()
	if kind == "HelmRelease" {
		gv = HelmReleaseGVK.GroupVersion()
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gv.String(), "kind": kind,
		"metadata": map[string]any{"name": name, "namespace": ns, "generation": generation},
		"spec":     map[string]any{"suspend": suspend},
	}}
	if status != nil {
		u.Object["status"] = status
	}
	return u
}

func ready(observed int64, ok bool, reason string) map[string]any {
	st := "True"
	if !ok {
		st = "False"
	}
	return map[string]any{"observedGeneration": observed, "conditions": []any{
		map[string]any{"type": "Ready", "status": st, "reason": reason, "message": reason + " message"}}}
}

// Objects reads every Kustomization and HelmRelease and AllReady judges
// them the way the flux stage's wait and the postcheck both do.
func TestObjectsAndAllReady(t *testing.T) {
	hrReady := ready(3, true, "UpgradeSucceeded")
	hrReady["history"] = []any{
		map[string]any{"chartName": "app", "chartVersion": "1.0.0", "version": int64(1)},
		map[string]any{"chartName": "app", "chartVersion": "1.1.0", "version": int64(2)},
	}
	objs := []runtime.Object{
		fluxObject("Kustomization", "flux-system", "flux-system", 1, ready(1, true, "ReconciliationSucceeded"), false),
		fluxObject("Kustomization", "apps", "stale", 4, ready(3, true, "ReconciliationSucceeded"), false),
		fluxObject("HelmRelease", "infra", "nfs", 3, hrReady, false),
		fluxObject("HelmRelease", "infra", "orphan", 1, nil, false),
		fluxObject("HelmRelease", "infra", "failing", 2, ready(2, false, "InstallFailed"), false),
		fluxObject("HelmRelease", "infra", "paused", 1, nil, true),
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		KustomizationGVR: "KustomizationList", HelmReleaseGVR: "HelmReleaseList"}, objs...)
	got, err := Objects(context.Background(), dyn)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	byID := map[string]Object{}
	for _, o := range got {
		ids = append(ids, o.ID())
		byID[o.ID()] = o
	}
	if want := "HelmRelease infra/failing, HelmRelease infra/nfs, HelmRelease infra/orphan, HelmRelease infra/paused, Kustomization apps/stale, Kustomization flux-system/flux-system"; strings.Join(ids, ", ") != want {
		t.Fatalf("objects %v", ids)
	}
	if o := byID["HelmRelease infra/nfs"]; !o.Ready || o.Revision != "1.1.0" {
		t.Errorf("nfs: %+v (the latest snapshot's chart version is the revision)", o)
	}
	if o := byID["HelmRelease infra/orphan"]; o.Ready || !strings.Contains(o.Detail, "helm-controller") {
		t.Errorf("a HelmRelease nobody reconciles: %+v", o)
	}
	if o := byID["Kustomization apps/stale"]; o.Ready || !strings.Contains(o.Detail, "generation 4 not observed") {
		t.Errorf("a Ready status of an older generation counted: %+v", o)
	}
	done, status := AllReady(got)
	if done {
		t.Fatalf("AllReady with a failing, an orphaned and a stale object: %s", status)
	}
	for _, want := range []string{"2 of 6", "suspended: HelmRelease infra/paused", "HelmRelease infra/failing not Ready (InstallFailed", "HelmRelease infra/orphan not Ready", "Kustomization apps/stale not Ready"} {
		if !strings.Contains(status, want) {
			t.Errorf("status lacks %q: %s", want, status)
		}
	}
	if done, status := AllReady(got[1:2]); !done || status != "1 of 1 Kustomization(s) and HelmRelease(s) Ready" {
		t.Errorf("one Ready object: %v %q", done, status)
	}
	// A cluster without the HelmRelease CRD (no helm-controller installed):
	// its Kustomizations still count.
	noHR := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		KustomizationGVR: "KustomizationList", HelmReleaseGVR: "HelmReleaseList"}, objs[0])
	// The API server answers 404 for a resource it does not serve.
	noHR.PrependReactor("list", "helmreleases", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(HelmReleaseGVR.GroupResource(), "")
	})
	if got, err := Objects(context.Background(), noHR); err != nil || len(got) != 1 {
		t.Errorf("without the HelmRelease kind: %v, %v", got, err)
	}
}

// The install's wait polls only kinds that have a status to wait for: the
// others are Current for kstatus once they exist, and listing them every
// poll spent the rate limit the sync's wait beside it needs.
func TestWaitAppliedSkipsKindsWithoutStatus(t *testing.T) {
	set := object.ObjMetadataSet{
		{GroupKind: schema.GroupKind{Kind: "ServiceAccount"}, Namespace: "flux-system", Name: "source-controller"},
		{GroupKind: schema.GroupKind{Group: "rbac.authorization.k8s.io", Kind: "ClusterRoleBinding"}, Name: "cluster-reconciler"},
		{GroupKind: schema.GroupKind{Group: "networking.k8s.io", Kind: "NetworkPolicy"}, Namespace: "flux-system", Name: "allow-egress"},
		{GroupKind: schema.GroupKind{Kind: "ResourceQuota"}, Namespace: "flux-system", Name: "critical-pods"},
		{GroupKind: schema.GroupKind{Group: "apps", Kind: "Deployment"}, Namespace: "flux-system", Name: "source-controller"},
		{GroupKind: schema.GroupKind{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}, Name: "gitrepositories.source.toolkit.fluxcd.io"},
		{GroupKind: schema.GroupKind{Kind: "Namespace"}, Name: "flux-system"},
		{GroupKind: schema.GroupKind{Kind: "Service"}, Namespace: "flux-system", Name: "source-controller"},
	}
	got := withStatus(set)
	var kinds []string
	for _, m := range got {
		kinds = append(kinds, m.GroupKind.Kind)
	}
	if want := []string{"Deployment", "CustomResourceDefinition", "Namespace", "Service"}; !slices.Equal(kinds, want) {
		t.Fatalf("waited for %v, want %v", kinds, want)
	}
}
