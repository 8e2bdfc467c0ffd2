package talossim

import (
	"context"
	"slices"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
)

// KubernetesUpdater is a Cluster that follows the Kubernetes images in the
// nodes' machine configs. Real Talos applies a changed
// cluster.apiServer/controllerManager/scheduler image without a reboot:
// KubeletStaticPodController renders the static pod again and kubelet
// restarts the pod with the new image; a changed machine.kubelet.image
// restarts the kubelet service, which registers again reporting its new
// version (internal/app/machined/pkg/controllers/k8s/control_plane.go,
// kubelet_static_pod.go and kubelet_spec.go at v1.13.3; talosctl
// upgrade-k8s relies on exactly this in pkg/cluster/kubernetes). The
// simulator calls these outside its locks, after such an apply.
type KubernetesUpdater interface {
	// StaticPodImage is called when control plane node's static pod name
	// (kube-apiserver, kube-controller-manager, kube-scheduler) is to run
	// image. It returns once the pod runs it; an error leaves the pod not
	// Ready (as a pod whose new image does not start).
	StaticPodImage(ctx context.Context, node NodeInfo, name, image string) error
	// KubeletImage is called when the node's kubelet restarted with image.
	KubeletImage(ctx context.Context, node NodeInfo, image string) error
}

// StaticPod is one control-plane static pod as the node's kubelet runs it.
type StaticPod struct {
	Name, Image string
	Ready       bool
}

// MirrorPodSyncer is a Cluster whose API shows a control plane's static
// pods as its kubelet does, as mirror pods (pkg/kubelet/pod/mirror_client.go
// at Kubernetes v1.36.1): what talosctl health's "all control plane
// components to be ready" counts (K8sFullControlPlaneAssertion,
// pkg/cluster/check/kubernetes.go at v1.13.3). The simulator calls it
// outside its locks whenever a control plane's static pods change; seq
// grows with every report of a node, so a report that arrives after a
// later one is ignored.
type MirrorPodSyncer interface {
	MirrorPods(ctx context.Context, node NodeInfo, seq uint64, pods []StaticPod) error
}

// kubernetesImages are the Kubernetes images a machine config asks for:
// the kubelet's on every node, the static pods' on a control plane.
type kubernetesImages struct {
	kubelet    string
	staticPods map[string]string
}

func imagesOf(cfg config.Provider) kubernetesImages {
	var im kubernetesImages
	if cfg == nil || cfg.Machine() == nil {
		return im
	}
	im.kubelet = kubeletImage(cfg)
	if cfg.Machine().Type().IsControlPlane() {
		im.staticPods = StaticPodImages(cfg)
	}
	return im
}

// kubeletImage is the kubelet image a config asks for: KubeletConfig from
// Talos v1.14, .machine.kubelet before (the container answers either:
// K8sKubeletConfig in config/container/container.go at machinery v1.14.1).
func kubeletImage(cfg config.Provider) string {
	if k := cfg.K8sKubeletConfig(); k != nil {
		return k.Image()
	}
	return ""
}

// StaticPodImages are a control plane's static pod images, from the
// KubeAPIServerConfig, KubeControllerManagerConfig and KubeSchedulerConfig
// documents (v1.14) or .cluster.apiServer and friends (before), through
// the same container accessors; nil when the config has neither.
func StaticPodImages(cfg config.Provider) map[string]string {
	out := map[string]string{}
	if a := cfg.K8sAPIServerConfig(); a != nil {
		out["kube-apiserver"] = a.Image()
	}
	if c := cfg.K8sControllerManagerConfig(); c != nil {
		out["kube-controller-manager"] = c.Image()
	}
	if s := cfg.K8sSchedulerConfig(); s != nil {
		out["kube-scheduler"] = s.Image()
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// publishKubernetesConfig keeps the resources Talos' controllers derive
// from the machine config and that talosctl upgrade-k8s reads for the
// images a node is configured with: KubeletSpec (k8s namespace, ID
// "kubelet") on every node, and on a control plane APIServerConfig,
// ControllerManagerConfig and SchedulerConfig (controlplane namespace) —
// KubeletSpecController and ControlPlaneController copy the images from
// the config (kubelet_spec.go, control_plane.go at v1.13.3). Only the image
// is simulated.
func publishKubernetesConfig(st state.State, im kubernetesImages) {
	ctx := context.Background()
	if im.kubelet != "" {
		_ = safe.StateModify(ctx, st, k8s.NewKubeletSpec(k8s.NamespaceName, k8s.KubeletID), func(r *k8s.KubeletSpec) error {
			r.TypedSpec().Image = im.kubelet
			return nil
		})
	}
	if im.staticPods == nil {
		return
	}
	_ = safe.StateModify(ctx, st, k8s.NewAPIServerConfig(k8s.APIServerConfigID), func(r *k8s.APIServerConfig) error {
		r.TypedSpec().Image = im.staticPods["kube-apiserver"]
		return nil
	})
	_ = safe.StateModify(ctx, st, k8s.NewControllerManagerConfig(k8s.ControllerManagerConfigID), func(r *k8s.ControllerManagerConfig) error {
		r.TypedSpec().Image = im.staticPods["kube-controller-manager"]
		return nil
	})
	_ = safe.StateModify(ctx, st, k8s.NewSchedulerConfig(k8s.SchedulerConfigID), func(r *k8s.SchedulerConfig) error {
		r.TypedSpec().Image = im.staticPods["kube-scheduler"]
		return nil
	})
}

// publishStaticPod sets the status kubelet reports for one static pod of
// a control plane named hostname: the pod's v1.PodStatus as
// KubeletStaticPodController stores it (kubelet_static_pod.go
// refreshPodStatus at v1.13.3), here the phase, the Ready condition and
// the container's image, which is what a check of the running version
// reads.
func publishStaticPod(st state.State, hostname, name, image string, ready bool) {
	readyStatus, phase := "True", "Running"
	if !ready {
		readyStatus, phase = "False", "Pending"
	}
	r := k8s.NewStaticPodStatus(k8s.NamespaceName, "kube-system/"+name+"-"+hostname)
	_ = safe.StateModify(context.Background(), st, r, func(p *k8s.StaticPodStatus) error {
		p.TypedSpec().PodStatus = map[string]any{
			"phase":      phase,
			"conditions": []any{map[string]any{"type": "Ready", "status": readyStatus}},
			"containerStatuses": []any{map[string]any{
				"name": name, "image": image, "ready": ready,
			}},
		}
		return nil
	})
}

// setStaticPodLocked publishes one static pod's status and reports the
// node's static pods to a MirrorPodSyncer.
func (n *Node) setStaticPodLocked(name, image string, ready bool) {
	n.setStaticPodsLocked(map[string]string{name: image}, ready)
}

// setStaticPodsLocked publishes the status of the static pods in images
// (name → image) and reports the node's static pods to a MirrorPodSyncer
// once: pods kubelet starts together are reported together.
func (n *Node) setStaticPodsLocked(images map[string]string, ready bool) {
	if len(images) == 0 {
		return
	}
	if n.staticPods == nil {
		n.staticPods = map[string]StaticPod{}
	}
	for name, image := range images {
		publishStaticPod(n.cosi, n.hostnameLocked(), name, image, ready)
		n.staticPods[name] = StaticPod{Name: name, Image: image, Ready: ready}
	}
	syncer, ok := n.sim.opts.Cluster.(MirrorPodSyncer)
	if !ok {
		return
	}
	n.mirrorSeq++
	info, seq := n.infoLocked(), n.mirrorSeq
	pods := make([]StaticPod, 0, len(n.staticPods))
	for _, name := range staticPods {
		if p, ok := n.staticPods[name]; ok {
			pods = append(pods, p)
		}
	}
	go func() {
		if err := syncer.MirrorPods(context.Background(), info, seq, pods); err != nil {
			n.log.Debug().Err(err).Msg("talossim: mirror pods not synced")
		}
	}()
}

// removeStaticPods removes a control plane's static pod statuses (the node
// goes down).
func removeStaticPods(st state.State, hostname string) {
	for _, name := range staticPods {
		md := resource.NewMetadata(k8s.NamespaceName, k8s.StaticPodStatusType, "kube-system/"+name+"-"+hostname, resource.VersionUndefined)
		_ = st.Destroy(context.Background(), md)
	}
}

// kubernetesImagesChangedLocked follows a config applied without a reboot
// on a running node: the derived resources change at once, a changed
// static pod goes not Ready until the control plane runs its new image,
// a changed kubelet image restarts the kubelet.
func (n *Node) kubernetesImagesChangedLocked(before, after kubernetesImages) {
	publishKubernetesConfig(n.cosi, after)
	info := n.infoLocked()
	updater, _ := n.sim.opts.Cluster.(KubernetesUpdater)
	gen := n.gen
	for _, name := range staticPods {
		image := after.staticPods[name]
		if image == "" || image == before.staticPods[name] {
			continue
		}
		if n.stage == runtime.MachineStageRunning {
			n.setStaticPodLocked(name, image, false)
		}
		if slices.Contains(n.faults.MissingImages, image) {
			// kubelet cannot pull it: the pod stays not Ready
			// (ImagePullBackOff) and the old one is gone.
			n.log.Warn().Str("pod", name).Str("image", image).Msg("talossim: static pod image cannot be pulled")
			continue
		}
		go func() {
			if updater != nil {
				if err := updater.StaticPodImage(context.Background(), info, name, image); err != nil {
					n.log.Warn().Err(err).Str("pod", name).Str("image", image).Msg("talossim: static pod does not run its new image")
					return
				}
			}
			n.mu.Lock()
			defer n.mu.Unlock()
			// A reboot since then publishes the pods again from the config.
			if n.gen == gen && n.stage == runtime.MachineStageRunning {
				n.setStaticPodLocked(name, image, true)
			}
		}()
	}
	if after.kubelet != "" && after.kubelet != before.kubelet && updater != nil {
		image := after.kubelet
		go func() {
			if err := updater.KubeletImage(context.Background(), info, image); err != nil {
				n.log.Warn().Err(err).Str("image", image).Msg("talossim: kubelet did not come back with its new image")
			}
		}()
	}
}
