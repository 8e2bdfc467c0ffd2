package infra

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"time"
)

// The NFS provisioner release.
const (
	NFSRelease   = "nfs-provisioner"
	NFSNamespace = "nfs-provisioner"
	NFSChart     = "nfs-subdir-external-provisioner"
	// NFSProvisionerName is pinned instead of the chart's default
	// (cluster.local/<release>-nfs-subdir-external-provisioner) so the
	// StorageClass never changes provisioner when the release is renamed.
	NFSProvisionerName = "cluster.local/nfs-provisioner"
)

// NFSOptions describe the export and the class.
type NFSOptions struct {
	Server          string
	Path            string
	MountOptions    []string
	StorageClass    string
	ReclaimPolicy   string
	ArchiveOnDelete bool
	RepoURL         string
	Version         string
	Timeout         time.Duration
}

// NFSProvisioner returns the release of nfs-subdir-external-provisioner
// with the values of chart 4.0.x.
func NFSProvisioner(o NFSOptions) Release {
	nfs := map[string]any{"server": o.Server, "path": o.Path}
	if len(o.MountOptions) > 0 {
		nfs["mountOptions"] = o.MountOptions
	}
	return Release{
		Name: NFSRelease, Namespace: NFSNamespace, RepoURL: o.RepoURL, Chart: NFSChart, Version: o.Version, Timeout: o.Timeout,
		Values: map[string]any{
			"nfs": nfs,
			"storageClass": map[string]any{
				"create":          true,
				"name":            o.StorageClass,
				"defaultClass":    true,
				"provisionerName": NFSProvisionerName,
				"reclaimPolicy":   o.ReclaimPolicy,
				"archiveOnDelete": o.ArchiveOnDelete,
			},
		},
	}
}

// The Cilium release.
const (
	CiliumRelease   = "cilium"
	CiliumNamespace = "kube-system"
	CiliumChart     = "cilium"
	// CiliumOperatorReplicas is the chart's own operator.replicas default
	// (install/kubernetes/cilium/values.yaml at v1.18.4 and v1.20.2).
	CiliumOperatorReplicas = 2
)

// CiliumOptions describe the Cilium release for one cluster.
type CiliumOptions struct {
	RepoURL, Version string
	// APIHost and APIPort are where the agents reach the Kubernetes API
	// before any Service works (kube-proxy replacement): KubePrism's
	// localhost endpoint on Talos, see APIEndpoint.
	APIHost string
	APIPort int
	// Nodes is how many nodes the cluster has; it sizes the operator.
	Nodes   int
	Timeout time.Duration
}

// Cilium returns the Cilium release for a Talos cluster: kube-proxy
// replacement on (Talos then runs without kube-proxy), the API reached
// through KubePrism, and the capabilities and cgroup settings Talos
// requires (the values Talos's own e2e installs Cilium with,
// hack/test/e2e.sh at siderolabs/talos v1.13.3).
//
// The chart runs CiliumOperatorReplicas operator replicas on the host
// network with a required hostname anti-affinity, so each needs a node of
// its own: on fewer nodes the surplus stays Pending for ever and the
// Deployment never has all replicas available. It gets one replica per
// node, up to the chart's default.
func Cilium(o CiliumOptions) Release {
	return Release{
		Name: CiliumRelease, Namespace: CiliumNamespace, RepoURL: o.RepoURL, Chart: CiliumChart, Version: o.Version, Timeout: o.Timeout, Essential: true,
		Values: map[string]any{
			"ipam":                 map[string]any{"mode": "kubernetes"},
			"kubeProxyReplacement": true,
			"k8sServiceHost":       o.APIHost,
			"k8sServicePort":       o.APIPort,
			"operator":             map[string]any{"replicas": CiliumOperatorSize(o.Nodes)},
			"securityContext": map[string]any{"capabilities": map[string]any{
				"ciliumAgent":      []string{"CHOWN", "KILL", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "SYS_ADMIN", "SYS_RESOURCE", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"},
				"cleanCiliumState": []string{"NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE"},
			}},
			"cgroup": map[string]any{"autoMount": map[string]any{"enabled": false}, "hostRoot": "/sys/fs/cgroup"},
		},
	}
}

// CiliumOperatorSize is the operator replica count for a cluster of n
// nodes: one per node (the operator tolerates every taint, so control
// planes count), at most the chart's default.
func CiliumOperatorSize(nodes int) int {
	return max(1, min(nodes, CiliumOperatorReplicas))
}

// KubePrismHost is the address Talos's KubePrism load balancer listens on
// on every node (internal/app/machined/pkg/controllers/k8s/kubeprism.go at
// v1.13.3 binds it to localhost).
const KubePrismHost = "localhost"

// APIEndpoint is where Cilium should reach the API server: KubePrism on
// localhost:port when every node runs it (Talos enables it by default on
// port 7445, pkg/machinery/config/generate/init.go and
// constants.DefaultKubePrismPort at v1.13.3), so the CNI does not hang on
// a VIP that needs etcd and can take a minute to move; otherwise the
// cluster endpoint, with the reason.
func APIEndpoint(kubePrismPort int, endpoint string) (host string, port int, why string, err error) {
	if kubePrismPort > 0 {
		return KubePrismHost, kubePrismPort, fmt.Sprintf("KubePrism on %s:%d", KubePrismHost, kubePrismPort), nil
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", 0, "", err
	}
	h, p, err := net.SplitHostPort(u.Host)
	if err != nil {
		return "", 0, "", err
	}
	if port, err = strconv.Atoi(p); err != nil {
		return "", 0, "", err
	}
	return h, port, "the cluster endpoint (KubePrism is not enabled on every node)", nil
}
