// Package talossim simulates the Talos machine API (apid) of a set of
// nodes, over real gRPC with TLS 1.3, so the talos package's product code
// runs unchanged against it. Each node listens on its own address
// (<ip>:50000). A node boots into maintenance mode (self-signed
// certificate, no client certificate, the os:reader role), accepts a
// machine config parsed and validated by the real machinery loader, restarts
// its API with mutual TLS whose CA is taken from that config and only then
// installs (the API answers in configured mode while the installer runs),
// reboots (listener closed), and boots its installed system: the boot
// sequence starts cri and, on control planes, waits for etcd. Configured
// nodes answer Version, ApplyConfiguration (dry-run diff,
// AUTO/NO_REBOOT/REBOOT/STAGED, immediate or reboot as CanApplyImmediate
// decides), Bootstrap (once, then AlreadyExists; FailedPrecondition until
// cri is up), EtcdMemberList for the cluster, ServiceList with etcd's join
// and failure states, Reboot, Kubeconfig, and COSI resources (disks,
// MachineStatus, StaticPodStatus). Behaviours are read from
// siderolabs/talos at v1.13.3; docs/fidelity.md lists them with their
// sources.
//
// The Kubernetes side (an API server that the kubeconfig reaches, Nodes that
// register) is delegated to a Cluster implementation.
package talossim

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/siderolabs/talos/pkg/machinery/constants"

	"github.com/homelab/bootstrap/factory"
	"github.com/homelab/bootstrap/lab/imagefactory"
)

// Profile is a timing model of a node. Durations are multiplied by
// Options.TimeScale.
type Profile struct {
	Name string
	// Boot: VM started → maintenance API up.
	Boot time.Duration
	// Install: config accepted in maintenance mode → install done.
	Install time.Duration
	// Reboot: API down → API up again.
	Reboot time.Duration
	// BootstrapReady: configured boot → Bootstrap allowed.
	BootstrapReady time.Duration
	// EtcdStart: Bootstrap accepted → etcd healthy on that node.
	EtcdStart time.Duration
	// EtcdJoin: etcd up and node configured → the node is a healthy member.
	EtcdJoin time.Duration
	// KubeletReady: configured boot → kubelet healthy.
	KubeletReady time.Duration
	// CallLatency is added to every RPC.
	CallLatency time.Duration
	// ApplyLatency is added to every ApplyConfiguration.
	ApplyLatency time.Duration
	// ApidRestart: maintenance apply accepted → apid serves mutual TLS
	// with the applied config's CA, before the install sequence runs
	// (internal/app/machined/pkg/runtime/v1alpha1/v1alpha1_sequencer.go).
	ApidRestart time.Duration
	// BootSequence: configured boot → MachineStatus stage running on a
	// worker (a control plane's boot sequence also waits for etcd, as
	// StartAllServices waits for every service it started to be up).
	BootSequence time.Duration
	// RebootStart: a reboot-mode apply or a Reboot call → API down (the
	// reboot sequence stops pods and services first).
	RebootStart time.Duration
	// FailedInstallReboot: a failed install → reboot ("rebooting in 10
	// seconds", internal/app/machined/main.go).
	FailedInstallReboot time.Duration
	// FailedSequenceReboot: an upgrade or reset sequence that failed after
	// the node booted → its reboot into the system it ran. machined's
	// runEntrypoint takes the sequence's FATAL event as fatal and
	// returns, its deferred calls shut the services down (apid with them:
	// the API goes away after RebootStart), then handle() reverts the
	// bootloader and counts "rebooting in %d seconds" down from 10, a
	// second each, before it reboots (internal/app/machined/main.go at
	// v1.13.9 and v1.14.0-rc.1). The reboot itself takes Reboot more.
	FailedSequenceReboot time.Duration
	// EtcdJoinTimeout: how long a control plane's etcd tries to join a
	// cluster that was never bootstrapped before its service fails
	// (constants.EtcdJoinTimeout, 30 min).
	EtcdJoinTimeout time.Duration
	// EtcdJoinRetry: how long a control plane whose member add etcd
	// refused waits before it asks again (services/etcd.go
	// buildInitialCluster at v1.13.3: retry.Constant with 3 s units and
	// 1 s of jitter; the jitter is not simulated). Zero: 3 s.
	EtcdJoinRetry time.Duration
}

// Profiles by name.
var (
	// ProfileInstant keeps every transition but makes it as short as a test
	// can still observe.
	ProfileInstant = Profile{
		Name: "instant", Boot: 0, Install: 20 * time.Millisecond, Reboot: 30 * time.Millisecond,
		BootstrapReady: 0, EtcdStart: 30 * time.Millisecond, EtcdJoin: 30 * time.Millisecond,
		KubeletReady: 40 * time.Millisecond, ApidRestart: 5 * time.Millisecond, BootSequence: 10 * time.Millisecond,
		RebootStart: 5 * time.Millisecond, FailedInstallReboot: 10 * time.Millisecond,
		// Real machined counts 10 s down; a second, a hundred times the
		// instant reboot, keeps the order a real node shows to a client
		// polling every few milliseconds: the failure, the node away, then
		// its old version on a new boot.
		FailedSequenceReboot: time.Second,
		EtcdJoinRetry:        20 * time.Millisecond,
		// Long enough that no test waits that long before bootstrapping
		// by accident; tests of the failure set their own.
		EtcdJoinTimeout: time.Minute,
	}
	// ProfileN100 approximates a Proxmox VM on an Intel N100 mini PC
	// (2 vCPU, SSD): seconds to minutes per step.
	ProfileN100 = Profile{
		Name: "n100", Boot: 25 * time.Second, Install: 70 * time.Second, Reboot: 45 * time.Second,
		BootstrapReady: 8 * time.Second, EtcdStart: 20 * time.Second, EtcdJoin: 35 * time.Second,
		KubeletReady: 30 * time.Second, CallLatency: 3 * time.Millisecond, ApplyLatency: 400 * time.Millisecond,
		ApidRestart: 2 * time.Second, BootSequence: 15 * time.Second, RebootStart: 5 * time.Second,
		FailedInstallReboot: 10 * time.Second, FailedSequenceReboot: 10 * time.Second,
		EtcdJoinTimeout: constants.EtcdJoinTimeout,
		EtcdJoinRetry:   3 * time.Second,
	}
)

// ProfileByName returns "instant" or "n100".
func ProfileByName(name string) (Profile, error) {
	switch name {
	case "", ProfileInstant.Name:
		return ProfileInstant, nil
	case ProfileN100.Name:
		return ProfileN100, nil
	}
	return Profile{}, fmt.Errorf("unknown talossim profile %q (want instant or n100)", name)
}

// Options configures a simulator.
type Options struct {
	// Profile is the timing model (default ProfileInstant).
	Profile Profile
	// TimeScale multiplies every profile duration (default 1; 0.01 runs
	// the n100 profile a hundred times faster).
	TimeScale float64
	// Cluster is the simulated control plane (default a MemoryCluster
	// without kubeconfig).
	Cluster Cluster
	// Port every node listens on (default 50000, apid's port).
	Port int
	// TalosVersion of the ISO nodes boot (default v1.13.3). After an
	// install a node runs the version of its installer image's tag.
	TalosVersion string
	// DiscoveryUnreachable makes the discovery service unreachable: a
	// worker then finds trustd only through its cluster endpoint. Without
	// it, a worker whose config enables discovery finds the running
	// control planes of its cluster through it.
	DiscoveryUnreachable bool
	// Installer resolves an installer image to the system extensions a
	// node installed from it runs; pulled is false for an image that is
	// not the factory's (no extensions), an error fails the pull. Nil: no
	// image carries extensions.
	Installer func(image string) (exts []imagefactory.Extension, pulled bool, err error)
	// PowerOff is the hypervisor's side of a node shutting itself down
	// (a graceful reset without reboot): the VM whose guest powered off
	// stops. Nil: the node is only stopped here (StopNode).
	PowerOff func(vmid int)
	Log      zerolog.Logger
}

// Sim is a set of simulated Talos nodes sharing a control plane.
type Sim struct {
	opts Options

	mu        sync.Mutex
	nodes     map[string]*Node
	installed map[string]installedSystem // the system disk of each VM, by IP: survives StopNode
	etcd      map[string]*etcdCluster
	signers   map[string]signerEntry // running control planes' CAs, by IP
	// splitBrains lists nodes that accepted Bootstrap while their
	// cluster's etcd already ran elsewhere.
	splitBrains []string
	closed      bool
}

// New returns an empty simulator; boot nodes with BootNode.
func New(opts Options) *Sim {
	if opts.Profile.Name == "" {
		opts.Profile = ProfileInstant
	}
	if opts.TimeScale <= 0 {
		opts.TimeScale = 1
	}
	if opts.Profile.EtcdJoinRetry <= 0 {
		opts.Profile.EtcdJoinRetry = 3 * time.Second
	}
	if opts.Cluster == nil {
		opts.Cluster = NewMemoryCluster(nil)
	}
	if opts.Port == 0 {
		opts.Port = constants.ApidPort
	}
	if opts.TalosVersion == "" {
		opts.TalosVersion = "v1.13.3"
	}
	return &Sim{opts: opts, nodes: map[string]*Node{}, installed: map[string]installedSystem{}, etcd: map[string]*etcdCluster{}}
}

// Cluster returns the simulated control plane.
func (s *Sim) Cluster() Cluster { return s.opts.Cluster }

// Port is the port nodes listen on.
func (s *Sim) Port() int { return s.opts.Port }

func (s *Sim) scaled(d time.Duration) time.Duration {
	return time.Duration(float64(d) * s.opts.TimeScale)
}

// Disk is a VM disk as the Proxmox side reports it.
type Disk struct {
	// Bus is "scsi", "sata", "ide" or "virtio"; it decides the device name
	// the node sees (/dev/sdX or /dev/vdX).
	Bus  string
	Size uint64
	// Model reported over COSI (default "QEMU HARDDISK").
	Model string
	// Serial is the drive's serial (Proxmox serial=), "" for none: the
	// Disk resource's serial, and the end of its udev by-id link.
	Serial string
}

// NodeSpec is what the hypervisor knows about a VM that just started.
type NodeSpec struct {
	// IP the node's API listens on (the VM's cloud-init/static address).
	IP string
	// Hostname of the VM (informational until the config sets one).
	Hostname string
	// Disks in bus order; none means one 32 GiB SCSI disk.
	Disks []Disk
	// MAC of the VM's NIC (informational).
	MAC string
	// VMID of the VM (informational).
	VMID int
	// Wipe boots from empty disks even if this IP's VM was installed before
	// (a reinstalled VM).
	Wipe bool
	// TalosVersion of the ISO this VM boots (default Options.TalosVersion).
	TalosVersion string
	// MemoryBytes is the VM's RAM (default 2 GiB).
	MemoryBytes uint64
	// Image, when set, says the VM's first disk was created from the
	// Image Factory's nocloud disk image (Proxmox import-from) and not
	// written since: a disk without a config boots the image's Talos
	// with its META partition found (see image.go). Nil: an empty disk
	// boots the ISO.
	Image *DiskImage
	// Addresses are the static addresses of the VM's extra NICs (its
	// cloud-init ipconfig1…), published as AddressStatus resources.
	Addresses []Address
	// Firmware is the VM's UEFI, Secure Boot keys and TPM, and whether
	// its ISO is the Secure Boot one (see secureboot.go).
	Firmware Firmware
}

// BootNode starts a node at spec.IP, as a VM that was just powered on. A
// VM that installed Talos before (same IP, not wiped) boots configured
// from its disk; otherwise it boots the ISO into maintenance mode. The
// node's API comes up after the profile's Boot time.
func (s *Sim) BootNode(ctx context.Context, spec NodeSpec) (*Node, error) {
	addr, err := netip.ParseAddr(spec.IP)
	if err != nil {
		return nil, fmt.Errorf("talossim: node IP %q: %w", spec.IP, err)
	}
	spec.IP = addr.String()
	if len(spec.Disks) == 0 {
		spec.Disks = []Disk{{Bus: "scsi", Size: 32 << 30}}
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errors.New("talossim: simulator closed")
	}
	if _, ok := s.nodes[spec.IP]; ok {
		s.mu.Unlock()
		return nil, fmt.Errorf("talossim: a node already runs at %s", spec.IP)
	}
	if spec.Wipe {
		delete(s.installed, spec.IP)
	}
	if spec.TalosVersion == "" {
		spec.TalosVersion = s.opts.TalosVersion
	}
	installed := s.installed[spec.IP].clone()
	if installed.config == nil && spec.Image != nil {
		// What the imported disk holds until a config is written to it.
		installed = installedSystem{fromImage: true, version: spec.Image.Version, extensions: slices.Clone(spec.Image.Extensions),
			imageBytes: uint64(factory.DiskImageBytes(spec.Image.Version))}
	}
	n, err := newNode(s, spec)
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	s.nodes[spec.IP] = n
	s.mu.Unlock()
	n.powerOn(installed)
	return n, nil
}

// StopNode powers the node at ip off (its API closes). Its disk is kept:
// booting the same IP again resumes from it.
func (s *Sim) StopNode(ip string) error {
	s.mu.Lock()
	n, ok := s.nodes[ip]
	delete(s.nodes, ip)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("talossim: no node at %s", ip)
	}
	n.powerOff()
	return nil
}

// Node returns the node at ip.
func (s *Sim) Node(ip string) (*Node, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[ip]
	return n, ok
}

// Nodes returns the running nodes sorted by IP.
func (s *Sim) Nodes() []*Node {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Node, 0, len(s.nodes))
	for _, n := range s.nodes {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b *Node) int { return strings.Compare(a.ip, b.ip) })
	return out
}

// ControlPlaneHealthy reports the simulated control plane's health.
func (s *Sim) ControlPlaneHealthy(ctx context.Context) bool { return s.opts.Cluster.Healthy(ctx) }

// Close powers every node off.
func (s *Sim) Close() error {
	s.mu.Lock()
	s.closed = true
	nodes := make([]*Node, 0, len(s.nodes))
	for ip, n := range s.nodes {
		nodes = append(nodes, n)
		delete(s.nodes, ip)
	}
	s.mu.Unlock()
	for _, n := range nodes {
		n.powerOff()
	}
	return nil
}

// installedSystem is what an install put on a VM's system disk.
type installedSystem struct {
	config  []byte
	version string // the installer image's tag
	// extensions are those of the installer image (ExtensionStatus).
	extensions []imagefactory.Extension
	// recoverySnapshot is an etcd snapshot uploaded with EtcdRecover, kept
	// on the EPHEMERAL partition (/var/lib/etcd.snapshot) until a
	// recover_etcd bootstrap consumes it.
	recoverySnapshot []byte
	// fromImage: the system disk was created from the factory's disk image
	// (its partitions, META included, came with it), not by an install.
	fromImage bool
	// imageBytes is that image's size, the space its partitions take at
	// the start of the disk (by the Talos version it was built for).
	imageBytes uint64
	// secureBoot: the installer was a Secure Boot one, so the disk boots
	// a signed UKI (see secureboot.go).
	secureBoot bool
	// keysEnrolled: the VM's EFI vars hold the keys the Secure Boot ISO
	// enrolled (they stay through installs and upgrades).
	keysEnrolled bool
}

func (i installedSystem) clone() installedSystem {
	return installedSystem{config: slices.Clone(i.config), version: i.version, extensions: slices.Clone(i.extensions),
		recoverySnapshot: slices.Clone(i.recoverySnapshot), fromImage: i.fromImage, imageBytes: i.imageBytes, secureBoot: i.secureBoot, keysEnrolled: i.keysEnrolled}
}

// pullInstaller is what pulling an installer image yields: its system
// extensions (none for an image that is not the factory's).
func (s *Sim) pullInstaller(image string) ([]imagefactory.Extension, error) {
	if s.opts.Installer == nil {
		return nil, nil
	}
	exts, _, err := s.opts.Installer(image)
	return exts, err
}

func (s *Sim) persist(ip string, sys installedSystem) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.installed[ip] = sys.clone()
}

func (s *Sim) persistConfig(ip string, cfg []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sys := s.installed[ip]
	sys.config = slices.Clone(cfg)
	s.installed[ip] = sys
}

func (s *Sim) installedSystem(ip string) installedSystem {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.installed[ip].clone()
}

// Installed returns the config on the disk of the VM at ip (nil if none).
func (s *Sim) Installed(ip string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.installed[ip].config)
}

// InstalledVersion returns the Talos version installed on the VM at ip
// ("" if none).
func (s *Sim) InstalledVersion(ip string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.installed[ip].version
}

// SplitBrains lists the IPs of control planes that were bootstrapped while
// their cluster's etcd already ran on another node (a second etcd cluster).
func (s *Sim) SplitBrains() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.splitBrains)
}

// Bootstraps counts accepted Bootstrap calls over all nodes, including
// nodes that were stopped.
func (s *Sim) Bootstraps() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.etcd) + len(s.splitBrains)
}
