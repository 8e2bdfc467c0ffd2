package talos

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/Masterminds/semver/v3"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// Removed is what a Kubernetes upgrade takes away: API versions (objects
// stored in them can no longer be read) and feature gates (a component
// given one no longer starts).
type Removed struct {
	// Resources are "resource.version.group" names, as kubectl's
	// --resource argument.
	Resources    []string
	FeatureGates []string
	// Flags are command-line flags removed, by component (kubelet,
	// kube-apiserver, kube-controller-manager): a config that still
	// passes one in extraArgs makes the component fail to start.
	Flags map[string][]string
}

// removedByMinor is what each minor release removed, for the releases
// Talos v1.12 to v1.14 run (Kubernetes 1.31 to 1.37). Upgrade-k8s checks
// the same before it starts (siderolabs/go-kubernetes
// kubernetes/upgrade/checks.go at v0.2.37, and at v0.2.41 for 1.37, the
// version Talos v1.14.0-rc.1 pins; upgradeVersionCheck, taken from
// the Kubernetes changelogs and the API deprecation guide), with the
// component flags it lists (a user's extraArgs can carry them). A release
// not listed removed nothing of these (unverified beyond that file).
var removedByMinor = map[uint64]Removed{
	31: {FeatureGates: []string{"APIPriorityAndFairness", "CSINodeExpandSecret", "ConsistentHTTPGetHandlers",
		"DefaultHostNetworkHostPortsInPodTemplates", "ServiceNodePortStaticSubrange", "SkipReadOnlyValidationGCE"},
		Flags: map[string][]string{
			Kubelet: {"keep-terminated-pod-volumes", "iptables-masquerade-bit", "iptables-drop-bit"},
			KubeControllerManager: {"volume-host-cidr-denylist", "volume-host-allow-local-loopback",
				"horizontal-pod-autoscaler-upscale-delay", "horizontal-pod-autoscaler-downscale-delay"},
		}},
	32: {
		Resources: []string{"podschedulingcontexts.v1alpha3.resource.k8s.io"},
		FeatureGates: []string{"AllowServiceLBStatusOnNonLB", "CloudDualStackNodeIPs", "DRAControlPlaneController",
			"HPAContainerMetrics", "KMSv2", "KMSv2KDF", "LegacyServiceAccountTokenCleanUp", "MinDomainsInPodTopologySpread",
			"NewVolumeManagerReconstruction", "NodeOutOfServiceVolumeDetach", "ServerSideApply", "ServerSideFieldValidation",
			"StableLoadBalancerNodeSet", "ValidatingAdmissionPolicy", "ZeroLimitedNominalConcurrencyShares"},
	},
	33: {FeatureGates: []string{"AppArmor", "AppArmorFields", "CPUManager", "DisableCloudProviders",
		"DisableKubeletCloudCredentialProviders", "JobPodFailurePolicy", "KubeProxyDrainingTerminatingNodes",
		"PDBUnhealthyPodEvictionPolicy", "PersistentVolumeLastPhaseTransitionTime", "VolumeCapacityPriority"},
		Flags: map[string][]string{KubeAPIServer: {"cloud-config"}}},
	34: {FeatureGates: []string{"DevicePluginCDIDevices", "LegacySidecarContainers", "PodDisruptionConditions"},
		Flags: map[string][]string{Kubelet: {"cloud-config"}}},
	35: {FeatureGates: []string{"SizeMemoryBackedVolumes", "UserNamespacesHostNetworkSupport"},
		Flags: map[string][]string{Kubelet: {"pod-infra-container-image"}}},
	36: {FeatureGates: []string{"CSIMigrationPortworx", "HonorPVReclaimPolicy", "InTreePluginPortworxUnregister",
		"WatchFromStorageWithoutResourceVersion"}},
	37: {
		Resources: []string{"workloads.v1alpha2.scheduling.k8s.io", "podgroups.v1alpha2.scheduling.k8s.io"},
		FeatureGates: []string{"AnyVolumeDataSource", "DeclarativeValidationTakeover", "GangScheduling",
			"PreventStaticPodAPIReferences", "WorkloadAwarePreemption"},
		// cAdvisor's deprecated flags: the kubelet fails to start with any.
		Flags: map[string][]string{Kubelet: {"application-metrics-count-limit", "boot-id-file", "container-hints",
			"containerd", "containerd-namespace", "enable-load-reader", "event-storage-age-limit", "event-storage-event-limit",
			"global-housekeeping-interval", "log-cadvisor-usage", "machine-id-file", "storage-driver-user",
			"storage-driver-password", "storage-driver-host", "storage-driver-db", "storage-driver-table",
			"storage-driver-secure", "storage-driver-buffer-duration"}},
	},
}

// RemovedIn returns what the releases after from up to to removed (nothing
// for a patch upgrade or a downgrade).
func RemovedIn(from, to string) Removed {
	var r Removed
	f, err1 := semver.NewVersion(strings.TrimPrefix(from, "v"))
	t, err2 := semver.NewVersion(strings.TrimPrefix(to, "v"))
	if err1 != nil || err2 != nil || f.Major() != t.Major() {
		return r
	}
	for m := f.Minor() + 1; m <= t.Minor(); m++ {
		r.Resources = append(r.Resources, removedByMinor[m].Resources...)
		r.FeatureGates = append(r.FeatureGates, removedByMinor[m].FeatureGates...)
		for comp, flags := range removedByMinor[m].Flags {
			if r.Flags == nil {
				r.Flags = map[string][]string{}
			}
			r.Flags[comp] = append(r.Flags[comp], flags...)
		}
	}
	return r
}

// CheckConfigs refuses machine configs (by node name) that give a removed
// feature gate to the API server, controller manager, scheduler or
// kubelet (their extraArgs "feature-gates", the kubelet's extraConfig
// featureGates), or still pass a removed flag in their extraArgs (as
// upgrade-k8s' PopulateRemovedCLIFlags reads the live static pods'
// commands and the KubeletSpec's args: what Talos renders from these
// configs). The error names each node, component and gate or flag.
func (r Removed) CheckConfigs(configs map[string][]byte) error {
	if len(r.FeatureGates) == 0 && len(r.Flags) == 0 {
		return nil
	}
	var problems []string
	names := make([]string, 0, len(configs))
	for n := range configs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, node := range names {
		cfg, err := configloader.NewFromBytes(configs[node])
		if err != nil {
			return fmt.Errorf("reading the machine config of %s: %w", node, err)
		}
		gates, args := map[string][]string{}, map[string]map[string][]string{}
		// The container's K8s accessors answer from the typed documents of
		// Talos v1.14 (KubeletConfig, KubeAPIServerConfig…) or from the
		// v1alpha1 fields before (container.go at machinery v1.14.1).
		if k := cfg.K8sKubeletConfig(); k != nil {
			args[Kubelet] = k.ExtraArgs()
			gates["kubelet"] = append(gates["kubelet"], argGates(k.ExtraArgs()["feature-gates"])...)
			if fg, ok := k.ExtraConfig()["featureGates"].(map[string]any); ok {
				for g := range fg {
					gates["kubelet"] = append(gates["kubelet"], g)
				}
			}
		}
		if cfg.Machine() != nil && cfg.Machine().Type().IsControlPlane() {
			if a := cfg.K8sAPIServerConfig(); a != nil {
				gates["kube-apiserver"] = argGates(a.ExtraArgs()["feature-gates"])
				args[KubeAPIServer] = a.ExtraArgs()
			}
			if c := cfg.K8sControllerManagerConfig(); c != nil {
				gates["kube-controller-manager"] = argGates(c.ExtraArgs()["feature-gates"])
				args[KubeControllerManager] = c.ExtraArgs()
			}
			if s := cfg.K8sSchedulerConfig(); s != nil {
				gates["kube-scheduler"] = argGates(s.ExtraArgs()["feature-gates"])
				args[KubeScheduler] = s.ExtraArgs()
			}
		}
		for _, comp := range []string{KubeAPIServer, KubeControllerManager, KubeScheduler, Kubelet} {
			for _, f := range r.Flags[comp] {
				if _, ok := args[comp][f]; ok {
					problems = append(problems, fmt.Sprintf("%s: %s flag --%s", node, comp, f))
				}
			}
		}
		for _, comp := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"} {
			for _, g := range gates[comp] {
				if slices.Contains(r.FeatureGates, g) {
					problems = append(problems, fmt.Sprintf("%s: %s feature gate %s", node, comp, g))
				}
			}
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("the target Kubernetes removed feature gates or flags the configs still set (the component would not start): %s; remove them from the config patches", strings.Join(problems, "; "))
	}
	return nil
}

// argGates reads "A=true,B=false" flag values into gate names.
func argGates(values []string) []string {
	var out []string
	for _, v := range values {
		for _, kv := range strings.Split(v, ",") {
			if name, _, _ := strings.Cut(strings.TrimSpace(kv), "="); name != "" {
				out = append(out, name)
			}
		}
	}
	return out
}

// FindObjects lists every removed resource the API server still serves
// and says which hold objects ("" when none do): they would be unreadable
// after the upgrade. A resource the server does not serve holds nothing.
func (r Removed) FindObjects(ctx context.Context, dyn dynamic.Interface) (string, error) {
	var found []string
	for _, res := range r.Resources {
		gvr, _ := schema.ParseResourceArg(res)
		if gvr == nil {
			return "", fmt.Errorf("%q is not a resource.version.group name", res)
		}
		list, err := dyn.Resource(*gvr).List(ctx, metav1.ListOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("listing %s: %w", res, err)
		}
		if n := len(list.Items); n > 0 {
			found = append(found, fmt.Sprintf("%d object(s) of %s", n, res))
		}
	}
	if len(found) == 0 {
		return "", nil
	}
	return "the target Kubernetes no longer serves " + strings.Join(found, ", "), nil
}
