package flux

import (
	"context"
	"fmt"
	"strings"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/kube"
)

// The kinds of the sync objects.
var (
	GitRepositoryGVK = schema.GroupVersionKind{Group: "source.toolkit.fluxcd.io", Version: "v1", Kind: "GitRepository"}
	KustomizationGVK = schema.GroupVersionKind{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Kind: "Kustomization"}
	GitRepositoryGVR = schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1", Resource: "gitrepositories"}
	KustomizationGVR = schema.GroupVersionResource{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Resource: "kustomizations"}
)

// Readiness is what a Flux object's status says.
type Readiness struct {
	Ready bool `json:"ready"`
	// Revision is the GitRepository's artifact revision or the
	// Kustomization's last applied revision ("main@sha1:<hex>"), or the
	// chart version a HelmRelease's latest release runs.
	Revision string `json:"revision,omitempty"`
	// Detail is the Ready condition's reason and message when not ready.
	Detail string `json:"detail,omitempty"`
	// HandledRequest is the last reconcile request the controller handled
	// (status.lastHandledReconcileAt, the requestedAt value it saw).
	HandledRequest string `json:"handled_request,omitempty"`
	// Failed says the Ready condition is False for the object's current
	// generation (status.observedGeneration absent or equal: the
	// controllers write it only on success), with Reason and Message as
	// the controller wrote them.
	Failed          bool   `json:"-"`
	Reason, Message string `json:"-"`
	// Suspended is spec.suspend: the controller will not reconcile it.
	Suspended bool `json:"-"`
	// AttemptedRevision is a Kustomization's status.lastAttemptedRevision,
	// the revision its last reconciliation, failed or not, was of.
	AttemptedRevision string `json:"-"`
}

// ReadinessOf reads a Flux object's Ready condition: it counts only when
// True for the object's current generation.
func ReadinessOf(u *unstructured.Unstructured) Readiness {
	gen := u.GetGeneration()
	observed, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
	rev, _, _ := unstructured.NestedString(u.Object, "status", "artifact", "revision")
	if r, ok, _ := unstructured.NestedString(u.Object, "status", "lastAppliedRevision"); ok {
		rev = r
	}
	if u.GroupVersionKind() == HelmReleaseGVK {
		var hr helmv2.HelmRelease
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &hr); err == nil {
			if latest := hr.Status.History.Latest(); latest != nil {
				rev = latest.ChartVersion
			}
		}
	}
	handled, _, _ := unstructured.NestedString(u.Object, "status", "lastHandledReconcileAt")
	r := readiness(u, gen, observed, rev)
	r.HandledRequest = handled
	r.Suspended, _, _ = unstructured.NestedBool(u.Object, "spec", "suspend")
	r.AttemptedRevision, _, _ = unstructured.NestedString(u.Object, "status", "lastAttemptedRevision")
	if _, has, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration"); !has || observed == gen {
		for _, raw := range conditionsOf(u) {
			if raw["type"] == "Ready" && raw["status"] == "False" {
				r.Failed = true
				r.Reason, _ = raw["reason"].(string)
				r.Message, _ = raw["message"].(string)
			}
		}
	}
	return r
}

func conditionsOf(u *unstructured.Unstructured) []map[string]any {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	var out []map[string]any
	for _, raw := range conds {
		if c, ok := raw.(map[string]any); ok {
			out = append(out, c)
		}
	}
	return out
}

// transientReasons are the Ready=False reasons kustomize-controller v1.9.5
// writes while it waits for something else and retries on its own
// (internal/controller/kustomization_controller.go: the source's artifact
// not there yet, dependencies not ready): not this object's failure.
var transientReasons = map[string]bool{"ArtifactFailed": true, "DependencyNotReady": true}

// pathNotFound starts the one ArtifactFailed message that no retry mends:
// kustomize-controller v1.9.5 kustomization_controller.go reconcile, "check
// build path exists", writes it when spec.path is not in the fetched
// artifact (a typo in flux.path). Its other ArtifactFailed messages wait
// for the source (getSource errors, "Source artifact not found, retrying",
// "Source is not ready, artifact not found, retrying") or come from a
// fetch the controller retries with backoff. The controller records
// lastAttemptedRevision only after that check, so the revision the failure
// is about is the source's: it counts once the GitRepository serves the
// wanted revision.
const pathNotFound = "kustomization path not found"

// syncFailure is the error that ends a sync wait at once, as flux2 v2.9.5
// pkg/bootstrap/bootstrap.go objectReconciled ends `flux bootstrap`'s: a
// suspended object, or Ready=False for the current generation with the
// controller's message. A failure is taken as this wait's only when it is
// about what the wait asked for: after the reconcile request it made was
// handled, and for a Kustomization, of the wanted revision (a failure of
// the revision before, or while it waits for its source, is not).
// sourceAtWant says the GitRepository serves wantRevision (or none is
// wanted): a Kustomization's spec.path missing from that artifact is
// permanent (pathNotFound).
func syncFailure(gvk schema.GroupVersionKind, namespace, name, wantRevision, request string, r Readiness, sourceAtWant bool) error {
	what := fmt.Sprintf("%s %s/%s", gvk.Kind, namespace, name)
	switch {
	case r.Suspended:
		return fmt.Errorf("%s is suspended (spec.suspend: true), so Flux will not reconcile it: resume it (flux resume %s %s -n %s) or remove spec.suspend", what, strings.ToLower(gvk.Kind), name, namespace)
	case !r.Failed, request != "" && r.HandledRequest != request:
		return nil
	case gvk == KustomizationGVK && r.Reason == "ArtifactFailed" && strings.HasPrefix(r.Message, pathNotFound) && sourceAtWant:
		return fmt.Errorf("%s failed: %s: %s (flux.path names a directory the served tree does not hold)", what, r.Reason, r.Message)
	case gvk == KustomizationGVK && transientReasons[r.Reason]:
		return nil
	case gvk == KustomizationGVK && wantRevision != "" && r.AttemptedRevision != wantRevision:
		return nil
	}
	return fmt.Errorf("%s failed: %s: %s", what, r.Reason, r.Message)
}

func readiness(u *unstructured.Unstructured, gen, observed int64, rev string) Readiness {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, raw := range conds {
		cond, _ := raw.(map[string]any)
		if cond["type"] != "Ready" {
			continue
		}
		reason, _ := cond["reason"].(string)
		msg, _ := cond["message"].(string)
		switch {
		case cond["status"] == "True" && observed == gen:
			return Readiness{Ready: true, Revision: rev}
		case cond["status"] == "True":
			return Readiness{Revision: rev, Detail: fmt.Sprintf("generation %d not observed yet (at %d)", gen, observed)}
		}
		return Readiness{Revision: rev, Detail: fmt.Sprintf("%s: %s", reason, msg)}
	}
	return Readiness{Revision: rev, Detail: "no Ready condition yet"}
}

// WaitReady waits until the GitRepository and the Kustomization called
// name are Ready for their current generation and, when wantRevision is
// set, both at that revision. It fails at once on a suspended object or
// one that reports Ready=False for what it waits for (syncFailure).
func (c *Client) WaitReady(ctx context.Context, namespace, name, wantRevision string, timeout time.Duration) error {
	return c.waitSync(ctx, namespace, name, wantRevision, nil, timeout)
}

// Unsynced returns the kinds of the sync pair called name whose object is
// not Ready at wantRevision (any revision when empty).
func (c *Client) Unsynced(ctx context.Context, namespace, name, wantRevision string) ([]schema.GroupVersionKind, error) {
	var out []schema.GroupVersionKind
	for _, gvk := range []schema.GroupVersionKind{GitRepositoryGVK, KustomizationGVK} {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		if err := c.kube.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, u); err != nil {
			return nil, fmt.Errorf("reading %s %s/%s: %w", gvk.Kind, namespace, name, err)
		}
		if r := ReadinessOf(u); !r.Ready || wantRevision != "" && r.Revision != wantRevision {
			out = append(out, gvk)
		}
	}
	return out, nil
}

// RequestSync asks Flux to reconcile the objects of kinds called name at
// once (the GitRepository fetches now instead of at its interval; a
// Kustomization's failure from before is tried again) and returns the
// requests, for WaitReadyAfter. now stamps them.
func (c *Client) RequestSync(ctx context.Context, namespace, name string, kinds []schema.GroupVersionKind, now func() time.Time) (map[schema.GroupVersionKind]string, error) {
	requests := map[schema.GroupVersionKind]string{}
	for _, gvk := range kinds {
		token := RequestToken(now())
		if err := c.requestReconcile(ctx, gvk, namespace, name, token); err != nil {
			return requests, fmt.Errorf("asking Flux to reconcile %s %s/%s: %w", gvk.Kind, namespace, name, err)
		}
		requests[gvk] = token
	}
	return requests, nil
}

// WaitReadyAfter is WaitReady where a Ready=False counts only once the
// object handled its request: a status written before, about a Secret or
// revision fixed since, does not end the wait.
func (c *Client) WaitReadyAfter(ctx context.Context, namespace, name, wantRevision string, requests map[schema.GroupVersionKind]string, timeout time.Duration) error {
	return c.waitSync(ctx, namespace, name, wantRevision, requests, timeout)
}

// ReconcileWithSource asks Flux to reconcile the GitRepository called name
// and, once source-controller handled that and serves wantRevision, the
// Kustomization, then waits until both are Ready: what `flux reconcile
// kustomization --with-source` does (flux2 v2.9.5
// cmd/flux/reconcile_with_source.go: the source's reconcile is waited for
// before the object is annotated). Asked together, kustomize-controller
// may fetch the artifact before source-controller has built it again (after
// an etcd restore the status points at an artifact the new storage lacks),
// fail "artifact not found" and retry only after its --requeue-dependency
// (30s by default). now stamps each request.
func (c *Client) ReconcileWithSource(ctx context.Context, namespace, name, wantRevision string, now func() time.Time, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	repoToken := RequestToken(now())
	if err := c.requestReconcile(ctx, GitRepositoryGVK, namespace, name, repoToken); err != nil {
		return fmt.Errorf("asking Flux to reconcile GitRepository %s/%s: %w", namespace, name, err)
	}
	requests := map[schema.GroupVersionKind]string{GitRepositoryGVK: repoToken}
	if err := c.waitObjects(ctx, namespace, name, wantRevision, []schema.GroupVersionKind{GitRepositoryGVK}, requests, timeout); err != nil {
		return err
	}
	ksToken := RequestToken(now())
	if err := c.requestReconcile(ctx, KustomizationGVK, namespace, name, ksToken); err != nil {
		return fmt.Errorf("asking Flux to reconcile Kustomization %s/%s: %w", namespace, name, err)
	}
	requests[KustomizationGVK] = ksToken
	return c.waitSync(ctx, namespace, name, wantRevision, requests, timeout)
}

// waitSync waits for both objects of the sync pair (waitObjects).
func (c *Client) waitSync(ctx context.Context, namespace, name, wantRevision string, requests map[schema.GroupVersionKind]string, timeout time.Duration) error {
	return c.waitObjects(ctx, namespace, name, wantRevision, []schema.GroupVersionKind{GitRepositoryGVK, KustomizationGVK}, requests, timeout)
}

// waitObjects waits until the objects of kinds called name are Ready for
// their current generation, at wantRevision when set, and each having
// handled the reconcile request requests names for its kind: a Ready status
// written before the request does not count.
func (c *Client) waitObjects(ctx context.Context, namespace, name, wantRevision string, kinds []schema.GroupVersionKind, requests map[schema.GroupVersionKind]string, timeout time.Duration) error {
	var names []string
	for _, k := range kinds {
		names = append(names, k.Kind)
	}
	what := fmt.Sprintf("%s %s/%s Ready", strings.Join(names, " and "), namespace, name)
	if wantRevision != "" {
		what += " at " + wantRevision
	}
	if len(requests) > 0 {
		what += ", reconciled after the request"
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	return wait.Until(ctx, wait.Spec{What: what, Timeout: timeout, Interval: 250 * time.Millisecond, Log: c.log, Wake: c.wake(ctx, namespace, name, kinds)},
		func(ctx context.Context) (bool, string, error) {
			var status []string
			done := true
			sourceAtWant := wantRevision == ""
			for _, gvk := range kinds {
				u := &unstructured.Unstructured{}
				u.SetGroupVersionKind(gvk)
				if err := c.kube.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, u); err != nil {
					status = append(status, fmt.Sprintf("%s: %v", gvk.Kind, err))
					done = false
					continue
				}
				r := ReadinessOf(u)
				if gvk == GitRepositoryGVK && r.Ready && r.Revision == wantRevision {
					sourceAtWant = true
				}
				if err := syncFailure(gvk, namespace, name, wantRevision, requests[gvk], r, sourceAtWant); err != nil {
					return false, "", err
				}
				switch {
				case requests[gvk] != "" && r.HandledRequest != requests[gvk]:
					status = append(status, fmt.Sprintf("%s has not handled the reconcile request of %s yet", gvk.Kind, requests[gvk]))
					done = false
				case !r.Ready:
					status = append(status, fmt.Sprintf("%s not Ready (%s)", gvk.Kind, r.Detail))
					done = false
				case wantRevision != "" && r.Revision != wantRevision:
					status = append(status, fmt.Sprintf("%s at %s", gvk.Kind, r.Revision))
					done = false
				default:
					status = append(status, fmt.Sprintf("%s Ready at %s", gvk.Kind, r.Revision))
				}
			}
			return done, joinStatus(status), nil
		})
}

// Status returns both objects' readiness (for dry runs and reports).
func (c *Client) Status(ctx context.Context, namespace, name string) (repo, ks Readiness, err error) {
	for i, gvk := range []schema.GroupVersionKind{GitRepositoryGVK, KustomizationGVK} {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		if err := c.kube.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, u); err != nil {
			return repo, ks, err
		}
		if i == 0 {
			repo = ReadinessOf(u)
		} else {
			ks = ReadinessOf(u)
		}
	}
	return repo, ks, nil
}

func joinStatus(s []string) string { return strings.Join(s, "; ") }

// ReconcileRequestAnnotation asks a Flux controller to reconcile now, as
// `flux reconcile` does.
const ReconcileRequestAnnotation = "reconcile.fluxcd.io/requestedAt"

// RequestReconcile annotates a Flux object so its controller reconciles it
// at once instead of at its next interval.
func (c *Client) RequestReconcile(ctx context.Context, gvk schema.GroupVersionKind, namespace, name string, now time.Time) error {
	return c.requestReconcile(ctx, gvk, namespace, name, RequestToken(now))
}

// RequestToken is the requestedAt value RequestReconcile writes for now.
func RequestToken(now time.Time) string { return now.UTC().Format(time.RFC3339Nano) }

func (c *Client) requestReconcile(ctx context.Context, gvk schema.GroupVersionKind, namespace, name, token string) error {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(namespace)
	u.SetName(name)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, ReconcileRequestAnnotation, token)
	return c.kube.Patch(ctx, u, client.RawPatch(types.MergePatchType, []byte(patch)))
}

// wake watches the sync objects of kinds called name (kube.Wake): the
// sync wait polls as soon as a controller writes their status. A client
// without a cluster connection (tests) polls only.
func (c *Client) wake(ctx context.Context, namespace, name string, kinds []schema.GroupVersionKind) <-chan struct{} {
	var opens []func(context.Context) (watch.Interface, error)
	for _, gvk := range kinds {
		gvr := map[schema.GroupVersionKind]schema.GroupVersionResource{GitRepositoryGVK: GitRepositoryGVR, KustomizationGVK: KustomizationGVR}[gvk]
		if c.dyn != nil {
			opens = append(opens, func(ctx context.Context) (watch.Interface, error) {
				return c.dyn.Resource(gvr).Namespace(namespace).Watch(ctx, kube.Named(name))
			})
		}
	}
	return kube.Wake(ctx, opens...)
}
