package flux

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/homelab/bootstrap/internal/wait"
)

// HelmRelease's kind (helm-controller api/v2 at v1.6.4, the version flux2
// v2.9.5 ships).
var (
	HelmReleaseGVK = schema.GroupVersionKind{Group: "helm.toolkit.fluxcd.io", Version: "v2", Kind: "HelmRelease"}
	HelmReleaseGVR = schema.GroupVersionResource{Group: "helm.toolkit.fluxcd.io", Version: "v2", Resource: "helmreleases"}
)

// Object is one Flux object that applies something to the cluster (a
// Kustomization or a HelmRelease, in any namespace) and what its status
// says.
type Object struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Suspended objects are not reconciled at all (spec.suspend): neither
	// waited for nor failed, but reported.
	Suspended bool `json:"suspended,omitempty"`
	Readiness
}

// ID is "Kind namespace/name".
func (o Object) ID() string { return fmt.Sprintf("%s %s/%s", o.Kind, o.Namespace, o.Name) }

// reconcilers are the kinds whose readiness says whether what the user's
// repository declares is applied, and the controller that reconciles each.
var reconcilers = []struct {
	kind       string
	gvr        schema.GroupVersionResource
	controller string
}{
	{"Kustomization", KustomizationGVR, "kustomize-controller"},
	{"HelmRelease", HelmReleaseGVR, "helm-controller"},
}

// Objects lists every Kustomization and HelmRelease in the cluster, sorted.
// A kind whose CRD is not installed has none.
func Objects(ctx context.Context, dyn dynamic.Interface) ([]Object, error) {
	var out []Object
	for _, k := range reconcilers {
		list, err := dyn.Resource(k.gvr).List(ctx, metav1.ListOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
				continue
			}
			return nil, fmt.Errorf("listing %ss: %w", k.kind, err)
		}
		for i := range list.Items {
			u := &list.Items[i]
			suspended, _, _ := unstructured.NestedBool(u.Object, "spec", "suspend")
			r := ReadinessOf(u)
			if _, has := conditionOf(u, "Ready"); !has && !r.Ready {
				// No controller ever wrote a status: most often the kind's
				// controller is not installed (flux.components).
				r.Detail = fmt.Sprintf("no Ready condition yet (is %s running? see flux.components)", k.controller)
			}
			out = append(out, Object{Kind: k.kind, Namespace: u.GetNamespace(), Name: u.GetName(), Suspended: suspended, Readiness: r})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID() < out[j].ID() })
	return out, nil
}

func conditionOf(u *unstructured.Unstructured, typ string) (map[string]any, bool) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, raw := range conds {
		if c, ok := raw.(map[string]any); ok && c["type"] == typ {
			return c, true
		}
	}
	return nil, false
}

// AllReady is the condition both the flux stage's wait and the postcheck
// judge the objects by: every object that is not suspended is Ready for its
// current generation. status names the ones that are not.
func AllReady(objs []Object) (done bool, status string) {
	var notReady, suspended []string
	for _, o := range objs {
		switch {
		case o.Suspended:
			suspended = append(suspended, o.ID())
		case !o.Ready:
			notReady = append(notReady, fmt.Sprintf("%s not Ready (%s)", o.ID(), o.Detail))
		}
	}
	ready := len(objs) - len(notReady) - len(suspended)
	parts := []string{fmt.Sprintf("%d of %d Kustomization(s) and HelmRelease(s) Ready", ready, len(objs))}
	if len(suspended) > 0 {
		parts = append(parts, "suspended: "+strings.Join(suspended, ", "))
	}
	parts = append(parts, notReady...)
	return len(notReady) == 0, strings.Join(parts, "; ")
}

// WaitAllReady waits until every Kustomization and HelmRelease in the
// cluster is Ready (AllReady): what the user's repository declares, not
// only the sync pair, is applied.
func (c *Client) WaitAllReady(ctx context.Context, timeout time.Duration) ([]Object, error) {
	var last []Object
	err := wait.Until(ctx, wait.Spec{What: "every Flux Kustomization and HelmRelease Ready", Timeout: timeout, Interval: 500 * time.Millisecond, Log: c.log},
		func(ctx context.Context) (bool, string, error) {
			objs, err := Objects(ctx, c.dyn)
			if err != nil {
				return false, err.Error(), nil
			}
			last = objs
			done, status := AllReady(objs)
			return done, status, nil
		})
	return last, err
}
