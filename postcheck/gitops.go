package postcheck

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/flux"
	"github.com/homelab/bootstrap/internal/wait"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func (c *checker) flux(ctx context.Context) (check.Status, string) {
	dyn, err := c.dynamic()
	if err != nil {
		return check.Failf("%v", err)
	}
	type pair struct {
		kind string
		gvr  schema.GroupVersionResource
		r    flux.Readiness
		err  error
	}
	var objs []pair
	read := func(ctx context.Context) bool {
		objs = objs[:0]
		busy := false
		for _, k := range []pair{{kind: "GitRepository", gvr: flux.GitRepositoryGVR}, {kind: "Kustomization", gvr: flux.KustomizationGVR}} {
			u, err := dyn.Resource(k.gvr).Namespace(c.o.FluxNamespace).Get(ctx, c.o.FluxName, metav1.GetOptions{})
			if err == nil {
				k.r = flux.ReadinessOf(u)
				busy = busy || reconciling(k.r)
			}
			k.err = err
			objs = append(objs, k)
		}
		return busy
	}
	waited := c.settle(ctx, "the Flux sync pair", read)
	var parts []string
	st := check.Pass
	for _, k := range objs {
		switch {
		case apierrors.IsNotFound(k.err):
			st = check.Fail
			parts = append(parts, fmt.Sprintf("%s %s/%s not found", k.kind, c.o.FluxNamespace, c.o.FluxName))
		case k.err != nil:
			st = check.Fail
			parts = append(parts, fmt.Sprintf("%s: %v", k.kind, k.err))
		case k.r.Ready:
			parts = append(parts, fmt.Sprintf("%s Ready (revision %s)", k.kind, k.r.Revision))
		case reconciling(k.r):
			if st == check.Pass {
				st = check.Warn
			}
			parts = append(parts, fmt.Sprintf("%s still reconciling after %s (%s)", k.kind, waited, k.r.Detail))
		default:
			st = check.Fail
			parts = append(parts, fmt.Sprintf("%s not Ready (%s)", k.kind, k.r.Detail))
		}
	}
	return st, strings.Join(parts, "; ")
}

// fluxSettle bounds how long the Flux rows wait for reconciles in flight
// to end: every Kustomization and HelmRelease reconciles on its interval
// (and on request), and while it does its Ready condition is Unknown with
// reason Progressing (fluxcd/pkg apis/meta v1.30.2 conditions.go
// ProgressingReason) whatever the outcome will be. Judged at that moment
// it would be a false alarm.
const fluxSettle = 45 * time.Second

// reconciling says the object's reconcile is in flight: Ready Unknown
// because it is Progressing (not ProgressingWithRetry, which is a failure
// being retried), its new generation not yet observed, or no Ready
// condition yet on a new object.
func reconciling(r flux.Readiness) bool {
	return !r.Ready && (strings.HasPrefix(r.Detail, meta.ProgressingReason+": ") ||
		strings.HasPrefix(r.Detail, "generation ") || r.Detail == "no Ready condition yet")
}

// settle reads until read reports nothing in flight, for at most
// fluxSettle, and says how long it waited.
func (c *checker) settle(ctx context.Context, what string, read func(context.Context) bool) time.Duration {
	start := c.o.now()
	_ = wait.Until(ctx, wait.Spec{What: what + " done reconciling", Timeout: fluxSettle, Interval: 250 * time.Millisecond, MaxInterval: time.Second, Log: c.log(ctx)},
		func(ctx context.Context) (bool, string, error) { return !read(ctx), "", nil })
	return wait.Round(c.o.now().Sub(start))
}

// fluxObjects judges every Kustomization and HelmRelease in the cluster by
// the condition the flux stage waits on (flux.AllReady): what the user's
// repository declares is applied, not only the sync pair. One whose
// reconcile is in flight is waited for (fluxSettle); still in flight then,
// it warns.
func (c *checker) fluxObjects(ctx context.Context) (check.Status, string) {
	dyn, err := c.dynamic()
	if err != nil {
		return check.Failf("%v", err)
	}
	var objs []flux.Object
	var listErr error
	waited := c.settle(ctx, "every Kustomization and HelmRelease", func(ctx context.Context) bool {
		objs, listErr = flux.Objects(ctx, dyn)
		return listErr == nil && slices.ContainsFunc(objs, func(o flux.Object) bool { return !o.Suspended && reconciling(o.Readiness) })
	})
	if listErr != nil {
		return check.Failf("%v", listErr)
	}
	if c.o.Observed != nil {
		c.o.Observed.FluxObjects = objs
	}
	// In flight still: not failing (yet), not Ready either.
	var busy, failing []flux.Object
	for _, o := range objs {
		switch {
		case o.Suspended || o.Ready:
		case reconciling(o.Readiness):
			busy = append(busy, o)
		default:
			failing = append(failing, o)
		}
	}
	_, status := flux.AllReady(objs)
	switch {
	case len(objs) == 0:
		return check.Failf("no Kustomization or HelmRelease in the cluster (is Flux installed?)")
	case len(failing) > 0:
		return check.Failf("%s", status)
	case len(busy) > 0:
		return check.Warnf("%s (still reconciling after %s)", status, waited)
	}
	for _, o := range objs {
		if o.Suspended {
			return check.Warnf("%s", status)
		}
	}
	return check.Passf("%s", status)
}
