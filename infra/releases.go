package infra

import (
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

// NFSClass is the StorageClass the chart creates for these options.
func NFSClass(o NFSOptions) ClassSpec {
	return ClassSpec{Name: o.StorageClass, Provisioner: NFSProvisionerName, ReclaimPolicy: o.ReclaimPolicy,
		Parameters: map[string]string{"archiveOnDelete": strconv.FormatBool(o.ArchiveOnDelete)}}
}

// The Cilium release.
const (
	CiliumRelease   = "cilium"
	CiliumNamespace = "kube-system"
	CiliumChart     = "cilium"
)

// Cilium returns the Cilium release for a Talos cluster: kube-proxy
// replacement on (Talos then runs without kube-proxy), the API server
// reached at the cluster endpoint, and the capabilities and cgroup
// settings Talos requires.
func Cilium(repoURL, version, endpoint string, timeout time.Duration) (Release, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return Release{}, err
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return Release{}, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return Release{}, err
	}
	return Release{
		Name: CiliumRelease, Namespace: CiliumNamespace, RepoURL: repoURL, Chart: CiliumChart, Version: version, Timeout: timeout,
		Values: map[string]any{
			"ipam":                 map[string]any{"mode": "kubernetes"},
			"kubeProxyReplacement": true,
			"k8sServiceHost":       host,
			"k8sServicePort":       p,
			"securityContext": map[string]any{"capabilities": map[string]any{
				"ciliumAgent":      []string{"CHOWN", "KILL", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "SYS_ADMIN", "SYS_RESOURCE", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"},
				"cleanCiliumState": []string{"NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE"},
			}},
			"cgroup": map[string]any{"autoMount": map[string]any{"enabled": false}, "hostRoot": "/sys/fs/cgroup"},
		},
	}, nil
}
