package flux

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	kustomizev1 "github.com/fluxcd/kustomize-controller/api/v1"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"github.com/rs/zerolog"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// TestReconcileWithSourceAsksTheSourceFirst: the Kustomization is asked to
// reconcile only once source-controller has handled the GitRepository's
// request, as `flux reconcile kustomization --with-source` does; asked
// together, kustomize-controller may look for an artifact the restored
// source-controller has not built yet and wait out its requeue (30s).
func TestReconcileWithSourceAsksTheSourceFirst(t *testing.T) {
	const rev = "main@sha1:0123456789abcdef0123456789abcdef01234567"
	scheme := syncScheme(t)
	ready := map[string]any{"type": "Ready", "status": "True", "reason": "Succeeded", "message": "ok"}
	repo := syncObject(GitRepositoryGVK, map[string]any{"observedGeneration": int64(1), "conditions": []any{ready},
		"artifact": map[string]any{"revision": rev}, "lastHandledReconcileAt": "before the restore"})
	ks := syncObject(KustomizationGVK, map[string]any{"observedGeneration": int64(1), "conditions": []any{ready},
		"lastAppliedRevision": rev, "lastHandledReconcileAt": "before the restore"})
	kc := fake.NewClientBuilder().WithScheme(scheme).WithObjects(repo, ks).WithStatusSubresource(repo, ks).Build()
	c := &Client{kube: kc, log: zerolog.Nop()}

	// The controllers: each handles a request by writing its token to
	// lastHandledReconcileAt; the Kustomization's records whether the
	// source had handled its own request when the Kustomization's came.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var (
		mu             sync.Mutex
		sourceHandled  bool
		ksAskedEarly   bool
		ksRequestsSeen int
		// source-controller takes its time: a Kustomization asked
		// together with its source is seen while the source still works.
		sourceSince time.Time
	)
	go func() {
		for ctx.Err() == nil {
			// The Kustomization first: a request made together with the
			// source's is seen before the source handled its own.
			for _, gvk := range []schema.GroupVersionKind{KustomizationGVK, GitRepositoryGVK} {
				u := &unstructured.Unstructured{}
				u.SetGroupVersionKind(gvk)
				if kc.Get(ctx, client.ObjectKey{Namespace: "flux-system", Name: "flux-system"}, u) != nil {
					continue
				}
				token := u.GetAnnotations()[ReconcileRequestAnnotation]
				handled, _, _ := unstructured.NestedString(u.Object, "status", "lastHandledReconcileAt")
				if token == "" || token == handled {
					continue
				}
				mu.Lock()
				if gvk == KustomizationGVK {
					ksRequestsSeen++
					ksAskedEarly = ksAskedEarly || !sourceHandled
				}
				if gvk == GitRepositoryGVK && sourceSince.IsZero() {
					sourceSince = time.Now()
				}
				busy := gvk == GitRepositoryGVK && time.Since(sourceSince) < 100*time.Millisecond
				mu.Unlock()
				if busy {
					continue
				}
				_ = unstructured.SetNestedField(u.Object, token, "status", "lastHandledReconcileAt")
				if kc.Status().Update(ctx, u) == nil && gvk == GitRepositoryGVK {
					mu.Lock()
					sourceHandled = true
					mu.Unlock()
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()

	tick := time.Date(2026, 11, 25, 8, 0, 0, 0, time.UTC)
	now := func() time.Time { tick = tick.Add(time.Second); return tick }
	if err := c.ReconcileWithSource(ctx, "flux-system", "flux-system", rev, now, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if ksRequestsSeen != 1 || ksAskedEarly {
		t.Fatalf("the Kustomization was asked %d time(s), before the source had handled its request: %v", ksRequestsSeen, ksAskedEarly)
	}
}

func syncObject(gvk schema.GroupVersionKind, status map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"status": status}}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace("flux-system")
	u.SetName("flux-system")
	u.SetGeneration(1)
	return u
}

// TestSyncWaitFailsFast: the sync wait ends within seconds, with the
// controller's message, on Ready=False for what it waits for and on a
// suspended object, as flux bootstrap's objectReconciled does (flux2
// v2.9.5 pkg/bootstrap/bootstrap.go); it keeps waiting on a failure that
// is not of this wait: written before its reconcile request was handled,
// of the revision before, or while the Kustomization waits for its
// source (ArtifactFailed).
func TestSyncWaitFailsFast(t *testing.T) {
	const rev = "main@sha1:0123456789abcdef0123456789abcdef01234567"
	const old = "main@sha1:89abcdef0123456789abcdef0123456789abcdef"
	scheme := syncScheme(t)
	ready := map[string]any{"type": "Ready", "status": "True", "reason": "Succeeded", "message": "ok"}
	failed := func(reason, msg string) map[string]any {
		return map[string]any{"type": "Ready", "status": "False", "reason": reason, "message": msg}
	}
	repoReady := syncObject(GitRepositoryGVK, map[string]any{"observedGeneration": int64(1), "conditions": []any{ready}, "artifact": map[string]any{"revision": rev}})
	for _, tc := range []struct {
		name     string
		ks       *unstructured.Unstructured
		suspend  bool
		requests map[schema.GroupVersionKind]string
		want     string // "" keeps waiting
	}{
		{"build failed at the wanted revision", syncObject(KustomizationGVK, map[string]any{"observedGeneration": int64(1), "lastAttemptedRevision": rev,
			"conditions": []any{failed("BuildFailed", "kustomize build failed: accumulating resources")}}), false, nil, "BuildFailed: kustomize build failed"},
		{"never reconciled before, failing", syncObject(KustomizationGVK, map[string]any{"lastAttemptedRevision": rev,
			"conditions": []any{failed("ReconciliationFailed", "decryption failed")}}), false, nil, "decryption failed"},
		{"suspended", syncObject(KustomizationGVK, map[string]any{"observedGeneration": int64(1), "conditions": []any{ready}, "lastAppliedRevision": old}), true, nil, "is suspended"},
		{"failed at the revision before", syncObject(KustomizationGVK, map[string]any{"observedGeneration": int64(1), "lastAttemptedRevision": old,
			"conditions": []any{failed("BuildFailed", "old")}}), false, nil, ""},
		// kustomize-controller records lastAttemptedRevision after the
		// path check: the old one stays.
		{"spec.path not in the artifact", syncObject(KustomizationGVK, map[string]any{"observedGeneration": int64(1), "lastAttemptedRevision": old,
			"conditions": []any{failed("ArtifactFailed", "kustomization path not found: stat /tmp/kustomization-1/infra: no such file or directory")}}), false, nil, "kustomization path not found: stat /tmp/kustomization-1/infra"},
		{"waiting for its source", syncObject(KustomizationGVK, map[string]any{"lastAttemptedRevision": rev,
			"conditions": []any{failed("ArtifactFailed", "Source artifact not found, retrying in 30s")}}), false, nil, ""},
		{"failed before the request was handled", syncObject(KustomizationGVK, map[string]any{"observedGeneration": int64(1), "lastAttemptedRevision": rev, "lastHandledReconcileAt": "earlier",
			"conditions": []any{failed("ReconciliationFailed", "stale")}}), false, map[schema.GroupVersionKind]string{KustomizationGVK: "now"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ks := tc.ks.DeepCopy()
			if tc.suspend {
				if err := unstructured.SetNestedField(ks.Object, true, "spec", "suspend"); err != nil {
					t.Fatal(err)
				}
			}
			repo := repoReady.DeepCopy()
			kc := fake.NewClientBuilder().WithScheme(scheme).WithObjects(repo, ks).WithStatusSubresource(repo, ks).Build()
			c := &Client{kube: kc, log: zerolog.Nop()}
			start := time.Now()
			timeout := time.Second
			if tc.want != "" {
				timeout = time.Minute
			}
			err := c.WaitReadyAfter(context.Background(), "flux-system", "flux-system", rev, tc.requests, timeout)
			switch {
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || time.Since(start) > 10*time.Second):
				t.Errorf("after %s: %v, want at once an error with %q", time.Since(start).Round(time.Millisecond), err, tc.want)
			case tc.want == "" && (err == nil || !strings.Contains(err.Error(), "timed out") && !strings.Contains(err.Error(), "deadline")):
				t.Errorf("%v, want the wait to go on to its timeout", err)
			}
		})
	}
}

// syncScheme knows the Flux sync objects the fake client serves.
func syncScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := sourcev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := kustomizev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}
