// Package talos turns a cluster description into Talos machine
// configuration (secrets bundle, per-role and per-node configs, talosconfig)
// and drives the Talos API (apply, bootstrap, health, kubeconfig) through the
// real machinery client. It never imports the stages package: the talos
// stage maps the project config onto GenerateOptions and OpsOptions.
package talos

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"

	"github.com/homelab/bootstrap/internal/sealed"
)

// Role is a node's place in the cluster.
type Role string

// Node roles.
const (
	RoleControlPlane Role = "controlplane"
	RoleWorker       Role = "worker"
)

// CNI names understood by GenerateOptions.CNI.
const (
	// CNIFlannel keeps Talos' built-in flannel (the Talos default).
	CNIFlannel = "flannel"
	// CNICilium disables the built-in CNI and kube-proxy: Cilium is installed
	// later (infra stage) and replaces kube-proxy.
	CNICilium = "cilium"
	// CNINone disables the built-in CNI and leaves kube-proxy on.
	CNINone = "none"
)

// Default values used when GenerateOptions leaves a field empty.
const (
	DefaultTalosVersion = "v1.13.3"
	DefaultPrefixLen    = 24
	DefaultInterface    = "eth0"
	// LinkAliasName names the node's NIC when it is selected by MAC address.
	LinkAliasName = "net0"
)

// DefaultKubernetesVersion is the Kubernetes version rendered when none is
// given: the one the lab's control plane runs and config.DefaultKubernetesVersion
// (machinery v1.13.3 defaulted to it too; v1.14.1's constants say 1.37.0).
const DefaultKubernetesVersion = "1.36.1"

// Node describes one machine of the cluster.
type Node struct {
	// Name becomes the node's hostname and the file nodes/<Name>.yaml.
	Name string
	Role Role
	// IP is the node's static address, with or without a /prefix; without
	// one, Network.PrefixLen applies.
	IP string
	// MAC, when known, pins the static address to that NIC (LinkAliasConfig)
	// instead of relying on the interface name.
	MAC string
	// DiskBus of the install disk ("scsi", "sata", "virtio"); it decides the
	// install device. Empty means GenerateOptions.DefaultDiskBus.
	DiskBus string
	// InstallDisk overrides the device derived from DiskBus.
	InstallDisk string
	// Patches are this node's patch files, applied after the role patches.
	Patches []string
	// UserVolumes are the node's extra disks Talos makes user volumes
	// (uservolumes.go).
	UserVolumes []UserVolume
	// InstallImage, when set, is this node's installer instead of
	// GenerateOptions.InstallImage (a Secure Boot node's Secure Boot
	// installer).
	InstallImage string
	// EncryptTPM adds the VolumeConfig documents that encrypt STATE and
	// EPHEMERAL with a TPM-sealed key (see secureboot.go).
	EncryptTPM bool
}

// Network is the static addressing shared by all nodes.
type Network struct {
	// PrefixLen applies to node IPs given without a prefix (default 24).
	PrefixLen int
	// Gateway is the default route.
	Gateway string
	// Nameservers for ResolverConfig; none means Talos' defaults.
	Nameservers []string
	// Interface is the link name used when a node has no MAC (default eth0).
	Interface string
}

// Patches lists patch files (strategic merge or, where machinery allows,
// JSON 6902) by scope. Files are applied in list order within a scope.
type Patches struct {
	Global       []string
	ControlPlane []string
	Worker       []string
}

// GenerateOptions is everything config generation needs.
type GenerateOptions struct {
	// Dir is the cluster's output directory (.talos/<cluster>).
	Dir         string
	ClusterName string
	// Endpoint is the Kubernetes API URL; default https://<VIP or first
	// control plane>:6443.
	Endpoint string
	// TalosVersion selects the config contract ("v1.13.3").
	TalosVersion string
	// ConfigVersion, when set, is the Talos version whose config form is
	// rendered instead of TalosVersion's (ConfigVersionFor): a cluster on
	// its way to v1.14 keeps the v1alpha1 form its older nodes understand.
	ConfigVersion string
	// WorkloadIsolationOff leaves out the SecurityProfileConfig document
	// (workloadIsolation: true) v1.14's generator writes for a new
	// cluster: a cluster made before v1.14 runs without it, and an upgrade
	// changes nothing on its own (see README "Workload isolation").
	WorkloadIsolationOff bool
	// KubernetesVersion without or with a leading "v" ("1.36.1").
	KubernetesVersion string
	// InstallImage is the installer image; empty means the node's own.
	InstallImage string
	// VIP is the shared control-plane address (Layer2VIPConfig), optional.
	VIP string
	// CertSANs are extra names/IPs for the API server and Talos API certificates.
	CertSANs []string
	Network  Network
	Nodes    []Node
	Patches  Patches
	// CNI is "flannel" (default), "cilium" or "none".
	CNI string
	// DefaultDiskBus is used for role templates and nodes without a bus
	// (default "scsi").
	DefaultDiskBus string
	// AllowSchedulingOnControlPlanes defaults to true when there are no workers.
	AllowSchedulingOnControlPlanes *bool
	// Now is the clock for what must be minted (the secrets bundle on first
	// run, a talosconfig client certificate when none can be reused).
	// Default time.Now.
	Now func() time.Time
	// NewBundle, when set, is what Plan renders with and Generate stores
	// if the cluster has no bundle yet, instead of minting another (one
	// minted in the background while the VMs boot, or Plan's), so that a
	// first run pays for the RSA-4096 key once. Ignored when a bundle
	// exists.
	NewBundle *secrets.Bundle
	// ECDSAServiceAccountKey mints a new bundle with an ECDSA service
	// account key instead of the RSA key the version contract selects
	// (config cluster.serviceAccountKey: ecdsa). An existing bundle keeps
	// its key.
	ECDSAServiceAccountKey bool
	// Sealer keeps the bundle encrypted at rest; nil stores it as
	// plaintext (0600).
	Sealer Sealer
	// Files keeps the rendered configs and the talosconfig, which hold the
	// bundle's keys: age-encrypted (<name>.age) when it seals, so none is
	// plaintext beside an encrypted bundle; nil keeps them plaintext.
	Files *sealed.Files
	Log   zerolog.Logger
}

func (o GenerateOptions) withDefaults() GenerateOptions {
	if o.TalosVersion == "" {
		o.TalosVersion = DefaultTalosVersion
	}
	if !strings.HasPrefix(o.TalosVersion, "v") {
		o.TalosVersion = "v" + o.TalosVersion
	}
	if o.KubernetesVersion == "" {
		o.KubernetesVersion = DefaultKubernetesVersion
	}
	o.KubernetesVersion = strings.TrimPrefix(o.KubernetesVersion, "v")
	if o.Network.PrefixLen == 0 {
		o.Network.PrefixLen = DefaultPrefixLen
	}
	if o.Network.Interface == "" {
		o.Network.Interface = DefaultInterface
	}
	if o.CNI == "" {
		o.CNI = CNIFlannel
	}
	if o.DefaultDiskBus == "" {
		o.DefaultDiskBus = "scsi"
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// ControlPlanes returns the control-plane nodes in configuration order.
func (o GenerateOptions) ControlPlanes() []Node { return nodesWithRole(o.Nodes, RoleControlPlane) }

// Workers returns the worker nodes in configuration order.
func (o GenerateOptions) Workers() []Node { return nodesWithRole(o.Nodes, RoleWorker) }

func nodesWithRole(nodes []Node, r Role) []Node {
	var out []Node
	for _, n := range nodes {
		if n.Role == r {
			out = append(out, n)
		}
	}
	return out
}

// InstallDiskForBus maps a VM disk bus to the device Talos sees: SCSI and
// SATA disks appear as /dev/sda, virtio-blk as /dev/vda.
func InstallDiskForBus(bus string) (string, error) {
	switch strings.ToLower(bus) {
	case "scsi", "sata", "ide":
		return "/dev/sda", nil
	case "virtio":
		return "/dev/vda", nil
	default:
		return "", fmt.Errorf("unknown disk bus %q (want scsi, sata or virtio)", bus)
	}
}

// NodeAddr returns the node's address without prefix.
func NodeAddr(ip string) (netip.Addr, error) {
	if p, err := netip.ParsePrefix(ip); err == nil {
		return p.Addr(), nil
	}
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("invalid node address %q", ip)
	}
	return a, nil
}

func nodePrefix(ip string, defaultLen int) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(ip); err == nil {
		return p, nil
	}
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("invalid node address %q", ip)
	}
	return netip.PrefixFrom(a, defaultLen), nil
}

func (o GenerateOptions) validate() error {
	var errs []string
	if o.ClusterName == "" {
		errs = append(errs, "cluster name is empty")
	}
	if o.Dir == "" {
		errs = append(errs, "output directory is empty")
	}
	if len(o.ControlPlanes()) == 0 {
		errs = append(errs, "no control-plane node")
	}
	seen := map[string]bool{}
	for i, n := range o.Nodes {
		if n.Name == "" {
			errs = append(errs, fmt.Sprintf("node %d has no name", i))
			continue
		}
		if seen[n.Name] {
			errs = append(errs, fmt.Sprintf("node %s listed twice", n.Name))
		}
		seen[n.Name] = true
		if n.Role != RoleControlPlane && n.Role != RoleWorker {
			errs = append(errs, fmt.Sprintf("node %s: role %q (want controlplane or worker)", n.Name, n.Role))
		}
		if _, err := NodeAddr(n.IP); err != nil {
			errs = append(errs, fmt.Sprintf("node %s: %v", n.Name, err))
		}
		if n.InstallDisk == "" && n.DiskBus != "" {
			if _, err := InstallDiskForBus(n.DiskBus); err != nil {
				errs = append(errs, fmt.Sprintf("node %s: %v", n.Name, err))
			}
		}
	}
	switch o.CNI {
	case CNIFlannel, CNICilium, CNINone:
	default:
		errs = append(errs, fmt.Sprintf("cni %q (want flannel, cilium or none)", o.CNI))
	}
	if o.VIP != "" {
		if _, err := netip.ParseAddr(o.VIP); err != nil {
			errs = append(errs, fmt.Sprintf("vip %q is not an IP address", o.VIP))
		}
	}
	if o.Network.Gateway != "" {
		if _, err := netip.ParseAddr(o.Network.Gateway); err != nil {
			errs = append(errs, fmt.Sprintf("gateway %q is not an IP address", o.Network.Gateway))
		}
	}
	for _, ns := range o.Network.Nameservers {
		if _, err := netip.ParseAddr(ns); err != nil {
			errs = append(errs, fmt.Sprintf("nameserver %q is not an IP address", ns))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("talos generate options: %s", strings.Join(errs, "; "))
	}
	return nil
}
