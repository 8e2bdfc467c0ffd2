package talos

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"
	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/compatibility"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/configpatcher"
	"github.com/siderolabs/talos/pkg/machinery/config/encoder"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/stdpatches"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/kube"
)

// The Kubernetes components a Kubernetes upgrade moves, in the order
// talosctl upgrade-k8s moves them (pkg/cluster/kubernetes/talos_managed.go
// Upgrade at v1.13.3): each static pod over every control plane, one node
// at a time, then the kubelet of every node, control planes first.
const (
	KubeAPIServer         = "kube-apiserver"
	KubeControllerManager = "kube-controller-manager"
	KubeScheduler         = "kube-scheduler"
	Kubelet               = "kubelet"
)

// StaticPodComponents are the control plane's static pods, in upgrade order.
var StaticPodComponents = []string{KubeAPIServer, KubeControllerManager, KubeScheduler}

// ComponentsOf lists the components a node of role runs.
func ComponentsOf(role Role) []string {
	if role == RoleControlPlane {
		return append(append([]string(nil), StaticPodComponents...), Kubelet)
	}
	return []string{Kubelet}
}

// KubeVersions are Kubernetes versions by node name and component, without
// a leading "v" ("1.36.1").
type KubeVersions map[string]map[string]string

func (k KubeVersions) set(node, component, version string) {
	if k[node] == nil {
		k[node] = map[string]string{}
	}
	k[node][component] = strings.TrimPrefix(version, "v")
}

func (k KubeVersions) clone() KubeVersions {
	out := KubeVersions{}
	for n, m := range k {
		out[n] = maps.Clone(m)
	}
	return out
}

// KubeStep is one component's upgrade on one node.
type KubeStep struct {
	Target
	Component string
	From, To  string
	// Pos and Of place the step in the rollout, for the user.
	Pos, Of int
}

// String is the step as the user reads it in a plan.
func (s KubeStep) String() string {
	return fmt.Sprintf("upgrade %s on %s %s → %s (%d/%d)", s.Component, s.Name, s.From, s.To, s.Pos, s.Of)
}

// KubePlan is a Kubernetes upgrade: its steps in order.
type KubePlan struct {
	From, To string
	Steps    []KubeStep
}

// Summary says in one line what the plan does: "upgrade Kubernetes 1.35.4
// → 1.36.1: kube-apiserver, kube-controller-manager, kube-scheduler on 3
// node(s), kubelet on 5".
func (p *KubePlan) Summary() string {
	var static, kubelet int
	seen := map[string]bool{}
	for _, s := range p.Steps {
		if s.Component == Kubelet {
			kubelet++
		} else if !seen[s.Name] {
			seen[s.Name] = true
			static++
		}
	}
	var parts []string
	if static > 0 {
		parts = append(parts, fmt.Sprintf("%s on %d node(s)", strings.Join(StaticPodComponents, ", "), static))
	}
	if kubelet > 0 {
		parts = append(parts, fmt.Sprintf("kubelet on %d", kubelet))
	}
	return fmt.Sprintf("upgrade Kubernetes %s → %s: %s", p.From, p.To, strings.Join(parts, ", "))
}

// PlanKubernetes compares the Kubernetes versions the nodes run (running,
// by node and component) with want and returns the steps in upgrade-k8s'
// order. It refuses, with a *PlanError and before any call:
//   - a downgrade, unless allowDowngrade;
//   - a change of more than one minor version: Kubernetes' version skew
//     policy lets a control plane move one minor at a time, and upgrade-k8s
//     only knows paths within a minor or to the next
//     (siderolabs/go-kubernetes kubernetes/upgrade/path.go IsSupported at
//     v0.2.37, the version talos v1.13.3 uses);
//   - a version a node's Talos does not support (machinery's compatibility
//     matrix, as upgrade-k8s' VerifyVersionCompatibility), with talos the
//     Talos version by node name (a node not in it is not checked).
//
// A component whose version is unknown is an error: a rollout must know
// where every node stands.
func PlanKubernetes(nodes []Target, running KubeVersions, talos map[string]string, want string, allowDowngrade bool) (*KubePlan, error) {
	want = strings.TrimPrefix(want, "v")
	wv, err := semver.StrictNewVersion(want)
	if err != nil {
		return nil, &PlanError{Reason: fmt.Sprintf("cluster.kubernetesVersion %q is not a version", want)}
	}
	kv, err := compatibility.ParseKubernetesVersion(want)
	if err != nil {
		return nil, &PlanError{Reason: fmt.Sprintf("cluster.kubernetesVersion %q: %v", want, err)}
	}
	for _, n := range nodes {
		tv, ok := talos[n.Name]
		if !ok {
			continue
		}
		parsed, err := compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: tv})
		if err != nil {
			return nil, fmt.Errorf("%s runs Talos %q, which is not a version: %w", n, tv, err)
		}
		if err := kv.SupportedWith(parsed); err != nil {
			return nil, &PlanError{Reason: fmt.Sprintf("Kubernetes %s on %s: %v; upgrade Talos first (cluster.talosVersion)", want, n, err)}
		}
	}
	plan := &KubePlan{To: want}
	var lowest *semver.Version
	byComponent := map[string][]KubeStep{}
	for _, n := range nodes {
		for _, comp := range ComponentsOf(n.Role) {
			from := running[n.Name][comp]
			if from == "" {
				return nil, fmt.Errorf("the %s version on %s is unknown (it does not report one): cannot plan a Kubernetes upgrade", comp, n)
			}
			fv, err := semver.NewVersion(from)
			if err != nil {
				return nil, fmt.Errorf("%s on %s reports version %q, which is not a version", comp, n, from)
			}
			if lowest == nil || fv.LessThan(lowest) {
				lowest = fv
			}
			c := fv.Compare(wv)
			if c == 0 {
				continue
			}
			if c > 0 && !allowDowngrade {
				return nil, &PlanError{Downgrade: true, Reason: fmt.Sprintf("%s on %s runs Kubernetes %s, newer than cluster.kubernetesVersion %s: a downgrade is refused; set cluster.kubernetesVersion to %s, or pass --allow-downgrade if you mean it", comp, n, from, want, from)}
			}
			if c > 0 && (fv.Major() != wv.Major() || fv.Minor() != wv.Minor()) {
				// upgrade-k8s knows only paths within a minor and to the
				// next one (go-kubernetes v0.2.37 upgrade/path.go
				// IsSupported): a minor downgrade is no path, whatever
				// the flag says.
				return nil, &PlanError{Downgrade: true, Reason: fmt.Sprintf("%s on %s runs Kubernetes %s: going back to %s is a minor downgrade, which neither Kubernetes nor talosctl upgrade-k8s supports, even with --allow-downgrade; set cluster.kubernetesVersion to a %d.%d release, or restore the etcd snapshot taken before the upgrade (bootstrap restore)", comp, n, from, want, fv.Major(), fv.Minor())}
			}
			if fv.Major() != wv.Major() || absDiff(fv.Minor(), wv.Minor()) > 1 {
				return nil, &PlanError{Reason: fmt.Sprintf("%s on %s runs Kubernetes %s: going to %s skips a minor version; Kubernetes moves one minor at a time, so set cluster.kubernetesVersion to a 1.%d release first", comp, n, from, want, nextMinor(fv, wv))}
			}
			byComponent[comp] = append(byComponent[comp], KubeStep{Target: n, Component: comp, From: from, To: want})
		}
	}
	if lowest != nil {
		plan.From = lowest.String()
	}
	// Control planes before workers for the kubelet too (nodes come in
	// config order, which need not list control planes first).
	kubelets := byComponent[Kubelet]
	var cpKubelets, wkKubelets []KubeStep
	for _, s := range kubelets {
		if s.Role == RoleControlPlane {
			cpKubelets = append(cpKubelets, s)
		} else {
			wkKubelets = append(wkKubelets, s)
		}
	}
	for _, comp := range StaticPodComponents {
		plan.Steps = append(plan.Steps, byComponent[comp]...)
	}
	plan.Steps = append(append(plan.Steps, cpKubelets...), wkKubelets...)
	for i := range plan.Steps {
		plan.Steps[i].Pos, plan.Steps[i].Of = i+1, len(plan.Steps)
	}
	return plan, nil
}

func absDiff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

// nextMinor is the minor one step from f towards w.
func nextMinor(f, w *semver.Version) uint64 {
	if w.Minor() > f.Minor() {
		return f.Minor() + 1
	}
	return f.Minor() - 1
}

// imageVersion is the tag of an image reference without its "v" and its
// kubelet variant ("1.36.1" of "registry.k8s.io/kube-apiserver:v1.36.1"
// and of "ghcr.io/siderolabs/kubelet:v1.36.1-fat"); "" without a tag.
func imageVersion(image string) string {
	image, _, _ = strings.Cut(image, "@")
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		return ""
	}
	tag := image[i+1:]
	return strings.TrimPrefix(strings.TrimSuffix(tag, imageVariant(tag)), "v")
}

// imageVariant is the kubelet image variant a tag ends with, "-fat" or
// "-slim", which upgrade-k8s keeps across versions
// (pkg/cluster/kubernetes/kubelet.go extractKubeletVersionSuffix at
// v1.13.3); "" for none.
func imageVariant(tag string) string {
	for _, v := range []string{"-fat", "-slim"} {
		if strings.HasSuffix(tag, v) {
			return v
		}
	}
	return ""
}

// withTag returns image with its tag replaced by "v"+version, keeping a
// kubelet variant suffix the old tag had.
func withTag(image, version string) string {
	image, _, _ = strings.Cut(image, "@")
	variant := ""
	if i := strings.LastIndex(image, ":"); i >= 0 && !strings.Contains(image[i:], "/") {
		variant = imageVariant(image[i+1:])
		image = image[:i]
	}
	return image + ":v" + strings.TrimPrefix(version, "v") + variant
}

// PinKubeImages returns the machine config cfg with the images of the
// components named in versions set to those versions (the image
// repositories stay cfg's). A component cfg does not carry (a worker's
// static pods) is ignored; kube-proxy's image follows the kubelet's. It is
// how a config rendered for the target version is applied without moving
// Kubernetes: the upgrade moves the images one component and one node at a
// time, as upgrade-k8s patches them (pkg/cluster/kubernetes/talos_managed.go
// upgradeStaticPodPatcher, kubelet.go upgradeKubeletPatcher at v1.13.3 and
// v1.14.0-rc.1). The patches are machinery's own (config/generate/stdpatches
// at v1.14.1), which write the image where cfg keeps it: in the typed
// documents of a Talos v1.14 config (KubeletConfig, KubeAPIServerConfig…),
// which refuses the v1alpha1 fields beside them, or in .machine.kubelet and
// .cluster.apiServer/controllerManager/scheduler/proxy before.
func PinKubeImages(cfg []byte, versions map[string]string) ([]byte, error) {
	if len(versions) == 0 {
		return cfg, nil
	}
	provider, err := configloader.NewFromBytes(cfg)
	if err != nil {
		return nil, fmt.Errorf("reading the machine config: %w", err)
	}
	var patches []configpatcher.Patch
	pin := func(comp, version, current string, patch func(string) ([]byte, error)) error {
		if version == "" || current == "" {
			return nil
		}
		next := withTag(current, version)
		if next == current {
			return nil
		}
		b, err := patch(next)
		if err != nil {
			return fmt.Errorf("pinning %s to %s: %w", comp, version, err)
		}
		p, err := configpatcher.LoadPatch(b)
		if err != nil {
			return fmt.Errorf("pinning %s to %s: %w", comp, version, err)
		}
		patches = append(patches, p)
		return nil
	}
	type pinning struct {
		comp, version, current string
		patch                  func(string) ([]byte, error)
	}
	todo := []pinning{{Kubelet, versions[Kubelet], configImage(provider, Kubelet), func(img string) ([]byte, error) {
		return stdpatches.WithKubeletImage(stdpatches.GuessVersionContractKubelet(provider), img)
	}}}
	// kube-proxy's image, which Talos renders into the kube-proxy
	// manifest, moves with the node's kubelet: after the static pods,
	// where upgrade-k8s moves it (upgradeKubeProxy). Only a config that
	// names it (a control plane's) carries it.
	if p := provider.K8sProxyConfig(); p != nil && provider.Machine() != nil && provider.Machine().Type().IsControlPlane() {
		todo = append(todo, pinning{"kube-proxy", versions[Kubelet], p.Image(), func(img string) ([]byte, error) {
			return stdpatches.WithKubeProxyImage(stdpatches.GuessVersionContractKubeProxy(provider), img)
		}})
	}
	if provider.Machine() != nil && provider.Machine().Type().IsControlPlane() {
		todo = append(todo,
			pinning{KubeAPIServer, versions[KubeAPIServer], configImage(provider, KubeAPIServer), func(img string) ([]byte, error) {
				return stdpatches.WithKubeAPIServerImage(stdpatches.GuessVersionContractKubeAPIServer(provider), img)
			}},
			pinning{KubeControllerManager, versions[KubeControllerManager], configImage(provider, KubeControllerManager), func(img string) ([]byte, error) {
				return stdpatches.WithKubeControllerManagerImage(stdpatches.GuessVersionContractKubeControllerManager(provider), img)
			}},
			pinning{KubeScheduler, versions[KubeScheduler], configImage(provider, KubeScheduler), func(img string) ([]byte, error) {
				return stdpatches.WithKubeSchedulerImage(stdpatches.GuessVersionContractKubeScheduler(provider), img)
			}})
	}
	for _, p := range todo {
		if err := pin(p.comp, p.version, p.current, p.patch); err != nil {
			return nil, err
		}
	}
	if len(patches) == 0 {
		return cfg, nil
	}
	out, err := configpatcher.Apply(configpatcher.WithConfig(provider), patches)
	if err != nil {
		return nil, fmt.Errorf("pinning the Kubernetes images: %w", err)
	}
	patched, err := out.Config()
	if err != nil {
		return nil, fmt.Errorf("pinning the Kubernetes images: %w", err)
	}
	return patched.EncodeBytes(encoder.WithComments(encoder.CommentsDisabled))
}

// KubeImages reads the Kubernetes versions a node's applied config names:
// the kubelet's (KubeletSpec) and on a control plane the static pods'
// (APIServerConfig, ControllerManagerConfig, SchedulerConfig), the
// resources upgrade-k8s reads for the configured images.
func (o *Ops) KubeImages(ctx context.Context, t Target) (map[string]string, error) {
	out := map[string]string{}
	err := o.callRetrying(ctx, t.IP, "reading the Kubernetes images of "+t.String(), func(ctx context.Context, c *client.Client) error {
		ks, err := safe.StateGet[*k8s.KubeletSpec](ctx, c.COSI, resource.NewMetadata(k8s.NamespaceName, k8s.KubeletSpecType, k8s.KubeletID, resource.VersionUndefined))
		if err != nil {
			return err
		}
		out[Kubelet] = imageVersion(ks.TypedSpec().Image)
		if t.Role != RoleControlPlane {
			return nil
		}
		api, err := safe.StateGet[*k8s.APIServerConfig](ctx, c.COSI, k8s.NewAPIServerConfig(k8s.APIServerConfigID).Metadata())
		if err != nil {
			return err
		}
		cm, err := safe.StateGet[*k8s.ControllerManagerConfig](ctx, c.COSI, k8s.NewControllerManagerConfig(k8s.ControllerManagerConfigID).Metadata())
		if err != nil {
			return err
		}
		sched, err := safe.StateGet[*k8s.SchedulerConfig](ctx, c.COSI, k8s.NewSchedulerConfig(k8s.SchedulerConfigID).Metadata())
		if err != nil {
			return err
		}
		out[KubeAPIServer] = imageVersion(api.TypedSpec().Image)
		out[KubeControllerManager] = imageVersion(cm.TypedSpec().Image)
		out[KubeScheduler] = imageVersion(sched.TypedSpec().Image)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ComponentState is what one Kubernetes component on one node runs.
type ComponentState struct {
	Version string
	Ready   bool
	// Detail says what is missing when not Ready or unknown.
	Detail string
}

// Component is the one condition both the Kubernetes rollout's waits and
// its plan read: the version a component runs on a node and whether it is
// ready. A static pod is read from the status kubelet reports to Talos
// (StaticPodStatus: the running container's image and the Ready
// condition); a kubelet from its Node (status.nodeInfo.kubeletVersion and
// the Ready condition), as upgrade-k8s checks both (checkPodStatus in
// talos_managed.go, checkNodeKubeletVersion in kubelet.go at v1.13.3).
func (o *Ops) Component(ctx context.Context, t Target, component string, kc kubernetes.Interface) ComponentState {
	return o.component(ctx, t, component, kc, false)
}

// component is Component; retrying makes a static pod read retry a
// dropped connection (callRetrying): a plan needs the answer, while a
// wait polls again anyway.
func (o *Ops) component(ctx context.Context, t Target, component string, kc kubernetes.Interface, retrying bool) ComponentState {
	if component == Kubelet {
		if kc == nil {
			return ComponentState{Detail: "no Kubernetes client"}
		}
		cctx, cancel := context.WithTimeout(ctx, o.opts.CallTimeout)
		defer cancel()
		n, err := kc.CoreV1().Nodes().Get(cctx, t.Name, metav1.GetOptions{})
		if err != nil {
			return ComponentState{Detail: "reading Node " + t.Name + ": " + kube.Classify(err).Error()}
		}
		st := ComponentState{Version: strings.TrimPrefix(n.Status.NodeInfo.KubeletVersion, "v")}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				st.Ready = c.Status == corev1.ConditionTrue
			}
		}
		if !st.Ready {
			st.Detail = "Node " + t.Name + " is not Ready"
		}
		return st
	}
	var st ComponentState
	read := func(ctx context.Context, c *client.Client) error {
		id := "kube-system/" + component + "-" + t.Name
		p, err := safe.StateGet[*k8s.StaticPodStatus](ctx, c.COSI, resource.NewMetadata(k8s.NamespaceName, k8s.StaticPodStatusType, id, resource.VersionUndefined))
		if err != nil {
			return err
		}
		st = podState(p.TypedSpec().PodStatus)
		return nil
	}
	what := "reading the " + component + " static pod status of " + t.Name
	var err error
	if retrying {
		err = o.callRetrying(ctx, t.IP, what, read)
	} else if err = o.read(ctx, t.IP, o.opts.CallTimeout, read); err != nil {
		err = fmt.Errorf("%s: %w", what, err)
	}
	if err != nil {
		return ComponentState{Detail: err.Error()}
	}
	if !st.Ready && st.Detail == "" {
		st.Detail = component + " is not Ready"
	}
	return st
}

// podState reads a v1.PodStatus kept as a map (StaticPodStatus).
func podState(status map[string]any) ComponentState {
	var st ComponentState
	if cs, ok := status["containerStatuses"].([]any); ok && len(cs) > 0 {
		if c, ok := cs[0].(map[string]any); ok {
			image, _ := c["image"].(string)
			st.Version = imageVersion(image)
		}
	}
	if conds, ok := status["conditions"].([]any); ok {
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Ready" {
				st.Ready = m["status"] == "True"
			}
		}
	}
	if st.Version == "" {
		st.Detail = "the static pod reports no container image"
	}
	return st
}

// KubeRunning reads what every component runs on every node (Component);
// a component that reports no version is left out (PlanKubernetes then
// refuses to plan).
func (o *Ops) KubeRunning(ctx context.Context, nodes []Target, kc kubernetes.Interface) KubeVersions {
	out := KubeVersions{}
	for _, n := range nodes {
		for _, comp := range ComponentsOf(n.Role) {
			if st := o.component(ctx, n, comp, kc, true); st.Version != "" {
				out.set(n.Name, comp, st.Version)
			}
		}
	}
	return out
}

// KubeRollOutOptions configure a Kubernetes rollout.
type KubeRollOutOptions struct {
	Plan *KubePlan
	// Configs are the nodes' machine configs rendered for the target
	// version, by node name.
	Configs map[string][]byte
	// Configured are the versions each node's applied config names
	// (KubeImages): what a step's config keeps for the components not
	// moved yet.
	Configured KubeVersions
	// Kube reads the Nodes.
	Kube kubernetes.Interface
	// Health is checked before the first step and after the last.
	Health HealthInput
	Mutate Mutator
	// StaticPodTimeout and KubeletTimeout bound each step's wait (defaults
	// 5 and 3 minutes, upgrade-k8s' own: checkPodStatus, and the retry in
	// upgradeKubeletOnNode).
	StaticPodTimeout, KubeletTimeout time.Duration
}

// RollOutKubernetes carries out a Kubernetes upgrade plan. Before the
// first step it waits for the cluster to be healthy. Each step applies the
// node's config with that component's image moved (without a reboot, as
// upgrade-k8s' patchNodeConfig) and waits until the component runs the
// new version and is Ready; a config the node already has is not applied
// again, so a step a killed run began is only waited for. A step that
// fails stops the rollout: the components after it are untouched and a
// re-run plans again from what the nodes run.
func (o *Ops) RollOutKubernetes(ctx context.Context, opts KubeRollOutOptions) error {
	if opts.Plan == nil || len(opts.Plan.Steps) == 0 {
		return nil
	}
	if opts.StaticPodTimeout <= 0 {
		opts.StaticPodTimeout = 5 * time.Minute
	}
	if opts.KubeletTimeout <= 0 {
		opts.KubeletTimeout = 3 * time.Minute
	}
	if err := o.WaitHealthy(ctx, "the cluster healthy before upgrading Kubernetes", opts.Health); err != nil {
		return fmt.Errorf("not upgrading an unhealthy cluster: %w", err)
	}
	versions := opts.Configured.clone()
	for _, s := range opts.Plan.Steps {
		versions.set(s.Name, s.Component, s.To)
		err := opts.Mutate(s.String(), func() error { return o.kubeStep(ctx, opts, s, versions[s.Name]) })
		if err != nil {
			return fmt.Errorf("%w; the Kubernetes upgrade stopped at %s on %s (%d/%d): what comes after it is untouched, and a re-run continues from the versions the nodes run", err, s.Component, s.Name, s.Pos, s.Of)
		}
	}
	return o.WaitHealthy(ctx, "the cluster healthy after upgrading Kubernetes", opts.Health)
}

func (o *Ops) kubeStep(ctx context.Context, opts KubeRollOutOptions, s KubeStep, versions map[string]string) error {
	base, ok := opts.Configs[s.Name]
	if !ok {
		return fmt.Errorf("no machine config rendered for %s", s.Name)
	}
	cfg, err := PinKubeImages(base, versions)
	if err != nil {
		return err
	}
	t := s.Target
	t.Config = cfg
	_, changed, err := o.DiffConfig(ctx, t)
	if err != nil {
		return err
	}
	if changed {
		if _, err := o.applyConfig(ctx, t, machine.ApplyConfigurationRequest_NO_REBOOT); err != nil {
			return err
		}
	}
	timeout := opts.StaticPodTimeout
	what := fmt.Sprintf("%s on %s to run %s and be Ready", s.Component, s.Name, s.To)
	if s.Component == Kubelet {
		timeout = opts.KubeletTimeout
		what = fmt.Sprintf("Node %s to report kubelet v%s and be Ready", s.Name, s.To)
	}
	spec := wait.Spec{What: what, Timeout: timeout, Interval: o.opts.PollInterval, ProgressEvery: o.opts.ProgressEvery, Log: o.opts.Log}
	return wait.Until(ctx, spec, func(ctx context.Context) (bool, string, error) {
		st := o.Component(ctx, t, s.Component, opts.Kube)
		if st.Version != s.To {
			if st.Version == "" {
				return false, st.Detail, nil
			}
			return false, fmt.Sprintf("runs %s", st.Version), nil
		}
		return st.Ready, st.Detail, nil
	})
}

// PrePullKubernetes pulls every image the plan's steps will run, on the
// node each runs on, before the first step: the static pods' images into
// the CRI namespace of the control planes, the kubelet's into the system
// namespace of every node (talosctl upgrade-k8s prePullImages,
// pkg/cluster/kubernetes/talos_managed.go at v1.13.3, with the deprecated
// ImagePull it still uses). An image no registry serves stops the upgrade
// before anything changed, instead of leaving a static pod that cannot
// start half way through. A node whose Talos does not implement the call
// is skipped, as upgrade-k8s does. configs are the nodes' configs rendered
// for the target version.
func (o *Ops) PrePullKubernetes(ctx context.Context, plan *KubePlan, configs map[string][]byte) error {
	type pull struct {
		node Target
		ns   common.ContainerdNamespace
		ref  string
	}
	var pulls []pull
	seen := map[string]bool{}
	for _, s := range plan.Steps {
		cfg, err := configloader.NewFromBytes(configs[s.Name])
		if err != nil {
			return fmt.Errorf("reading the machine config of %s: %w", s.Name, err)
		}
		p := pull{node: s.Target, ns: common.ContainerdNamespace_NS_CRI}
		switch s.Component {
		case Kubelet:
			p.ns, p.ref = common.ContainerdNamespace_NS_SYSTEM, configImage(cfg, Kubelet)
		case KubeAPIServer:
			p.ref = configImage(cfg, KubeAPIServer)
		case KubeControllerManager:
			p.ref = configImage(cfg, KubeControllerManager)
		case KubeScheduler:
			p.ref = configImage(cfg, KubeScheduler)
		}
		if key := s.Name + "\x00" + p.ref; p.ref != "" && !seen[key] {
			seen[key] = true
			pulls = append(pulls, p)
		}
	}
	for _, p := range pulls {
		o.opts.Log.Info().Str("node", p.node.Name).Str("image", p.ref).Msgf("pre-pulling %s on %s", p.ref, p.node.Name)
		err := o.call(ctx, p.node.IP, true, o.opts.InstallTimeout, func(ctx context.Context, c *client.Client) error {
			return c.ImagePull(ctx, p.ns, p.ref) //nolint:staticcheck // the call upgrade-k8s itself still makes
		})
		switch {
		case client.StatusCode(err) == codes.Unimplemented || status.Code(errors.Unwrap(err)) == codes.Unimplemented:
			o.opts.Log.Info().Str("node", p.node.Name).Msg("image pull not implemented by this Talos; skipped")
		case err != nil:
			return fmt.Errorf("pre-pulling %s on %s before the Kubernetes upgrade (nothing was changed): %w", p.ref, p.node, err)
		}
	}
	return nil
}
