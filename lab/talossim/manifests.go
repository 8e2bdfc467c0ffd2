package talossim

import (
	"context"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
)

// Manifest is one bootstrap manifest a control plane renders: Talos'
// ManifestController writes one k8s.Manifest resource per ID
// (controlplane namespace), ManifestApplyController creates its objects in
// the cluster if missing, and talosctl upgrade-k8s syncs them after an
// upgrade (internal/app/machined/pkg/controllers/k8s/manifest.go,
// manifest_apply.go; pkg/cluster/kubernetes/talos_managed.go at v1.13.3).
type Manifest struct {
	ID      string
	Objects []map[string]any
}

// BootstrapManifests renders the bootstrap manifests the lab runs, from a
// control plane's machine config: "10-kube-proxy" (DaemonSet,
// ServiceAccount, ClusterRoleBinding) when the proxy is enabled,
// "11-core-dns" (ServiceAccount, ClusterRole, ClusterRoleBinding,
// ConfigMap, Deployment) and "11-core-dns-svc" (Service) when CoreDNS is.
// Each object carries what a controller or a health check reads of
// Talos' own (names, labels, selectors, image, tolerations, service
// account, replicas; k8stemplates testdata at v1.13.3); container details
// kwok does not run (probes, mounts, resources) are left out, and the
// token, CSR and RBAC manifests are not rendered (docs/lab.md). "05-flannel"
// (its ServiceAccount and DaemonSet) comes first when the CNI is flannel.
func BootstrapManifests(cfg config.Provider) []Manifest {
	if cfg == nil || cfg.Machine() == nil || !cfg.Machine().Type().IsControlPlane() {
		return nil
	}
	// Talos renders nothing without a network and a cluster config
	// (ControlPlaneBootstrapManifestsController's map function in
	// controllers/k8s/control_plane.go at v1.14.0-rc.1). The accessors
	// answer from the typed documents of v1.14 or the v1alpha1 fields
	// before (container.go at machinery v1.14.1): flannel is deployed
	// when K8sFlannelCNIConfig is set (KubeFlannelCNIConfig, or
	// cluster.network.cni.name flannel).
	network := cfg.K8sNetworkConfig()
	if network == nil || cfg.K8sClusterConfig() == nil {
		return nil
	}
	var out []Manifest
	if cfg.K8sFlannelCNIConfig() != nil {
		// "05-flannel": FlannelDaemonSetTemplate and its ServiceAccount
		// (k8stemplates/flannel.go at v1.13.3), image pkg/images/list.go's
		// ghcr.io/siderolabs/flannel at constants.FlannelVersion. Its
		// ClusterRole, binding and ConfigMap are not rendered (docs/lab.md).
		labels := map[string]any{"k8s-app": "flannel", "tier": "node"}
		image := "ghcr.io/siderolabs/flannel:" + constants.FlannelVersion
		out = append(out, Manifest{ID: "05-flannel", Objects: []map[string]any{
			serviceAccount("flannel"),
			{
				"apiVersion": "apps/v1", "kind": "DaemonSet",
				"metadata": map[string]any{"name": "kube-flannel", "namespace": "kube-system", "labels": labels},
				"spec": map[string]any{
					"selector": map[string]any{"matchLabels": labels},
					"template": map[string]any{
						"metadata": map[string]any{"labels": labels},
						"spec": map[string]any{
							"initContainers": []any{map[string]any{
								"name": "install-config", "image": image, "command": []any{"cp"},
								"args": []any{"-f", "/etc/kube-flannel/cni-conf.json", "/etc/cni/net.d/10-flannel.conflist"},
							}},
							"containers": []any{map[string]any{
								"name": "kube-flannel", "image": image,
								"command": []any{"/opt/bin/flanneld"}, "args": []any{"--ip-masq", "--kube-subnet-mgr"},
							}},
							"hostNetwork": true, "priorityClassName": "system-node-critical", "serviceAccountName": "flannel",
							"tolerations": []any{
								map[string]any{"effect": "NoSchedule", "operator": "Exists"},
								map[string]any{"effect": "NoExecute", "operator": "Exists"},
							},
						},
					},
				},
			},
		}})
	}
	if proxy := cfg.K8sProxyConfig(); proxy != nil && proxy.Enabled() {
		labels := map[string]any{"k8s-app": "kube-proxy", "tier": "node"}
		out = append(out, Manifest{ID: "10-kube-proxy", Objects: []map[string]any{
			{
				"apiVersion": "apps/v1", "kind": "DaemonSet",
				"metadata": map[string]any{"name": "kube-proxy", "namespace": "kube-system", "labels": labels},
				"spec": map[string]any{
					"selector": map[string]any{"matchLabels": labels},
					"template": map[string]any{
						"metadata": map[string]any{"labels": labels},
						"spec": map[string]any{
							"containers": []any{map[string]any{
								"name": "kube-proxy", "image": proxy.Image(),
								"command": []any{"/usr/local/bin/kube-proxy", "--proxy-mode=" + proxyMode(proxy.Mode())},
							}},
							"hostNetwork": true, "priorityClassName": "system-cluster-critical", "serviceAccountName": "kube-proxy",
							"tolerations": []any{
								map[string]any{"effect": "NoSchedule", "operator": "Exists"},
								map[string]any{"effect": "NoExecute", "operator": "Exists"},
							},
						},
					},
					"updateStrategy": map[string]any{"type": "RollingUpdate", "rollingUpdate": map[string]any{"maxUnavailable": int64(1)}},
				},
			},
			serviceAccount("kube-proxy"),
			clusterRoleBinding("kube-proxy", "system:node-proxier", "kube-proxy"),
		}})
	}
	if coreDNS := cfg.K8sCoreDNSConfig(); coreDNS != nil && coreDNS.Enabled() {
		labels := map[string]any{"k8s-app": "kube-dns"}
		domain := network.DNSDomain()
		out = append(out, Manifest{ID: "11-core-dns", Objects: []map[string]any{
			serviceAccount("coredns"),
			{
				"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
				"metadata": map[string]any{"name": "system:coredns"},
				"rules": []any{
					map[string]any{"apiGroups": []any{""}, "resources": []any{"endpoints", "services", "pods", "namespaces"}, "verbs": []any{"list", "watch"}},
					map[string]any{"apiGroups": []any{"discovery.k8s.io"}, "resources": []any{"endpointslices"}, "verbs": []any{"list", "watch"}},
				},
			},
			clusterRoleBinding("system:coredns", "system:coredns", "coredns"),
			{
				"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": map[string]any{"name": "coredns", "namespace": "kube-system"},
				"data":     map[string]any{"Corefile": ".:53 {\n    errors\n    health\n    ready\n    kubernetes " + domain + " in-addr.arpa ip6.arpa\n    forward . /etc/resolv.conf\n    cache 30\n}\n"},
			},
			{
				"apiVersion": "apps/v1", "kind": "Deployment",
				"metadata": map[string]any{"name": "coredns", "namespace": "kube-system", "labels": map[string]any{"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
				"spec": map[string]any{
					"replicas": int64(2),
					"selector": map[string]any{"matchLabels": labels},
					"strategy": map[string]any{"type": "RollingUpdate", "rollingUpdate": map[string]any{"maxUnavailable": int64(1)}},
					"template": map[string]any{
						"metadata": map[string]any{"labels": labels},
						"spec": map[string]any{
							"containers": []any{map[string]any{
								"name": "coredns", "image": coreDNS.Image(),
								"args": []any{"-conf", "/etc/coredns/Corefile"},
							}},
							"dnsPolicy": "Default", "nodeSelector": map[string]any{"kubernetes.io/os": "linux"},
							"priorityClassName": "system-cluster-critical", "serviceAccountName": "coredns",
							"tolerations": []any{
								map[string]any{"effect": "NoSchedule", "key": "node-role.kubernetes.io/control-plane", "operator": "Exists"},
								map[string]any{"effect": "NoSchedule", "key": "node.cloudprovider.kubernetes.io/uninitialized", "operator": "Exists"},
							},
						},
					},
				},
			},
		}})
		// k8s.DNSServiceAddrs, as the controller computes the address.
		if ips := k8s.DNSServiceAddrs(network.ServiceCIDRs()); len(ips) > 0 {
			out = append(out, Manifest{ID: "11-core-dns-svc", Objects: []map[string]any{{
				"apiVersion": "v1", "kind": "Service",
				"metadata": map[string]any{"name": "kube-dns", "namespace": "kube-system", "labels": map[string]any{"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
				"spec": map[string]any{
					"clusterIP": ips[0].String(), "selector": labels,
					"ports": []any{
						map[string]any{"name": "dns", "port": int64(53), "protocol": "UDP", "targetPort": int64(53)},
						map[string]any{"name": "dns-tcp", "port": int64(53), "protocol": "TCP", "targetPort": int64(53)},
					},
				},
			}}})
		}
	}
	return out
}

func proxyMode(m string) string {
	if m == "" {
		return "iptables"
	}
	return m
}

func serviceAccount(name string) map[string]any {
	return map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": name, "namespace": "kube-system"}}
}

func clusterRoleBinding(name, role, sa string) map[string]any {
	return map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
		"metadata": map[string]any{"name": name},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
		"subjects": []any{map[string]any{"kind": "ServiceAccount", "name": sa, "namespace": "kube-system"}},
	}
}

// publishManifests keeps the node's k8s.Manifest resources at what its
// config renders, as ManifestController does on a control plane (its
// stale manifests are destroyed).
func publishManifests(st state.State, cfg config.Provider) {
	ctx := context.Background()
	want := map[string]bool{}
	for _, m := range BootstrapManifests(cfg) {
		want[m.ID] = true
		_ = safe.StateModify(ctx, st, k8s.NewManifest(k8s.ControlPlaneNamespaceName, m.ID), func(r *k8s.Manifest) error {
			items := make([]k8s.SingleManifest, 0, len(m.Objects))
			for _, o := range m.Objects {
				items = append(items, k8s.SingleManifest{Object: o})
			}
			r.TypedSpec().Items = items
			return nil
		})
	}
	old, err := st.List(ctx, resource.NewMetadata(k8s.ControlPlaneNamespaceName, k8s.ManifestType, "", resource.VersionUndefined))
	if err != nil {
		return
	}
	for _, r := range old.Items {
		if !want[r.Metadata().ID()] {
			_ = st.Destroy(ctx, r.Metadata())
		}
	}
}
