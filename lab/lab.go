package lab

import (
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/internal/fsutil"
	"github.com/homelab/bootstrap/lab/chartrepo"
	"github.com/homelab/bootstrap/lab/fluxmanifests"
	"github.com/homelab/bootstrap/lab/imagefactory"
	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/nfs"
	"github.com/homelab/bootstrap/lab/nfsprovisioner"
	"github.com/homelab/bootstrap/lab/pvesim"
	"github.com/homelab/bootstrap/lab/talossim"
	"github.com/homelab/bootstrap/proxmox"
)

// Options shape a lab.
type Options struct {
	// Dir holds the generated config, the token file, the demo git work
	// tree and the lab's own state (default "lab").
	Dir string
	// ConfigPath is where the cluster config is written (default
	// <Dir>/bootstrap.yaml).
	ConfigPath string
	// ControlPlanes and Workers size the cluster (default 1 and 0).
	ControlPlanes int
	Workers       int
	// VIP gives the control planes a shared address (as a Talos Layer2 VIP).
	VIP bool
	// ProxmoxHosts runs a Proxmox VE cluster of that many members (pve1,
	// pve2, ...; each an N100 with its own local storages) listed in the
	// config's proxmox.hosts; 0 or 1 is the single host "pve".
	ProxmoxHosts int
	// ProxmoxHA writes proxmox.ha: true and grants the lab's token the
	// Sys.Console on / that HA resources need (README's role leaves it out).
	ProxmoxHA bool
	// ProxmoxWithoutPrivileges leaves these out of the lab token's role,
	// to rehearse a token made with an older runner role.
	ProxmoxWithoutPrivileges []string
	// ProxmoxVersion is the pve-manager version the lab's Proxmox runs
	// (default 8.2.4, the oldest supported): pvesim validates every call
	// with that release's published API schema, and the token holds the
	// README's role for it.
	ProxmoxVersion string
	// ProxmoxImport gives the Proxmox host's "local" storage the 'import'
	// content type as well (an operator's setting on pve-storage 8.2.8 and
	// later): where proxmox.boot auto or image keeps the Talos disk image.
	ProxmoxImport bool
	// ProxmoxPCI are the Proxmox cluster's PCI resource mappings (nil: the
	// mapping "igpu" of every member's N100 iGPU, pvesim.IGPUMapping;
	// empty: none). Every member has the iGPU (pvesim.N100IGPU), and the
	// lab's token and user hold PVEMappingUser (Mapping.Use, Mapping.Audit)
	// on each mapping, as README's PCI devices section grants it.
	ProxmoxPCI []pvesim.PCIMapping
	// ProxmoxBoot, when set, is written as proxmox.boot (auto, image, iso).
	ProxmoxBoot string
	// Profile is the latency model of the Proxmox host and Talos nodes:
	// "instant" or "n100"; TimeScale multiplies its durations (n100 at
	// 0.1 runs ten times faster than the real box).
	Profile   string
	TimeScale float64
	// CNI is written into the config: flannel (default) or cilium.
	CNI string
	// TalosVersion is what the nodes' ISO boots and the config's
	// cluster.talosVersion (default v1.13.3): an older one lets a test
	// upgrade the cluster afterwards.
	TalosVersion string
	// KubernetesVersion, when set, is written as cluster.kubernetesVersion
	// (an older Talos needs an older Kubernetes to make a valid config).
	KubernetesVersion string
	// FluxVersion, when set, is written as flux.version. The lab serves
	// and runs only config.DefaultFluxVersion, so another one is for a
	// test that never runs the flux stage: a cluster below that Flux's
	// Kubernetes floor (config validate refuses the pair) still has a
	// valid config with an older Flux named.
	FluxVersion string
	// ServiceAccountKey, when set, is written as cluster.serviceAccountKey
	// (rsa or ecdsa; unset, the config's default: rsa).
	ServiceAccountKey string
	// BinDir holds the lab binaries (default: kube.DefaultBinDir()).
	BinDir string
	// Audit makes the API server keep an audit log of every write (who,
	// with which user agent, what) at AuditLogPath; see kube.ReadAuditLog.
	Audit bool
	// Seed makes pvesim's probabilistic faults reproducible.
	Seed int64
	// KubeDataDir keeps the control plane's data, certificates and server
	// logs there instead of in a temporary directory removed at Stop.
	KubeDataDir string
	// OnNodeBoot is called with each Talos node as its VM starts, before its
	// API comes up (to inject talossim faults).
	OnNodeBoot func(*talossim.Node)
	// NodeMonitorGracePeriod is how long a node may miss heartbeats before
	// it turns NotReady (lab/kube's default when zero).
	NodeMonitorGracePeriod time.Duration
	Log                    zerolog.Logger
}

// Lab is a running homelab without hardware.
type Lab struct {
	opts   Options
	prefix netip.Prefix
	log    zerolog.Logger

	// PVE is the Proxmox member the config's URL reaches; PVEMembers all
	// of them (PVE alone on a single host).
	PVE        *pvesim.Server
	PVEMembers []*pvesim.Server
	Talos      *talossim.Sim
	Kube       *ControlPlane
	NFS        *nfs.Server
	Charts     *chartrepo.Repo
	Manifest   *fluxmanifests.Server
	// Factory is the Image Factory the config points at; pvesim downloads
	// its ISOs and talossim nodes pull its installers.
	Factory *imagefactory.Server

	provMu sync.Mutex
	prov   *nfsprovisioner.StandIn
	cancel context.CancelFunc
	done   chan struct{}

	configPath string
	gitDir     string
}

// Provisioner returns the NFS provisioner stand-in once the control plane
// runs (nil before).
func (l *Lab) Provisioner() *nfsprovisioner.StandIn {
	l.provMu.Lock()
	defer l.provMu.Unlock()
	return l.prov
}

// Subnet returns the node network's /24 on loopback.
func (l *Lab) Subnet() netip.Prefix { return l.prefix }

// ConfigPath is the generated cluster config.
func (l *Lab) ConfigPath() string { return l.configPath }

// AuditLogPath is where the API server writes its audit log when
// Options.Audit is set.
func (l *Lab) AuditLogPath() string { return abs(filepath.Join(l.opts.Dir, "audit.log")) }

// PVEFor is the Proxmox member that runs vmid (the first member when none
// does).
func (l *Lab) PVEFor(vmid int) *pvesim.Server { return l.PVE.MemberOf(vmid) }

// proxmoxOptionLines are the config's proxmox.ha and, for a cluster of
// members, proxmox.hosts.
func (l *Lab) proxmoxOptionLines() string {
	out := ""
	if l.opts.ProxmoxHA {
		out = "  ha: true\n"
	}
	if l.opts.ProxmoxBoot != "" {
		out += "  boot: " + l.opts.ProxmoxBoot + "\n"
	}
	if len(l.PVEMembers) < 2 {
		return out
	}
	var names []string
	for _, m := range l.PVEMembers {
		names = append(names, m.NodeName())
	}
	return out + "  hosts: [" + strings.Join(names, ", ") + "]\n"
}

// Options returns the lab's effective options.
func (l *Lab) Options() Options { return l.opts }

// GitDir is the demo work tree Flux syncs ./infra from.
func (l *Lab) GitDir() string { return l.gitDir }

func (o Options) withDefaults() Options {
	if o.Dir == "" {
		o.Dir = "lab"
	}
	if o.ConfigPath == "" {
		o.ConfigPath = filepath.Join(o.Dir, config.DefaultFile)
	}
	if o.ControlPlanes <= 0 {
		o.ControlPlanes = 1
	}
	if o.Profile == "" {
		o.Profile = "instant"
	}
	if o.TimeScale <= 0 {
		o.TimeScale = 1
	}
	if o.CNI == "" {
		o.CNI = "flannel"
	}
	if o.TalosVersion == "" {
		o.TalosVersion = config.DefaultTalosVersion
	}
	return o
}

// labPVEVersion is the pve-manager version the lab's Proxmox reports.
var labPVEVersion = proxmox.Version{Major: 8, Minor: 2, Patch: 4, Release: "8.2", Full: "8.2.4"}

// randomSecret is a token secret shaped as PVE's (a UUID).
func randomSecret() string {
	b := make([]byte, 16)
	_, _ = crand.Read(b)
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// isoSize is the size of every ISO the lab's Image Factory serves.
const isoSize = 100 << 20

// ISOBytes is the size of the Talos ISO the lab's Proxmox downloads.
const ISOBytes = isoSize

// Start brings up every lab service and writes the cluster config. The
// Kubernetes control plane starts later, when the talos stage bootstraps
// etcd on the first control plane, as on real hardware.
func Start(ctx context.Context, o Options) (_ *Lab, err error) {
	o = o.withDefaults()
	l := &Lab{opts: o, log: o.Log.With().Str("component", "lab").Logger(), done: make(chan struct{})}
	defer func() {
		if err != nil {
			l.Stop()
		}
	}()
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	if l.prefix, err = talossim.RandomLoopbackPrefix(50000); err != nil {
		return nil, err
	}
	pveProfile, err := pvesim.ProfileByName(o.Profile)
	if err != nil {
		return nil, err
	}
	talosProfile, err := talossim.ProfileByName(o.Profile)
	if err != nil {
		return nil, err
	}
	bins := o.BinDir
	if bins == "" {
		if bins, err = kube.DefaultBinDir(); err != nil {
			return nil, err
		}
	}
	kb, err := kube.LoadBinaries(bins)
	if err != nil {
		return nil, err
	}

	// The Kubernetes side: started by the first control plane's bootstrap.
	ko := kube.Options{BinDir: bins, Log: o.Log, Flux: true, DataDir: o.KubeDataDir, NodeMonitorGracePeriod: o.NodeMonitorGracePeriod}
	if o.Audit {
		ko.AuditPolicyFile, ko.AuditLogPath = filepath.Join(o.Dir, "audit-policy.yaml"), l.AuditLogPath()
		if err := fsutil.WriteAtomic(ko.AuditPolicyFile, []byte(kube.WritesAuditPolicy), 0o600); err != nil {
			return nil, err
		}
		if err := os.Remove(ko.AuditLogPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	l.Kube = NewControlPlane(ko)
	// The lab has no way out to the discovery service (discovery.talos.dev):
	// workers find trustd through the cluster endpoint only, as in an
	// offline homelab, so a VIP endpoint makes them wait for etcd.
	// The factory builds every release; the lab's builds every patch of
	// the three minors the lab runs, and its own version.
	var versions []string
	for _, minor := range []int{12, 13, 14} {
		for patch := 0; patch <= 12; patch++ {
			versions = append(versions, fmt.Sprintf("v1.%d.%d", minor, patch))
		}
	}
	if !slices.Contains(versions, o.TalosVersion) {
		versions = append(versions, o.TalosVersion)
	}
	if l.Factory, err = imagefactory.Start(imagefactory.Options{Versions: versions, ISOSize: isoSize, Log: o.Log}); err != nil {
		return nil, fmt.Errorf("starting the image factory: %w", err)
	}
	l.Talos = talossim.New(talossim.Options{Cluster: l.Kube, Profile: talosProfile, TimeScale: o.TimeScale, DiscoveryUnreachable: true,
		TalosVersion: o.TalosVersion, Installer: l.Factory.Installer, Log: o.Log,
		// A node that shuts itself down stops its VM (l.PVE is set below,
		// before any VM starts).
		PowerOff: func(vmid int) { _ = l.PVEFor(vmid).GuestPowerOff(vmid) }})
	// The Proxmox host trusts the factory's CA, as a host whose trust
	// store holds a self-hosted factory's CA would.
	fetch := http.DefaultTransport.(*http.Transport).Clone()
	fetch.TLSClientConfig = &tls.Config{RootCAs: l.Factory.CAPool(), MinVersion: tls.VersionTLS12}

	// The Proxmox host: a started VM boots a Talos node at its cloud-init address.
	// The lab's token is the one README's setup creates: bootstrap@pve!homelab,
	// privilege-separated, holding the BootstrapRunner role on / (and its
	// user the same), so every lab run, the e2e suite included, proves the
	// documented role is enough.
	pveVersion := labPVEVersion
	if o.ProxmoxVersion != "" {
		if pveVersion, err = proxmox.ParseVersion(o.ProxmoxVersion); err != nil {
			return nil, fmt.Errorf("lab: Proxmox version: %w", err)
		}
	}
	privs := proxmox.RunnerPrivileges(pveVersion)
	if o.ProxmoxHA {
		privs = append(privs, "Sys.Console")
	}
	privs = slices.DeleteFunc(privs, func(p string) bool { return slices.Contains(o.ProxmoxWithoutPrivileges, p) })
	role := []pvesim.ACE{{Path: "/", Privileges: privs}}
	pci := o.ProxmoxPCI
	if pci == nil {
		pci = []pvesim.PCIMapping{pvesim.IGPUMapping(pveMemberNames(o.ProxmoxHosts)...)}
	}
	for _, m := range pci {
		// PVEMappingUser (pve-access-control 9.1.1 create_roles).
		role = append(role, pvesim.ACE{Path: "/mapping/pci/" + m.ID, Privileges: []string{"Mapping.Use", "Mapping.Audit"}})
	}
	pveOpts := pvesim.Options{
		PCIMappings: pci,
		Node:        pvesim.NodeSpec{PCIDevices: []pvesim.PCIDevice{pvesim.N100IGPU()}},
		Version:     pveVersion.Full,
		Users:       []pvesim.User{{ID: "bootstrap@pve", ACL: role}},
		Tokens:      []pvesim.Token{{ID: "bootstrap@pve!homelab", Secret: randomSecret(), ACL: role}},
		Profile:     pveProfile, TimeScale: o.TimeScale, Log: o.Log, Seed: o.Seed,
		HTTP:       &http.Client{Transport: fetch},
		GuestAgent: l.guestAgent,
		OnStart:    []func(pvesim.VMEvent) error{l.bootNode},
		OnStop:     []func(pvesim.VMEvent){l.stopNode},
		OnDestroy:  []func(pvesim.VMEvent){l.wipeNode},
		// pvesim's vmbr0, and vmbr1, a VLAN-aware bridge with jumbo
		// frames for a second NIC (proxmox.vm.nics, e.g. storage traffic).
		Bridges: []pvesim.BridgeSpec{
			{Name: "vmbr0", Ports: "enp1s0", CIDR: "10.0.20.5/24", Gateway: "10.0.20.1"},
			{Name: "vmbr1", Ports: "enp2s0", VLANAware: true, MTU: 9000},
		},
	}
	if o.ProxmoxImport {
		// pvesim's default storages, "local" with 'import' added.
		pveOpts.Storages = []pvesim.StorageSpec{
			{Name: "local", Type: "dir", Content: []string{"iso", "vztmpl", "backup", "import"}, TotalBytes: 94 << 30, UsedBytes: 9 << 30, Path: "/var/lib/vz"},
			{Name: "local-lvm", Type: "lvmthin", Content: []string{"images", "rootdir"}, TotalBytes: 348 << 30},
		}
	}
	if o.ProxmoxHosts > 1 {
		var members []pvesim.NodeSpec
		for i := range o.ProxmoxHosts {
			members = append(members, pvesim.NodeSpec{Name: fmt.Sprintf("pve%d", i+1), PCIDevices: []pvesim.PCIDevice{pvesim.N100IGPU()}})
		}
		l.PVEMembers, err = pvesim.NewCluster(pveOpts, members, nil)
		if err == nil {
			l.PVE = l.PVEMembers[0]
		}
	} else {
		l.PVE, err = pvesim.New(pveOpts)
		l.PVEMembers = []*pvesim.Server{l.PVE}
	}
	if err != nil {
		return nil, fmt.Errorf("starting the Proxmox simulator: %w", err)
	}

	if l.NFS, err = nfs.Start(nfs.Options{Dir: filepath.Join(o.Dir, "nfs-export"), ExportPath: "/export/k8s", Log: o.Log}); err != nil {
		return nil, fmt.Errorf("starting the NFS server: %w", err)
	}
	// The real Cilium chart from the pinned Cilium source: the real
	// scheduler then places its pods as on a real cluster.
	ciliumChart, err := kb.CiliumChart(ctx)
	if err != nil {
		return nil, err
	}
	if l.Charts, err = chartrepo.Start(chartrepo.Options{Log: o.Log, Charts: []string{ciliumChart}, AlsoAs: StandInVersions}); err != nil {
		return nil, fmt.Errorf("starting the chart repository: %w", err)
	}
	src, err := fluxmanifests.SourcesFromBinaries(ctx, kb)
	if err != nil {
		return nil, err
	}
	tarball, err := fluxTarball(src)
	if err != nil {
		return nil, err
	}
	if l.Manifest, err = fluxmanifests.Serve(fluxmanifests.ServeOptions{Version: config.DefaultFluxVersion, Tarball: tarball, Log: o.Log}); err != nil {
		return nil, err
	}
	if l.gitDir, err = demoRepo(filepath.Join(o.Dir, "homelab")); err != nil {
		return nil, err
	}
	if l.configPath, err = l.writeConfig(); err != nil {
		return nil, err
	}

	// The provisioner runs beside each control plane the lab starts (a
	// restore starts a new one after the old one lost its etcd).
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l.cancel = cancel
	go func() {
		defer close(l.done)
		for {
			kc, lost, err := l.Kube.WaitGeneration(bg)
			if bg.Err() != nil {
				return
			}
			if err == nil {
				l.runProvisioner(bg, kc, lost)
			}
			select {
			case <-lost:
			case <-bg.Done():
				return
			}
		}
	}()
	l.log.Info().Str("config", l.configPath).Str("subnet", l.prefix.String()).Str("proxmox", l.PVE.APIURL()).Msg("lab up")
	return l, nil
}

// runProvisioner starts the NFS provisioner stand-in against kc and stops
// it when that control plane is lost.
func (l *Lab) runProvisioner(ctx context.Context, kc *kube.Cluster, lost <-chan struct{}) {
	p, err := nfsprovisioner.Start(ctx, nfsprovisioner.Options{Client: kc.Client(), NFSPort: l.NFS.Port(), Log: l.opts.Log})
	if err != nil {
		l.log.Error().Err(err).Msg("starting the NFS provisioner stand-in")
		return
	}
	l.provMu.Lock()
	l.prov = p
	l.provMu.Unlock()
	go func() {
		select {
		case <-lost:
		case <-ctx.Done():
			return // Stop stops it
		}
		l.provMu.Lock()
		if l.prov == p {
			l.prov = nil
		}
		l.provMu.Unlock()
		p.Stop()
	}()
}

func (l *Lab) bootNode(ev pvesim.VMEvent) error {
	if !ev.IPv4.IsValid() {
		return fmt.Errorf("VM %d has no static cloud-init address: Talos' nocloud image would have no IP", ev.VMID)
	}
	if ev.Isolated {
		// The VM runs, but its VLAN never leaves the host (pvesim
		// VMEvent.Isolated): no node answers on its address.
		return nil
	}
	disks := make([]talossim.Disk, 0, len(ev.Disks))
	for _, d := range ev.Disks {
		disks = append(disks, talossim.Disk{Bus: d.Bus, Size: uint64(d.SizeBytes), Serial: d.Serial})
	}
	spec := talossim.NodeSpec{IP: ev.IPv4.Addr().String(), Hostname: ev.Name, Disks: disks, MAC: ev.MAC, VMID: ev.VMID, MemoryBytes: uint64(ev.MemoryMiB) << 20}
	// The extra NICs' static cloud-init addresses, on eth<N> for netN
	// (the names qemu-server's network-config gives them).
	for _, nic := range ev.NICs {
		if nic.IPv4.IsValid() {
			spec.Addresses = append(spec.Addresses, talossim.Address{Link: "eth" + strings.TrimPrefix(nic.Key, "net"), Prefix: nic.IPv4})
		}
	}
	spec.Firmware = l.firmware(ev.Firmware)
	// A first disk imported from the factory's disk image boots that
	// image's Talos (the VM then has no ISO to boot).
	if len(ev.Disks) > 0 && ev.Disks[0].ImportURL != "" {
		version, exts, ok, err := l.Factory.DiskImage(ev.Disks[0].ImportURL)
		if err != nil {
			return fmt.Errorf("VM %d: the disk image it was imported from: %w", ev.VMID, err)
		}
		if ok {
			spec.Image = &talossim.DiskImage{Version: version, Extensions: exts}
		}
	}
	n, err := l.Talos.BootNode(context.Background(), spec)
	if err == nil && l.opts.OnNodeBoot != nil {
		l.opts.OnNodeBoot(n)
	}
	return err
}

// guestAgent: the QEMU guest agent answers in a VM whose Talos runs the
// qemu-guest-agent extension.
func (l *Lab) guestAgent(vmid int) bool {
	for _, n := range l.Talos.Nodes() {
		if n.VMID() == vmid {
			return n.RunsExtension("qemu-guest-agent")
		}
	}
	return false
}

func (l *Lab) stopNode(ev pvesim.VMEvent) {
	if ev.IPv4.IsValid() {
		_ = l.Talos.StopNode(ev.IPv4.Addr().String())
	}
}

// wipeNode: a destroyed VM's disks are gone, and with them what Talos
// installed on them.
func (l *Lab) wipeNode(ev pvesim.VMEvent) {
	if ev.IPv4.IsValid() {
		l.Talos.WipeDisk(ev.IPv4.Addr().String())
	}
}

func (l *Lab) addr(last byte) string { return talossim.HostAddr(l.prefix, last) }

// writeConfig writes the cluster config pointing at the lab, and the API
// token into a 0600 file next to it (never into the config).
func (l *Lab) writeConfig() (string, error) {
	o := l.opts
	id, secret := l.PVE.Token()
	tokenFile := filepath.Join(o.Dir, "pve-token")
	if err := fsutil.WriteAtomic(tokenFile, []byte(secret+"\n"), 0o600); err != nil {
		return "", err
	}
	caFile := filepath.Join(o.Dir, "factory-ca.pem")
	if err := fsutil.WriteAtomic(caFile, l.Factory.CAPEM(), 0o644); err != nil {
		return "", err
	}
	endpointHost, vip := l.addr(11), ""
	if o.VIP {
		endpointHost, vip = l.addr(10), l.addr(10)
	}
	var nodes strings.Builder
	for i := 0; i < o.ControlPlanes; i++ {
		fmt.Fprintf(&nodes, "  - {name: cp-%d, role: controlplane, vmid: %d, ip: %s, cores: 2, memoryMiB: 2048, diskGiB: 20}\n", i+1, 701+i, l.addr(byte(11+i)))
	}
	for i := 0; i < o.Workers; i++ {
		fmt.Fprintf(&nodes, "  - {name: wk-%d, role: worker, vmid: %d, ip: %s, cores: 2, memoryMiB: 2048, diskGiB: 20}\n", i+1, 711+i, l.addr(byte(21+i)))
	}
	snapPort, err := stablePort()
	if err != nil {
		return "", err
	}
	cfg := fmt.Sprintf(`# Written by "bootstrap-lab up": a homelab without hardware. Proxmox and
# Talos are simulated on %[1]s; the Kubernetes control plane, the Flux
# controllers, the NFS server and the chart repository are real local
# processes. Run: bootstrap run --config %[2]s --stage all
cluster:
  name: lab
  talosVersion: %[21]s
  endpoint: https://%[3]s:6443
  factory: %[10]s
  factoryCAFile: %[11]s
  vip: %[4]q
  network:
    cidr: %[1]s
    gateway: %[5]s
    nameservers: [%[5]s]
proxmox:
  url: %[6]s
  node: %[7]s
  tokenID: %[8]s
  tokenSecretFile: %[19]s
  tlsFingerprint: %[9]q
  diskStorage: local-lvm
  isoStorage: local
  bridge: vmbr0
%[22]snodes:
%[12]sstorage:
  nfs:
    server: %[13]s
    path: /export/k8s
    chartRepo: %[14]s
    probe: {mountPort: %[15]d, nfsPort: %[15]d, timeout: 10s}
cni:
  name: %[16]s
  cilium: {chartRepo: %[14]s}
flux:
  manifests: %[17]s
  localSnapshot:
    enabled: true
    source: %[20]s
    listen: 127.0.0.1:%[18]d
    url: http://127.0.0.1:%[18]d/homelab.git
    refresh: 0s
postcheck:
  pvcTimeout: 1m
  timeout: 3m
`, l.prefix, filepath.Base(o.ConfigPath), endpointHost, vip, l.addr(1), l.PVE.APIURL(), l.PVE.NodeName(), id, l.PVE.Fingerprint(),
		l.Factory.URL(), abs(caFile), nodes.String(), l.NFS.Host(), l.Charts.URL(), l.NFS.Port(), o.CNI, l.Manifest.URL(), snapPort,
		abs(tokenFile), abs(l.gitDir), o.TalosVersion, l.proxmoxOptionLines())
	if o.KubernetesVersion != "" {
		cfg = strings.Replace(cfg, "  talosVersion: "+o.TalosVersion+"\n", "  talosVersion: "+o.TalosVersion+"\n  kubernetesVersion: "+o.KubernetesVersion+"\n", 1)
	}
	if o.ServiceAccountKey != "" {
		cfg = strings.Replace(cfg, "  talosVersion: "+o.TalosVersion+"\n", "  talosVersion: "+o.TalosVersion+"\n  serviceAccountKey: "+o.ServiceAccountKey+"\n", 1)
	}
	if o.FluxVersion != "" {
		cfg = strings.Replace(cfg, "flux:\n", "flux:\n  version: "+o.FluxVersion+"\n", 1)
	}
	if err := fsutil.WriteAtomic(o.ConfigPath, []byte(cfg), 0o644); err != nil {
		return "", err
	}
	return o.ConfigPath, nil
}

// StandInVersions are the versions the lab's chart repository serves its
// stand-in charts at besides their own: the NFS provisioner's previous
// release too, so a chart bump can be rolled out (by the infra stage or by
// a Flux HelmRelease).
var StandInVersions = map[string][]string{"nfs-subdir-external-provisioner": {"4.0.17"}}

// demoRepo creates the git work tree Flux syncs from (./infra with a
// namespace and a ConfigMap), once.
func demoRepo(dir string) (string, error) {
	if _, err := os.Stat(filepath.Join(dir, ".git")); err == nil {
		return dir, nil
	}
	files := map[string]string{
		"infra/kustomization.yaml": "resources:\n  - namespace.yaml\n  - welcome.yaml\n",
		"infra/namespace.yaml":     "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: homelab\n",
		"infra/welcome.yaml":       "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: welcome\n  namespace: homelab\ndata:\n  message: synced by Flux from the lab's git snapshot\n",
		"README.md":                "Demo homelab repository for `bootstrap-lab`. Flux applies ./infra.\n",
	}
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	if out, err := exec.Command("git", "-C", dir, "init", "-q", "-b", "main").CombinedOutput(); err != nil {
		return "", fmt.Errorf("git init %s: %v: %s", dir, err, out)
	}
	return dir, nil
}

// Stop stops everything the lab started; it is safe to call twice.
func (l *Lab) Stop() error {
	var errs []error
	if l.cancel != nil {
		l.cancel()
		<-l.done
	}
	l.provMu.Lock()
	if l.prov != nil {
		l.prov.Stop()
		l.prov = nil
	}
	l.provMu.Unlock()
	if l.Kube != nil {
		errs = append(errs, l.Kube.Stop())
	}
	if l.Talos != nil {
		errs = append(errs, l.Talos.Close())
	}
	for _, m := range l.PVEMembers {
		errs = append(errs, m.Close())
	}
	if l.NFS != nil {
		errs = append(errs, l.NFS.Close())
	}
	if l.Charts != nil {
		errs = append(errs, l.Charts.Close())
	}
	if l.Manifest != nil {
		errs = append(errs, l.Manifest.Close())
	}
	if l.Factory != nil {
		errs = append(errs, l.Factory.Stop())
	}
	return errors.Join(errs...)
}

func abs(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// stablePort returns a port that is free now and stays so for a while: the
// snapshot server binds it long after the lab wrote it into the config. A
// port from the kernel's ephemeral range (what :0 gives) is soon taken by
// some outgoing connection, so it is picked below that range.
func stablePort() (int, error) {
	lo := ephemeralLow()
	for range 200 {
		port := 10000 + rand.IntN(max(lo-10000, 1))
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		l.Close()
		return port, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow is the lowest local port the kernel gives outgoing
// connections (Linux's default when it cannot be read).
func ephemeralLow() int {
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if lo, err := strconv.Atoi(f[0]); err == nil && lo > 10000 {
				return lo
			}
		}
	}
	return 32768
}

// fluxTarballs keeps the Flux manifests tarball each set of sources built
// in this process: the same pinned modules build the same bytes, and a
// test binary starts dozens of labs (kustomize's build of them was an
// eighth of the e2e test binary's CPU in a pipeline test).
var fluxTarballs struct {
	sync.Mutex
	built map[string][]byte
}

func fluxTarball(src fluxmanifests.Sources) ([]byte, error) {
	key := fmt.Sprintf("%#v", src)
	fluxTarballs.Lock()
	defer fluxTarballs.Unlock()
	if b, ok := fluxTarballs.built[key]; ok {
		return b, nil
	}
	b, err := fluxmanifests.Build(src)
	if err != nil {
		return nil, err
	}
	if fluxTarballs.built == nil {
		fluxTarballs.built = map[string][]byte{}
	}
	fluxTarballs.built[key] = b
	return b, nil
}

// pveMemberNames are the lab's Proxmox node names for hosts members.
func pveMemberNames(hosts int) []string {
	if hosts <= 1 {
		return []string{"pve"}
	}
	var out []string
	for i := range hosts {
		out = append(out, fmt.Sprintf("pve%d", i+1))
	}
	return out
}
