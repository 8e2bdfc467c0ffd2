package stages

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/Masterminds/semver/v3"
	"github.com/fluxcd/cli-utils/pkg/object"
	"github.com/fluxcd/pkg/ssa"
	ssautil "github.com/fluxcd/pkg/ssa/utils"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/flux"
	"github.com/homelab/bootstrap/talos"
)

// kubeUpgrade carries what the talos stage learnt about the Kubernetes
// versions before converging, for the upgrade after it.
type kubeUpgrade struct {
	// rendered are the nodes' configs as rendered for
	// cluster.kubernetesVersion, by node name; the targets the converge
	// applies carry them with the Kubernetes images pinned to what each
	// node is configured with.
	rendered map[string][]byte
	// configured are the versions each configured node's applied config
	// names.
	configured talos.KubeVersions
	// order is which of Talos and Kubernetes moves first (upgradeInOrder).
	order talos.UpgradeOrder
	// apiServerVersion is what the API server answers once a rollout
	// moved it ("" when none did): the converge read it before.
	apiServerVersion string
}

// pinKubernetes keeps the converge from moving Kubernetes: every node that
// runs a config gets its rendered config with the Kubernetes images it is
// configured with, so only the rollout after the converge moves them, one
// component and one node at a time (applying a bumped
// cluster.kubernetesVersion to every node at once would restart every API
// server together and run kubelets newer than the API server). A downgrade,
// a skipped minor or a pair Talos does not support is refused here, from
// what the nodes are configured with, before anything is applied; one the
// state already records is refused without any call (ops nil).
func pinKubernetes(ctx context.Context, env *Env, ops *talos.Ops, probes map[string]talos.Probe, targets []talos.Target) (*kubeUpgrade, error) {
	want := env.Config.Cluster.KubernetesVersion
	ku := &kubeUpgrade{rendered: map[string][]byte{}, configured: talos.KubeVersions{}}
	var known []talos.Target
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	asked := make([]bool, len(targets))
	for i, t := range targets {
		ku.rendered[t.Name] = t.Config
		if ops == nil {
			if v := env.State.Outputs.Nodes[t.Name].KubernetesVersion; v != "" {
				known = append(known, t)
				ku.configured[t.Name] = map[string]string{}
				for _, c := range talos.ComponentsOf(t.Role) {
					ku.configured[t.Name][c] = v
				}
			}
			continue
		}
		if p, ok := probes[t.Name]; !ok || p.Mode != talos.ModeConfigured {
			continue
		}
		// Each node's images at once; each writes only its own target.
		g.Go(func() error {
			images, err := ops.KubeImages(gctx, t)
			if err != nil {
				return err
			}
			pinned, err := talos.PinKubeImages(t.Config, images)
			if err != nil {
				return fmt.Errorf("pinning the Kubernetes images of %s: %w", t, err)
			}
			targets[i].Config = pinned
			asked[i] = true
			mu.Lock()
			defer mu.Unlock()
			ku.configured[t.Name] = images
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for i, t := range targets {
		if asked[i] {
			t.Config = ku.rendered[t.Name] // as rendered, in config order
			known = append(known, t)
		}
	}
	if ops != nil {
		if err := pinNewNodes(env, targets, ku, want); err != nil {
			return nil, err
		}
	}
	_, err := talos.PlanKubernetes(known, ku.configured, nil, want, env.Options.AllowDowngrade)
	var planErr *talos.PlanError
	if errors.As(err, &planErr) {
		return nil, config.Userf("%s", planErr.Reason)
	}
	return ku, nil
}

// pinNewNodes keeps a node that has no config yet (a new node, or one
// re-created) at the Kubernetes the control planes are configured with
// while an upgrade is pending: installed at cluster.kubernetesVersion its
// kubelet would be newer than the API servers, which Kubernetes' version
// skew policy forbids (a kubelet must not be newer than kube-apiserver).
// It installs at the control planes' version and moves with the other
// nodes in the rollout.
func pinNewNodes(env *Env, targets []talos.Target, ku *kubeUpgrade, want string) error {
	var cpVersion *semver.Version
	cp := ""
	for name, images := range ku.configured {
		v := images[talos.KubeAPIServer]
		sv, err := semver.NewVersion(strings.TrimPrefix(v, "v"))
		if v == "" || err != nil {
			continue
		}
		if cpVersion == nil || sv.LessThan(cpVersion) {
			cpVersion, cp = sv, name
		}
	}
	wv, err := semver.NewVersion(strings.TrimPrefix(want, "v"))
	if cpVersion == nil || err != nil || !cpVersion.LessThan(wv) {
		return nil
	}
	for i, t := range targets {
		if _, ok := ku.configured[t.Name]; ok {
			continue
		}
		versions := map[string]string{}
		for _, c := range talos.ComponentsOf(t.Role) {
			versions[c] = cpVersion.String()
		}
		pinned, err := talos.PinKubeImages(t.Config, versions)
		if err != nil {
			return fmt.Errorf("pinning the Kubernetes images of %s: %w", t, err)
		}
		targets[i].Config = pinned
		ku.configured[t.Name] = versions
		env.Log.Info().Str("node", t.Name).Msgf("%s installs at Kubernetes %s, the version %s's API server is configured with, and moves to %s with the others", t.Name, cpVersion, cp, want)
	}
	return nil
}

// upgradeKubernetes moves every node to cluster.kubernetesVersion after the
// converge and the Talos rollout, as talosctl upgrade-k8s does: the plan
// comes from what the components run (static pod statuses, Nodes' kubelet
// versions), an etcd snapshot is taken first, then each step moves one
// component on one node and waits for it (talos.RollOutKubernetes).
func upgradeKubernetes(ctx context.Context, env *Env, ops *talos.Ops, ku *kubeUpgrade, targets []talos.Target) error {
	want := strings.TrimPrefix(env.Config.Cluster.KubernetesVersion, "v")
	var nodes []talos.Target
	for _, t := range targets {
		if _, ok := ku.configured[t.Name]; ok {
			nodes = append(nodes, t)
		}
	}
	if len(nodes) == 0 {
		// A new cluster installs at cluster.kubernetesVersion.
		recordKubernetesVersion(env, targets, want)
		return nil
	}
	kc, restCfg, err := kubeClient(env)
	if err != nil {
		if env.DryRun {
			return nil
		}
		return fmt.Errorf("reading the Kubernetes versions the nodes run: %w", err)
	}
	running := ops.KubeRunning(ctx, nodes, kc)
	talosVersions := map[string]string{}
	for _, t := range nodes {
		if p, err := ops.Probe(ctx, t.IP); err == nil && p.Mode == talos.ModeConfigured {
			talosVersions[t.Name] = p.Version
			if env.DryRun && ku.order == talos.TalosFirst {
				// The Talos rollout runs first and stops the run when it
				// cannot finish: by the time Kubernetes moves, every node
				// runs the configured Talos. A dry run has not rolled it
				// out, so its plan is judged against that version, not
				// the one the node runs now.
				talosVersions[t.Name] = env.Config.Cluster.TalosVersion
			}
		}
	}
	plan, err := talos.PlanKubernetes(nodes, running, talosVersions, want, env.Options.AllowDowngrade)
	var planErr *talos.PlanError
	if errors.As(err, &planErr) {
		return config.Userf("%s", planErr.Reason)
	}
	if err != nil {
		if env.DryRun {
			env.UI.Warn("Kubernetes upgrade not planned: %v", err)
			return nil
		}
		return err
	}
	if len(plan.Steps) == 0 {
		// Whatever the control planes render now reaches the cluster on
		// every run, not only with a new version: Talos'
		// ManifestApplyController only creates missing objects and never
		// updates or deletes one (manifest_apply.go at v1.13.3), so a
		// patch to what they render (cluster.proxy.disabled, CoreDNS,
		// flannel, inline or extra manifests) would reach the machine
		// configs and not the cluster; Talos' v1.13.0 release notes tell
		// users to sync the bootstrap manifests after such a patch
		// (hack/release.toml notes.network-policy), which is what
		// talosctl upgrade-k8s does at the running version. The sync is a
		// no-op when the cluster matches (nothing listed, nothing
		// written); a dry run lists it. It also finishes the sync of a
		// run killed between the rollout and the sync. A cluster with no
		// inventory yet is left alone: ManifestApplyController writes it
		// as it creates the objects (manifest_apply.go), so Talos has not
		// applied them yet and the sync would race its first apply.
		_, applied, err := talos.ReadInventory(ctx, kc)
		if err != nil {
			return err
		}
		if applied || env.State.Outputs.Talos.ManifestSync == want {
			if err := syncBootstrapManifests(ctx, env, ops, nodes, want); err != nil {
				return err
			}
		} else {
			env.Log.Debug().Msg("no bootstrap manifest inventory yet: Talos has not applied its manifests, nothing to sync")
		}
		recordKubernetesVersion(env, targets, want)
		return nil
	}
	if err := checkRemovedInUpgrade(ctx, restCfg, plan, ku); err != nil {
		return err
	}
	if env.DryRun {
		steps := append([]string{plan.Summary(), "pre-pull the " + want + " images on the nodes that run them", "take an etcd snapshot before upgrading Kubernetes"}, kubeStepNames(plan.Steps)...)
		sync := "sync the bootstrap manifests (kube-proxy, CoreDNS) the control planes render for " + want + ", as talosctl upgrade-k8s does"
		// What they no longer render is pruned: read now, from what the
		// control planes render today.
		if bs, err := planBootstrapSync(ctx, env, ops, nodes); err != nil {
			return err
		} else if bs != nil && len(bs.pruneNames) > 0 {
			sync += ", and prune what they no longer render: " + strings.Join(bs.pruneNames, ", ")
		}
		steps = append(steps, sync)
		for _, what := range steps {
			if err := env.Wet(what, nil); err != nil {
				return err
			}
		}
		return nil
	}
	env.UI.OK("%s", plan.Summary())
	if err := ops.PrePullKubernetes(ctx, plan, ku.rendered); err != nil {
		return err
	}
	if err := snapshotBeforeUpgrade(ctx, env, ops, "Kubernetes"); err != nil {
		return err
	}
	env.State.Outputs.Talos.ManifestSync = want
	if err := env.SaveState(); err != nil {
		return err
	}
	err = ops.RollOutKubernetes(ctx, talos.KubeRollOutOptions{
		Plan: plan, Configs: ku.rendered, Configured: ku.configured, Kube: kc,
		Health: upgradeHealth(env, targets), Mutate: env.Wet,
	})
	if err != nil {
		return err
	}
	if err := syncBootstrapManifests(ctx, env, ops, nodes, want); err != nil {
		return err
	}
	recordKubernetesVersion(env, targets, want)
	if v, err := kc.Discovery().ServerVersion(); err == nil {
		ku.apiServerVersion = v.GitVersion
	}
	env.UI.OK("Kubernetes %s on %d node(s)", want, len(nodes))
	return nil
}

// syncBootstrapManifests syncs the bootstrap manifests a control plane
// renders for the new version (kube-proxy's image follows Kubernetes) as
// talosctl upgrade-k8s ends (pkg/cluster/kubernetes/talos_managed.go
// PerformManifestsSync and syncManifestsSSA at v1.13.3, through
// go-kubernetes v0.2.37's SSA manager with the default inventory policy,
// AdoptIfNoInventory): every object carries the bootstrap inventory's
// annotation and is server-side applied as field manager "talos", the
// inventory ConfigMap then records them, and an object it recorded that
// no control plane renders any more (kube-proxy once the proxy is
// disabled) is deleted and forgotten; then the applied objects are waited
// for. Talos only creates missing objects, so without this kube-proxy
// stays at the version the cluster was created with, and a patch to what
// the control planes render never reaches the cluster: it runs after
// every Kubernetes upgrade and on every run without one. A dry run lists
// what would change and what would be pruned.
func syncBootstrapManifests(ctx context.Context, env *Env, ops *talos.Ops, nodes []talos.Target, want string) error {
	bs, err := planBootstrapSync(ctx, env, ops, nodes)
	if err != nil || bs == nil {
		return err
	}
	if len(bs.changes) == 0 && len(bs.prune) == 0 && sameRefs(bs.inventory, bs.final) {
		env.Log.Debug().Int("objects", len(bs.objs)).Msg("the bootstrap manifests and their inventory are in sync")
	} else {
		names := bs.changeNames()
		for _, p := range bs.pruneNames {
			names = append(names, p+" pruned")
		}
		what := fmt.Sprintf("sync the bootstrap manifests %s renders for Kubernetes %s: %d of %d object(s) change, %d pruned, inventory %s/%s updated",
			bs.cp.Name, want, len(bs.changes), len(bs.objs), len(bs.prune), constants.KubernetesInventoryNamespace, talos.BootstrapInventory)
		if len(names) > 0 {
			what += " (" + strings.Join(names, ", ") + ")"
		}
		wait, err := bootstrapPodsCanRun(ctx, env, bs.cs)
		if err != nil {
			return err
		}
		if err := env.Wet(what, func() error { return bs.apply(ctx, env.Config.Cluster.Timeouts.Health.D(), wait) }); err != nil {
			return fmt.Errorf("syncing the bootstrap manifests: %w", err)
		}
	}
	if env.State.Outputs.Talos.ManifestSync == "" {
		return nil
	}
	env.State.Outputs.Talos.ManifestSync = ""
	return env.SaveState()
}

// bootstrapSync is a planned sync of the bootstrap manifests.
type bootstrapSync struct {
	cp   talos.Target
	objs []*unstructured.Unstructured
	// changes are the objects a server-side apply changes.
	changes []flux.Change
	// prune are the live objects the inventory records that no control
	// plane renders any more, pruneNames the same as "Kind/ns/name".
	prune      []*unstructured.Unstructured
	pruneNames []string
	// inventory is what the inventory records now, applied with every
	// rendered object added, final what it records after the prune.
	inventory, applied, final object.ObjMetadataSet
	cl                        *flux.Client
	cs                        kubernetes.Interface
	live                      *liveObjects
}

// planBootstrapSync reads what a sync would do, changing nothing: the
// objects the first control plane renders, annotated for the inventory,
// which of them change, and what the inventory holds that none renders
// (to prune, if the inventory policy lets this inventory own it; one
// already gone is only forgotten). nil when there is no control plane.
func planBootstrapSync(ctx context.Context, env *Env, ops *talos.Ops, nodes []talos.Target) (*bootstrapSync, error) {
	i := slices.IndexFunc(nodes, func(t talos.Target) bool { return t.Role == talos.RoleControlPlane })
	if i < 0 {
		return nil, nil
	}
	bs := &bootstrapSync{cp: nodes[i]}
	var err error
	if bs.objs, err = ops.BootstrapManifests(ctx, bs.cp); err != nil {
		return nil, err
	}
	if err := talos.AnnotateForInventory(bs.objs); err != nil {
		return nil, err
	}
	cs, rc, err := kubeClient(env)
	if err != nil {
		return nil, err
	}
	bs.cs = cs
	if bs.inventory, _, err = talos.ReadInventory(ctx, cs); err != nil {
		return nil, err
	}
	if bs.live, err = newLiveObjects(rc); err != nil {
		return nil, err
	}
	for _, ref := range talos.PruneRefs(bs.inventory, bs.objs) {
		obj, err := bs.live.get(ctx, ref)
		if apierrors.IsNotFound(err) || meta.IsNoMatchError(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s %s/%s to prune it: %w", ref.GroupKind.Kind, ref.Namespace, ref.Name, err)
		}
		if err := talos.CheckInventoryPolicy(obj, talos.InventoryAdoptIfNoInventory); err != nil {
			return nil, err
		}
		bs.prune = append(bs.prune, obj)
		bs.pruneNames = append(bs.pruneNames, ssautil.FmtUnstructured(obj))
	}
	if bs.cl, err = flux.NewClientAs(rc, ssa.Owner{Field: constants.KubernetesFieldManagerName, Group: "talos.dev"}, env.Log); err != nil {
		return nil, err
	}
	if bs.changes, err = bs.cl.Plan(ctx, bs.objs); err != nil {
		return nil, err
	}
	// A changed object must be this inventory's to change.
	for _, c := range bs.changes {
		j := slices.IndexFunc(bs.objs, func(o *unstructured.Unstructured) bool { return ssautil.FmtUnstructured(o) == c.Object })
		if c.Action != string(ssa.ConfiguredAction) || j < 0 {
			continue
		}
		obj, err := bs.live.get(ctx, talos.ObjRef(bs.objs[j]))
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", c.Object, err)
		}
		if err := talos.CheckInventoryPolicy(obj, talos.InventoryAdoptIfNoInventory); err != nil {
			return nil, err
		}
	}
	bs.applied = slices.Clone(bs.inventory)
	for _, o := range bs.objs {
		if !bs.applied.Contains(talos.ObjRef(o)) {
			bs.applied = append(bs.applied, talos.ObjRef(o))
		}
	}
	bs.final = slices.DeleteFunc(slices.Clone(bs.applied), func(r object.ObjMetadata) bool {
		return !slices.ContainsFunc(bs.objs, func(o *unstructured.Unstructured) bool { return talos.ObjRef(o) == r })
	})
	return bs, nil
}

func (bs *bootstrapSync) changeNames() []string {
	var out []string
	for _, c := range bs.changes {
		out = append(out, c.Object+" "+c.Action)
	}
	return out
}

// apply carries out the sync: the changed objects applied, the inventory
// written with every rendered object (before anything is pruned, as the
// manager does), the pruned objects deleted and forgotten (one whose
// delete fails stays recorded for the next sync), then the applied
// objects waited for.
func (bs *bootstrapSync) apply(ctx context.Context, timeout time.Duration, wait bool) error {
	set, err := bs.cl.ApplyChanges(ctx, bs.changes, timeout)
	if err != nil {
		return err
	}
	if err := talos.WriteInventory(ctx, bs.cs, bs.applied); err != nil {
		return err
	}
	left := slices.Clone(bs.applied)
	var errs []error
	for _, o := range bs.prune {
		if err := bs.live.delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("pruning %s: %w", ssautil.FmtUnstructured(o), err))
			continue
		}
		left = slices.DeleteFunc(left, func(r object.ObjMetadata) bool { return r == talos.ObjRef(o) })
	}
	// What the inventory held that is gone already is forgotten too.
	left = slices.DeleteFunc(left, func(r object.ObjMetadata) bool {
		return !slices.ContainsFunc(bs.objs, func(o *unstructured.Unstructured) bool { return talos.ObjRef(o) == r }) &&
			!slices.ContainsFunc(bs.prune, func(o *unstructured.Unstructured) bool { return talos.ObjRef(o) == r })
	})
	if err := talos.WriteInventory(ctx, bs.cs, left); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if !wait {
		return nil
	}
	return bs.cl.WaitApplied(ctx, set, timeout)
}

// bootstrapPodsCanRun says whether the synced bootstrap manifests' pods
// can become ready now, so that the sync waits for them: CoreDNS needs
// the pod network. Talos deploys its CNI (flannel) with these manifests;
// a CNI the infra stage installs (cilium), or the user's (none), is not
// there on a cluster's first runs, when every node is NotReady, and
// waiting would only run into the health timeout. The sync applies all
// the same; the postcheck checks the pods once the network runs. This
// matters when Talos' own ManifestApplyController has not created the
// objects yet as the talos stage runs right after the bootstrap: the sync
// then creates them itself.
func bootstrapPodsCanRun(ctx context.Context, env *Env, cs kubernetes.Interface) (bool, error) {
	if env.Config.CNI.TalosDeploysCNI() || env.DryRun {
		return true, nil
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, fmt.Errorf("listing the nodes: %w", err)
	}
	for _, n := range nodes.Items {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
	}
	env.UI.OK("the bootstrap manifests' pods (CoreDNS) start once the pod network runs (cni.name %s; no node is Ready yet): not waited for here", env.Config.CNI.Name)
	return false, nil
}

// sameRefs reports whether a and b hold the same objects.
func sameRefs(a, b object.ObjMetadataSet) bool {
	return len(a) == len(b) && len(a.Diff(b)) == 0 && len(b.Diff(a)) == 0
}

// liveObjects reads and deletes objects by their inventory reference.
type liveObjects struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newLiveObjects(rc *rest.Config) (*liveObjects, error) {
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &liveObjects{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}, nil
}

func (l *liveObjects) resource(ref object.ObjMetadata) (dynamic.ResourceInterface, error) {
	m, err := l.mapper.RESTMapping(ref.GroupKind)
	if err != nil {
		return nil, err
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return l.dyn.Resource(m.Resource).Namespace(ref.Namespace), nil
	}
	return l.dyn.Resource(m.Resource), nil
}

func (l *liveObjects) get(ctx context.Context, ref object.ObjMetadata) (*unstructured.Unstructured, error) {
	r, err := l.resource(ref)
	if err != nil {
		return nil, err
	}
	return r.Get(ctx, ref.Name, metav1.GetOptions{})
}

// delete deletes o with background propagation, as the manager prunes.
func (l *liveObjects) delete(ctx context.Context, o *unstructured.Unstructured) error {
	r, err := l.resource(talos.ObjRef(o))
	if err != nil {
		return err
	}
	bg := metav1.DeletePropagationBackground
	return r.Delete(ctx, o.GetName(), metav1.DeleteOptions{PropagationPolicy: &bg})
}

// checkRemovedInUpgrade refuses an upgrade that would lose objects or
// break a component: objects stored in an API version the target removes,
// and feature gates the target no longer knows in the rendered configs.
func checkRemovedInUpgrade(ctx context.Context, restCfg *rest.Config, plan *talos.KubePlan, ku *kubeUpgrade) error {
	removed := talos.RemovedIn(plan.From, plan.To)
	if err := removed.CheckConfigs(ku.rendered); err != nil {
		return config.Userf("%v", err)
	}
	dyn, err := dynamic.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	found, err := removed.FindObjects(ctx, dyn)
	if err != nil {
		return err
	}
	if found != "" {
		return config.Userf("%s; migrate them to a served API version before upgrading Kubernetes to %s", found, plan.To)
	}
	return nil
}

// recordKubernetesVersion keeps the version every node was taken to, for a
// later run to refuse a downgrade without a call.
func recordKubernetesVersion(env *Env, targets []talos.Target, version string) {
	if env.DryRun {
		return
	}
	for _, t := range targets {
		n := env.Node(t.Name)
		n.KubernetesVersion = version
		env.SetNode(n)
	}
	if err := env.SaveState(); err != nil {
		env.Log.Warn().Err(err).Msg("saving state after the Kubernetes upgrade")
	}
}

func kubeStepNames(steps []talos.KubeStep) []string {
	out := make([]string, 0, len(steps))
	for _, s := range steps {
		out = append(out, s.String())
	}
	return out
}
