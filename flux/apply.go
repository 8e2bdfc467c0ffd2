package flux

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fluxcd/cli-utils/pkg/kstatus/polling"
	"github.com/fluxcd/cli-utils/pkg/kstatus/status"
	"github.com/fluxcd/cli-utils/pkg/object"
	"github.com/fluxcd/pkg/ssa"
	ssautil "github.com/fluxcd/pkg/ssa/utils"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// FieldManager owns the fields bootstrap applies.
var owner = ssa.Owner{Field: "bootstrap", Group: "bootstrap.homelab"}

// Client applies objects with server-side apply and waits with kstatus,
// the way the flux CLI installs Flux.
type Client struct {
	kube  client.Client
	dyn   dynamic.Interface
	rm    *ssa.ResourceManager
	owner ssa.Owner
	log   zerolog.Logger
}

// NewClient connects to the cluster cfg reaches (kube.RESTConfigFrom).
func NewClient(cfg *rest.Config, log zerolog.Logger) (*Client, error) {
	return NewClientAs(cfg, owner, log)
}

// NewClientAs is NewClient applying as another field manager: the Talos
// bootstrap manifests are synced as "talos", the manager Talos created
// them with, as talosctl upgrade-k8s does.
func NewClientAs(cfg *rest.Config, as ssa.Owner, log zerolog.Logger) (*Client, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	// A dynamic mapper sees the Flux CRDs as soon as they are established.
	mapper, err := apiutil.NewDynamicRESTMapper(cfg, hc)
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Mapper: mapper})
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, err
	}
	rm := ssa.NewResourceManager(c, polling.NewStatusPoller(c, mapper, polling.Options{}), as)
	return &Client{kube: c, dyn: dyn, rm: rm, owner: as, log: log}, nil
}

// Change is what applying one object would do.
type Change struct {
	Object string
	Action string // created, configured, unchanged
	obj    *unstructured.Unstructured
	// specChanged says a configured object's spec changes (not only its
	// labels or annotations).
	specChanged bool
}

// Plan diffs objects against the cluster with server-side dry runs and
// returns the objects that would change. Objects that do not exist (and
// those whose CRD is not installed yet) count as created without a dry
// run: one list of each kind's names tells them apart first, so a first
// install asks a few lists instead of a dry run per object.
func (c *Client) Plan(ctx context.Context, objs []*unstructured.Unstructured) ([]Change, error) {
	absent := c.absent(ctx, objs)
	// The dry runs are independent reads: a few at a time, not one round
	// trip after another.
	changes := make([]*Change, len(objs))
	sem := make(chan struct{}, planConcurrency)
	var wg sync.WaitGroup
	for i, o := range objs {
		if absent[i] {
			changes[i] = &Change{Object: ssautil.FmtUnstructured(o), Action: string(ssa.CreatedAction), obj: o}
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			entry, live, merged, err := c.rm.Diff(ctx, o, ssa.DefaultDiffOptions())
			switch {
			case err != nil:
				// A custom resource whose CRD is not there yet cannot be dry-run.
				changes[i] = &Change{Object: ssautil.FmtUnstructured(o), Action: string(ssa.CreatedAction), obj: o}
			case entry.Action != ssa.UnchangedAction:
				changes[i] = &Change{Object: entry.Subject, Action: string(entry.Action), obj: o,
					specChanged: live == nil || merged == nil || !equality.Semantic.DeepEqual(live.Object["spec"], merged.Object["spec"])}
			}
		}()
	}
	wg.Wait()
	var out []Change
	for _, ch := range changes {
		if ch != nil {
			out = append(out, *ch)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Object < out[j].Object })
	return out, nil
}

// absent says, per object, whether it certainly does not exist: its kind
// is not served (a CRD not installed yet), or a metadata-only list of its
// kind in its namespace does not name it. Objects whose kind could not be
// listed count as present, and their dry run decides.
func (c *Client) absent(ctx context.Context, objs []*unstructured.Unstructured) []bool {
	type scope struct {
		gvk       schema.GroupVersionKind
		namespace string
	}
	byScope := map[scope][]int{}
	for i, o := range objs {
		k := scope{o.GroupVersionKind(), o.GetNamespace()}
		byScope[k] = append(byScope[k], i)
	}
	out := make([]bool, len(objs))
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(planConcurrency)
	for k, idx := range byScope {
		g.Go(func() error {
			list := &metav1.PartialObjectMetadataList{}
			list.SetGroupVersionKind(k.gvk.GroupVersion().WithKind(k.gvk.Kind + "List"))
			// A limit lets the API server answer from etcd while the
			// watch cache of a kind whose CRD was just created is still
			// filling, instead of holding the list until it is
			// (k8s.io/apiserver v0.36.1 pkg/storage/cacher/delegator.go
			// shouldDelegateListOnNotReadyCache, KEP-4568): about a
			// second for the sync objects in the lab's 1-node runs.
			opts := []client.ListOption{client.Limit(planListLimit)}
			if k.namespace != "" {
				opts = append(opts, client.InNamespace(k.namespace))
			}
			names := map[string]bool{}
			switch err := c.kube.List(gctx, list, opts...); {
			case meta.IsNoMatchError(err) || apierrors.IsNotFound(err):
			case err != nil:
				c.log.Debug().Err(err).Str("kind", k.gvk.Kind).Msg("listing for the plan failed; dry runs decide")
				return nil
			case list.Continue != "":
				// More than one page: the dry runs decide.
				return nil
			default:
				for _, m := range list.Items {
					names[m.Name] = true
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for _, i := range idx {
				out[i] = !names[objs[i].GetName()]
			}
			return nil
		})
	}
	_ = g.Wait() // every list's error is handled in place
	return out
}

// planListLimit is the page size of Plan's lists; a kind with more
// objects in the namespace is planned by dry runs.
const planListLimit = 500

// planConcurrency bounds the dry runs of Plan in flight at once.
const planConcurrency = 8

// Apply plans objects, applies those that change (ApplyChanges) and waits
// until they are current (WaitApplied). It returns what changed.
func (c *Client) Apply(ctx context.Context, objs []*unstructured.Unstructured, timeout time.Duration) ([]Change, error) {
	changes, err := c.Plan(ctx, objs)
	if err != nil {
		return nil, err
	}
	set, err := c.ApplyChanges(ctx, changes, timeout)
	if err != nil {
		return changes, err
	}
	return changes, c.WaitApplied(ctx, set, timeout)
}

// ApplyChanges applies, with server-side apply as the client's field
// manager (forcing ownership, as ssa does), the objects a Plan found
// changed, and only those: the plan's dry runs already told them apart, so
// they are not asked again as ssa's ApplyAll would. It stages them as ssa's
// ApplyAllStaged does (fluxcd/pkg/ssa v0.76.2 manager_apply.go): CRDs,
// namespaces and cluster roles first, then the objects that need them, in
// parallel. Unlike ApplyAllStaged it waits only where an object needs it:
// a custom resource goes once the CRD of its kind that this apply creates
// or changes is established, everything else at once. The rest is applied,
// not waited for: it returns the applied objects for WaitApplied.
func (c *Client) ApplyChanges(ctx context.Context, changes []Change, timeout time.Duration) (object.ObjMetadataSet, error) {
	return c.ApplyChangesStaged(ctx, changes, timeout, DefinedKinds{})
}

// DefinedKinds asks ApplyChangesStaged to call Then as soon as objects of
// Kinds can be applied: once the CRDs of those kinds that the apply creates
// or changes are established, and the namespaces it creates exist. What
// needs only those kinds and namespaces (the custom resources of another
// apply) then goes beside the rest of this one; when the apply neither
// creates nor changes those definitions, Then is called at once.
type DefinedKinds struct {
	Kinds []schema.GroupKind
	// Then's changed says the apply created or changed the spec of a CRD
	// of Kinds: what was planned against the CRD before (a dry run
	// prunes by its schema) is planned again.
	Then func(changed bool)
}

// ApplyChangesStaged is ApplyChanges telling notify when its kinds are
// defined.
func (c *Client) ApplyChangesStaged(ctx context.Context, changes []Change, timeout time.Duration, notify DefinedKinds) (object.ObjMetadataSet, error) {
	var defs, rest []*unstructured.Unstructured
	// The CRDs this apply creates or changes the spec of, by the kind they
	// define: objects of those kinds wait until they are established. A
	// CRD whose update changes no spec stays established (the API server
	// ignores the update, definitionsOneByOne); namespaces are active and
	// cluster roles in force as soon as their apply answers.
	pending := map[schema.GroupKind]object.ObjMetadata{}
	// The definitions notify's kinds wait for: their pending CRDs and the
	// namespaces this apply creates. A namespace that exists already (an
	// update of its labels) and a CRD whose spec stays serve their objects
	// before their own apply answers.
	notifyKinds := map[schema.GroupKind]bool{}
	for _, gk := range notify.Kinds {
		notifyKinds[gk] = true
	}
	gate := map[*unstructured.Unstructured]bool{}
	var notified object.ObjMetadataSet
	for _, ch := range changes {
		if ch.obj == nil {
			return nil, fmt.Errorf("%s: not a change from Plan", ch.Object)
		}
		if !ssautil.IsClusterDefinition(ch.obj) {
			rest = append(rest, ch.obj)
			continue
		}
		defs = append(defs, ch.obj)
		if !ch.holds() {
			continue
		}
		if gk, ok := definedKind(ch.obj); ok {
			pending[gk] = object.UnstructuredToObjMetadata(ch.obj)
			if notifyKinds[gk] {
				gate[ch.obj] = true
				notified = notified.Union(object.ObjMetadataSet{pending[gk]})
			}
		} else {
			gate[ch.obj] = true
		}
	}
	limit := applyConcurrency
	if definitionsOneByOne(changes) {
		limit = 1
	}
	g, gctx := errgroup.WithContext(ctx)
	var applied func(*unstructured.Unstructured)
	if notify.Then != nil {
		// Then goes from its own goroutine as soon as its definitions
		// are applied and established, beside the rest of the first
		// stage (in the lab's runs, ten CRDs that take a tenth of a
		// second to apply).
		var mu sync.Mutex
		gateDone := make(chan struct{})
		if len(gate) == 0 {
			close(gateDone)
		}
		applied = func(o *unstructured.Unstructured) {
			mu.Lock()
			defer mu.Unlock()
			if gate[o] {
				delete(gate, o)
				if len(gate) == 0 {
					close(gateDone)
				}
			}
		}
		g.Go(func() error {
			select {
			case <-gateDone:
			case <-gctx.Done():
				return gctx.Err()
			}
			if err := c.waitDefined(gctx, notified, timeout); err != nil {
				return err
			}
			notify.Then(len(notified) > 0)
			return nil
		})
	}
	var set, appliedNow, appliedLater object.ObjMetadataSet
	g.Go(func() error {
		var err error
		set, err = c.applyParallel(gctx, defs, limit, applied)
		if err != nil {
			return err
		}
		var now, later []*unstructured.Unstructured
		var needed object.ObjMetadataSet
		for _, o := range rest {
			if crd, ok := pending[o.GroupVersionKind().GroupKind()]; ok {
				later = append(later, o)
				needed = needed.Union(object.ObjMetadataSet{crd})
			} else {
				now = append(now, o)
			}
		}
		g.Go(func() (err error) {
			appliedNow, err = c.applyParallel(gctx, now, applyConcurrency, nil)
			return err
		})
		if err := c.waitDefined(gctx, needed, timeout); err != nil {
			return err
		}
		appliedLater, err = c.applyParallel(gctx, later, applyConcurrency, nil)
		return err
	})
	err := g.Wait()
	return append(append(set, appliedNow...), appliedLater...), err
}

// holds says applying ch keeps what needs it waiting: a CRD it creates or
// whose spec it changes (not established, or its storage rebuilt, until
// then), a namespace it creates. A CRD whose update changes no spec stays
// established (definitionsOneByOne), and a namespace that exists already
// is active before its update answers.
func (ch Change) holds() bool {
	created := ch.Action == string(ssa.CreatedAction)
	switch ch.obj.GetKind() {
	case "CustomResourceDefinition":
		return created || ch.specChanged
	case "Namespace":
		return created
	}
	return false
}

// definedKind is the kind a CRD defines.
func definedKind(o *unstructured.Unstructured) (schema.GroupKind, bool) {
	if o.GetKind() != "CustomResourceDefinition" {
		return schema.GroupKind{}, false
	}
	group, _, _ := unstructured.NestedString(o.Object, "spec", "group")
	kind, _, _ := unstructured.NestedString(o.Object, "spec", "names", "kind")
	return schema.GroupKind{Group: group, Kind: kind}, true
}

// PlanDefinedFirst is Plan for an apply whose notify.Kinds another apply
// waits for. The objects they need from it (the CRDs of those kinds, and
// the namespaces) are planned first; when none of them would be created
// or have its spec changed, those kinds already serve, so Then(false) is
// called at once, before the rest is planned (in the lab's runs, the dry
// runs of ten CRDs, a sixth of a second), and the DefinedKinds returned
// for the apply is empty. Otherwise the apply calls Then
// (ApplyChangesStaged) and notify is returned as it came.
func (c *Client) PlanDefinedFirst(ctx context.Context, objs []*unstructured.Unstructured, notify DefinedKinds) ([]Change, DefinedKinds, error) {
	if notify.Then == nil {
		changes, err := c.Plan(ctx, objs)
		return changes, notify, err
	}
	kinds := map[schema.GroupKind]bool{}
	for _, gk := range notify.Kinds {
		kinds[gk] = true
	}
	var needed, rest []*unstructured.Unstructured
	for _, o := range objs {
		gk, isCRD := definedKind(o)
		if o.GetKind() == "Namespace" || isCRD && kinds[gk] {
			needed = append(needed, o)
		} else {
			rest = append(rest, o)
		}
	}
	first, err := c.Plan(ctx, needed)
	if err != nil {
		return nil, notify, err
	}
	if !slices.ContainsFunc(first, Change.holds) {
		notify.Then(false)
		notify = DefinedKinds{}
	}
	later, err := c.Plan(ctx, rest)
	if err != nil {
		return nil, notify, err
	}
	changes := append(first, later...)
	sort.Slice(changes, func(i, j int) bool { return changes[i].Object < changes[j].Object })
	return changes, notify, nil
}

// waitDefined waits until the CRDs in crds are established.
func (c *Client) waitDefined(ctx context.Context, crds object.ObjMetadataSet, timeout time.Duration) error {
	if len(crds) == 0 {
		return nil
	}
	if err := c.waitSet(ctx, crds, stagePoll, timeout); err != nil {
		return fmt.Errorf("waiting for %d CRD(s) to be established: %w", len(crds), err)
	}
	return nil
}

// definitionsOneByOne says the first stage of changes goes one object
// after another, as ssa and the flux CLI apply it: when a CRD's spec
// changes, the API server rebuilds its storage while the controllers that
// serve it may be listing. An update that leaves the spec alone (labels,
// annotations) does not touch the storage (k8s.io/apiextensions-apiserver
// v0.37.0 pkg/apiserver/customresource_handler.go
// updateCustomResourceDefinition ignores an update that changes neither
// spec nor accepted names), and CRDs that are all new have no controller
// yet (their Deployments come in the next stage): those go at once.
func definitionsOneByOne(changes []Change) bool {
	for _, ch := range changes {
		if ch.obj != nil && ch.obj.GetKind() == "CustomResourceDefinition" && ch.Action != string(ssa.CreatedAction) && ch.specChanged {
			return true
		}
	}
	return false
}

// applyParallel applies objs with server-side apply, limit at a time,
// telling applied (when not nil) of each object whose apply answered.
func (c *Client) applyParallel(ctx context.Context, objs []*unstructured.Unstructured, limit int, applied func(*unstructured.Unstructured)) (object.ObjMetadataSet, error) {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(limit)
	set := make(object.ObjMetadataSet, len(objs))
	for i, o := range objs {
		g.Go(func() error {
			live := o.DeepCopy()
			if err := c.kube.Patch(gctx, live, client.Apply, client.ForceOwnership, client.FieldOwner(c.owner.Field)); err != nil {
				return fmt.Errorf("applying %s: %w", ssautil.FmtUnstructured(o), err)
			}
			c.log.Debug().Str("object", ssautil.FmtUnstructured(o)).Msg("applied")
			set[i] = object.UnstructuredToObjMetadata(live)
			if applied != nil {
				applied(o)
			}
			return nil
		})
	}
	return set, g.Wait()
}

// WaitApplied waits until every applied object is current (kstatus:
// Deployments rolled out, CRDs established, custom resources Ready).
func (c *Client) WaitApplied(ctx context.Context, set object.ObjMetadataSet, timeout time.Duration) error {
	set = withStatus(set)
	if len(set) == 0 {
		return nil
	}
	if err := c.waitSet(ctx, set, 250*time.Millisecond, timeout); err != nil {
		return fmt.Errorf("waiting for %d object(s) to become ready: %w", len(set), err)
	}
	return nil
}

// waitSet waits with ssa, polling every interval, until every object in
// set is current. ssa names the objects that are not when its time runs
// out, but only once its context says so (fluxcd/pkg/ssa v0.76.2
// manager_wait.go WaitForSetWithContext): a poll that starts as the
// deadline falls fails first in client-go's rate limiter ("would exceed
// context deadline"), and ssa returns that error alone. An error in the
// wait's last interval is therefore reported as the timeout it is, with
// the objects read once more and the error kept.
func (c *Client) waitSet(ctx context.Context, set object.ObjMetadataSet, interval, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := c.rm.WaitForSetWithContext(wctx, set, ssa.WaitOptions{Interval: interval, Timeout: timeout})
	if err == nil || ctx.Err() != nil || time.Until(deadline) > interval || strings.HasPrefix(err.Error(), ssaTimeout) {
		return err
	}
	rctx, rcancel := context.WithTimeout(ctx, readBackTimeout)
	defer rcancel()
	return fmt.Errorf("%s: [%s] (the last poll: %w)", ssaTimeout, strings.Join(c.notCurrent(rctx, set), ", "), err)
}

// ssaTimeout begins ssa's own timeout error.
const ssaTimeout = "timeout waiting for"

// readBackTimeout bounds the reads that name what a timed-out wait saw.
const readBackTimeout = 10 * time.Second

// notCurrent describes, as ssa does, each object of set that kstatus does
// not read as Current now.
func (c *Client) notCurrent(ctx context.Context, set object.ObjMetadataSet) []string {
	var out []string
	for _, id := range set {
		st, msg := string(status.UnknownStatus), ""
		if m, err := c.kube.RESTMapper().RESTMapping(id.GroupKind); err != nil {
			msg = err.Error()
		} else {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(m.GroupVersionKind)
			switch err := c.kube.Get(ctx, client.ObjectKey{Namespace: id.Namespace, Name: id.Name}, u); {
			case apierrors.IsNotFound(err):
				st = string(status.NotFoundStatus)
			case err != nil:
				msg = err.Error()
			default:
				if res, err := status.Compute(u); err != nil {
					msg = err.Error()
				} else {
					st, msg = string(res.Status), res.Message
				}
			}
		}
		if st == string(status.CurrentStatus) {
			continue
		}
		d := fmt.Sprintf("%s status: '%s'", ssautil.FmtObjMetadata(id), st)
		if msg != "" {
			d += ": " + msg
		}
		out = append(out, d)
	}
	return out
}

// withStatus leaves out of set the kinds that have no status to wait for:
// kstatus (fluxcd/cli-utils v1.2.3 pkg/kstatus/status generic.go) reads
// them Current as soon as they exist and are not being deleted, which
// their apply has just shown. Each kind left in costs a list per poll of
// the install's wait, which runs beside the sync's on the same client.
func withStatus(set object.ObjMetadataSet) object.ObjMetadataSet {
	var out object.ObjMetadataSet
	for _, m := range set {
		if !statusless[m.GroupKind] {
			out = append(out, m)
		}
	}
	return out
}

// statusless are the kinds without status conditions or an observed
// generation among those the Flux install and Talos' bootstrap manifests
// apply.
var statusless = map[schema.GroupKind]bool{
	{Kind: "ServiceAccount"}: true,
	{Kind: "ConfigMap"}:      true,
	{Kind: "Secret"}:         true,
	{Kind: "ResourceQuota"}:  true,
	{Group: "rbac.authorization.k8s.io", Kind: "ClusterRole"}:        true,
	{Group: "rbac.authorization.k8s.io", Kind: "ClusterRoleBinding"}: true,
	{Group: "rbac.authorization.k8s.io", Kind: "Role"}:               true,
	{Group: "rbac.authorization.k8s.io", Kind: "RoleBinding"}:        true,
	{Group: "networking.k8s.io", Kind: "NetworkPolicy"}:              true,
}

// stagePoll spaces the polls of the wait for a stage's CRDs and namespaces.
const stagePoll = 100 * time.Millisecond

// applyConcurrency is how many objects of a stage are applied at once
// (kustomize-controller v1.9.5 applies 4 at once, its --concurrent-ssa
// default; this client serves one run, not a cluster's worth of
// Kustomizations).
const applyConcurrency = planConcurrency
