package talossim

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/rs/zerolog"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc"
)

// Phase is where a node is in its life.
type Phase string

// Node phases.
const (
	PhaseOff         Phase = "off"
	PhaseBooting     Phase = "booting"
	PhaseMaintenance Phase = "maintenance"
	// PhaseInstalling: the config was accepted in maintenance mode; apid
	// restarts with mutual TLS and the installer runs. A control plane
	// answers in configured mode meanwhile; a worker only once trustd
	// signs its certificate.
	PhaseInstalling Phase = "installing"
	PhaseRebooting  Phase = "rebooting"
	// PhaseRunning is the installed system, booted (MachineStatus stage
	// booting, then running when its boot sequence ends). A worker stays
	// without API until a control plane of its cluster can sign its
	// certificate (trustd).
	PhaseRunning Phase = "running"
)

// Faults injected into a node. Durations here are real time, not scaled.
type Faults struct {
	// RefuseConnections closes the node's API while set (a firewall, a
	// powered-off VM that the hypervisor thinks is on).
	RefuseConnections bool
	// ApplyDelay makes ApplyConfiguration answer this much later (slow
	// apply; a caller's timeout may fire first while the node goes ahead).
	ApplyDelay time.Duration
	// CrashDuringInstall makes the next N installs fail: the node reboots
	// from the ISO into maintenance mode without a config.
	CrashDuringInstall int
	// ExtraRebootDelay lengthens every reboot (a slow firmware/disk).
	ExtraRebootDelay time.Duration
	// BootstrapNotReady makes the next N Bootstrap calls answer
	// FailedPrecondition "time is not in sync yet".
	BootstrapNotReady int
	// InstallerPullFails makes the next N installs fail to pull the
	// installer image: the node reboots into the ISO (maintenance).
	InstallerPullFails int
	// UpgradePullFails makes the next N Upgrade calls fail to pull the
	// installer image: the RPC errors and the node keeps its version.
	UpgradePullFails int
	// UpgradeSequenceFails makes the next N accepted upgrades fail inside
	// their sequence, after the answer (as a failing installer does): its
	// stage reads rebooting, its API goes away and machined reboots it
	// into the version it ran (failSequenceLocked).
	UpgradeSequenceFails int
	// SequenceFailureUnseen makes the next N failed sequences publish
	// neither their STOP nor their FATAL event: a client that follows
	// the node's events sees none, as when apid shuts down before it
	// delivers them and the reboot empties the ring. Only what the node
	// runs after its reboot (its version, its boot time) tells.
	SequenceFailureUnseen int
	// MissingImages are image references no registry serves: ImagePull
	// answers NotFound for them.
	MissingImages []string
}

// Counters are per-node call counts.
type Counters struct {
	// Calls counts every RPC that reached the node.
	Calls int
	// Applies counts accepted ApplyConfiguration calls that were not dry runs.
	Applies int
	// MaintenanceApplies is the part of Applies made in maintenance mode.
	MaintenanceApplies int
	// DryRuns counts dry-run ApplyConfiguration calls.
	DryRuns int
	// BootstrapCalls counts every Bootstrap call.
	BootstrapCalls int
	// Bootstraps counts accepted Bootstrap calls (etcd started).
	Bootstraps int
	// Installs counts completed installs; InstallCrashes failed ones.
	Installs       int
	InstallCrashes int
	// Reboots counts reboots (after installs and applies).
	Reboots int
	// KubeconfigCalls counts Kubeconfig calls.
	KubeconfigCalls int
	// RebootCalls counts accepted Reboot calls.
	RebootCalls int
	// UpgradeCalls counts every Upgrade call; Upgrades the accepted ones.
	UpgradeCalls int
	Upgrades     int
	// FailedUpgrades counts accepted upgrades whose sequence failed after
	// the answer (the installer's pre-flight check).
	FailedUpgrades int
	// LifecycleUpgrades counts LifecycleService.Upgrade calls (also in
	// UpgradeCalls).
	LifecycleUpgrades int
	// RecoverUploads counts complete EtcdRecover uploads; Recoveries the
	// accepted Bootstrap calls with recover_etcd.
	RecoverUploads int
	Recoveries     int
	// EtcdAddsRefused counts the times etcd refused to add this control
	// plane's member (its strict reconfiguration check) while it joined.
	EtcdAddsRefused int
	// Resets counts accepted Reset calls.
	Resets int
	// FailedResets counts accepted resets whose sequence failed after the
	// answer (a control plane's leave): machined rebooted the node into
	// the system it ran.
	FailedResets int
	// ImagePulls counts the images pulled through the API (ImagePull and
	// ImageService.Pull).
	ImagePulls int
	// ImageBoots counts maintenance applies that configured a node booted
	// from the factory's disk image in place: no install, no reboot.
	ImageBoots int
}

// Node is one simulated Talos machine.
type Node struct {
	sim  *Sim
	ip   string
	spec NodeSpec
	log  zerolog.Logger
	cosi state.State

	mu    sync.Mutex
	phase Phase
	gen   uint64 // bumped by every power or API transition; stale timers check it
	// staticPods are the control plane's static pods as last published;
	// mirrorSeq numbers their reports to a MirrorPodSyncer.
	staticPods map[string]StaticPod
	mirrorSeq  uint64
	// uncordonOnBoot: an upgrade cordoned the Node; the machine's
	// controllers uncordon it once it boots again (after the upgrade, or
	// the reboot that follows a failed one).
	uncordonOnBoot bool
	// images is the system containerd's image store as ImageService.Pull
	// fills it, by containerd instance and pinned reference; installing
	// is LifecycleService's lock (one install or upgrade at a time).
	images     map[string]pulledImage
	installing bool
	powered    bool
	wantUp     bool // the API should serve (subject to faults)
	srv        *grpc.Server
	lis        net.Listener
	mode       serveMode
	config     []byte
	parsed     config.Provider
	bootedAt   time.Time
	// bootTime is the current boot's /proc/stat btime in unix seconds, as
	// SystemStat answers it; every boot's is greater than the last.
	bootTime uint64
	// version is the Talos version running: the ISO's until an install,
	// then the installer image's tag.
	version string
	// stage is the MachineStatus stage (also published over COSI).
	stage runtime.MachineStage
	// etcdJoinDeadline is when a control plane's etcd stops trying to
	// join a cluster and fails (EtcdJoinTimeout after its boot).
	etcdJoinDeadline time.Time
	// etcdLeft: the node left its etcd cluster (EtcdLeaveCluster): its
	// etcd service is stopped and its data gone until it boots again.
	etcdLeft bool
	// sequenceStopped: a failed upgrade sequence stopped cri and what
	// depends on it (etcd, kubelet) and trustd, and unmounted EPHEMERAL,
	// before its installer ran (v1alpha1_sequencer.go Upgrade,
	// StopServicesEphemeral in v1alpha1_sequencer_tasks.go at v1.13.3);
	// or machined shut every service down after a failed sequence. They
	// stay down until the reboot that follows (failSequenceLocked).
	sequenceStopped   bool
	sequenceStoppedAt time.Time
	// etcdPeer mirrors, for readers that hold no node lock, whether the
	// node's etcd peers can reach it: powered, running its installed
	// system, its services not stopped by a failed sequence (see
	// refreshPeerLocked). etcd's membership checks read it under s.mu.
	etcdPeer atomic.Bool
	// fromImage: this boot runs Talos from a disk created from the
	// factory's disk image, META found (image.go): a maintenance apply
	// configures it in place, without install or reboot. bootBlocked says
	// why its configured boot cannot go on ("" when it can).
	fromImage   bool
	imageSys    installedSystem
	bootBlocked string
	// applying is set while an ApplyConfiguration is processed;
	// rebootPending once a reboot-mode apply or a Reboot was accepted.
	applying      bool
	rebootPending bool
	// events is machined's runtime event ring (see events.go); eventsWake
	// is closed when one is added.
	events     []runtimeEvent
	eventSeq   uint64
	eventsWake chan struct{}
	faults     Faults
	counters   Counters
	timers     map[*time.Timer]struct{}
	changed    chan struct{} // closed and replaced on every phase change
}

type serveMode int

const (
	serveMaintenance serveMode = iota
	serveConfigured
)

func newNode(s *Sim, spec NodeSpec) (*Node, error) {
	n := &Node{
		sim:     s,
		ip:      spec.IP,
		spec:    spec,
		log:     s.opts.Log.With().Str("sim_node", spec.IP).Logger(),
		phase:   PhaseOff,
		version: spec.TalosVersion,
		timers:  map[*time.Timer]struct{}{},
		changed: make(chan struct{}),
	}
	st, err := newDiskState(spec.Disks, spec.Image == nil)
	if err != nil {
		return nil, err
	}
	n.cosi = st
	publishAddresses(st, spec.Addresses)
	// Fail early when the address cannot be bound (not a local address,
	// already taken), not later in a timer.
	lis, err := net.Listen("tcp", n.addr())
	if err != nil {
		return nil, fmt.Errorf("talossim: node %s: %w", spec.IP, err)
	}
	lis.Close()
	return n, nil
}

func (n *Node) addr() string { return net.JoinHostPort(n.ip, strconv.Itoa(n.sim.opts.Port)) }

// IP is the node's address.
func (n *Node) IP() string { return n.ip }

// Addr is the node's API address (ip:port).
func (n *Node) Addr() string { return n.addr() }

// Phase returns the node's current phase.
func (n *Node) Phase() Phase {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.phase
}

// WaitPhase blocks until the node is in phase p or ctx ends.
func (n *Node) WaitPhase(ctx context.Context, p Phase) error {
	for {
		n.mu.Lock()
		cur, ch := n.phase, n.changed
		n.mu.Unlock()
		if cur == p {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s: waiting for phase %s (now %s): %w", n.ip, p, cur, ctx.Err())
		case <-ch:
		}
	}
}

// Config returns the config the node runs (nil in maintenance mode).
func (n *Node) Config() []byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.config)
}

// Hostname is the configured hostname, else the VM's name.
func (n *Node) Hostname() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.hostnameLocked()
}

func (n *Node) hostnameLocked() string {
	if n.parsed != nil {
		if hc := n.parsed.NetworkHostnameConfig(); hc != nil && hc.Hostname() != "" {
			return hc.Hostname()
		}
	}
	if n.spec.Hostname != "" {
		return n.spec.Hostname
	}
	return "talos-" + n.ip
}

func (n *Node) roleLocked() string {
	if n.parsed == nil || n.parsed.Machine() == nil {
		return ""
	}
	return n.parsed.Machine().Type().String()
}

func (n *Node) clusterIDLocked() string {
	if n.parsed == nil {
		return ""
	}
	return clusterID(n.parsed)
}

// Counters returns a copy of the node's counters.
func (n *Node) Counters() Counters {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.counters
}

// SetFaults replaces the node's faults. Clearing RefuseConnections opens
// the API again if the node is up.
func (n *Node) SetFaults(f Faults) {
	n.mu.Lock()
	n.faults = f
	var stop *grpc.Server
	var lis net.Listener
	if f.RefuseConnections {
		stop, lis = n.detachLocked()
	} else {
		n.serveLocked()
	}
	n.mu.Unlock()
	stopServer(stop, lis, false)
}

// Faults returns the node's current faults (counts decrease as they fire).
func (n *Node) Faults() Faults {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.faults
}

func (n *Node) setPhaseLocked(p Phase) {
	if n.phase == p {
		return
	}
	n.log.Debug().Str("from", string(n.phase)).Str("to", string(p)).Msg("talossim phase")
	n.phase = p
	n.refreshPeerLocked()
	close(n.changed)
	n.changed = make(chan struct{})
}

// refreshPeerLocked updates etcdPeer from the node's state; n.mu is held.
func (n *Node) refreshPeerLocked() {
	n.etcdPeer.Store(n.powered && n.phase == PhaseRunning && !n.sequenceStopped)
}

// after runs fn after d unless the node moved on (gen changed) or was
// powered off; fn runs with n.mu held.
func (n *Node) afterLocked(d time.Duration, fn func()) {
	gen := n.gen
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		n.mu.Lock()
		delete(n.timers, t)
		if n.gen != gen || !n.powered {
			n.mu.Unlock()
			return
		}
		fn()
		n.mu.Unlock()
	})
	n.timers[t] = struct{}{}
}

// Version is the Talos version the node runs.
func (n *Node) Version() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.version
}

// RunsExtension says whether the node's running system carries the
// system extension named name (by its manifest name, e.g.
// qemu-guest-agent): the installed image's extensions once it runs.
func (n *Node) RunsExtension(name string) bool {
	n.mu.Lock()
	running := n.phase == PhaseRunning
	n.mu.Unlock()
	if !running {
		return false
	}
	for _, e := range n.sim.installedSystem(n.ip).extensions {
		if e.Name == name {
			return true
		}
	}
	return false
}

// ServiceStates is the state of each service as ServiceList reports it
// now (e.g. "etcd" → "Running", "Finished"), for tests.
func (n *Node) ServiceStates() map[string]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]string{}
	for _, si := range n.servicesLocked(n.mode == serveMaintenance, time.Now()) {
		out[si.GetId()] = si.GetState()
	}
	return out
}

// VMID is the VM the node runs in.
func (n *Node) VMID() int { return n.spec.VMID }

// Stage is the node's MachineStatus stage.
func (n *Node) Stage() runtime.MachineStage {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stage
}

func (n *Node) powerOn(installed installedSystem) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.powered = true
	n.gen++
	n.setPhaseLocked(PhaseBooting)
	n.setStageLocked(runtime.MachineStageBooting)
	n.afterLocked(n.sim.scaled(n.sim.opts.Profile.Boot), func() { n.bootLocked(installed) })
}

func (n *Node) powerOff() {
	n.mu.Lock()
	n.powered = false
	n.refreshPeerLocked()
	n.wantUp = false
	n.gen++
	for t := range n.timers {
		t.Stop()
	}
	n.timers = map[*time.Timer]struct{}{}
	srv, lis := n.detachLocked()
	n.setPhaseLocked(PhaseOff)
	n.mu.Unlock()
	stopServer(srv, lis, true)
}

// BootTime is the node's current boot time in unix seconds, as SystemStat
// answers it (0 before its first boot).
func (n *Node) BootTime() uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.bootTime
}

// bootLocked brings the node up from what its disk holds: an installed
// system boots configured, nothing boots the ISO's maintenance mode.
func (n *Node) bootLocked(installed installedSystem) {
	n.gen++
	// A real reboot takes more than a second, so btime grows with every
	// boot; the simulator's may take milliseconds and keeps it growing.
	n.bootTime = max(uint64(time.Now().Unix()), n.bootTime+1)
	n.etcdLeft, n.sequenceStopped = false, false
	n.rebootPending, n.applying = false, false
	n.fromImage, n.bootBlocked = installed.fromImage, ""
	if why := n.firmwareRefusalLocked(installed); why != "" {
		// The firmware stops before Talos: no API, ever, this boot.
		n.log.Warn().Msg("talossim: " + why)
		n.wantUp = false
		n.setPhaseLocked(PhaseBooting)
		n.setStageLocked(runtime.MachineStageBooting)
		return
	}
	n.publishSecurityStateLocked(installed)
	if installed.fromImage {
		n.imageSys = installed.clone()
		publishSystemDisk(n.cosi, devPathFor(n.spec.Disks, 0))
	}
	if installed.config == nil {
		n.config, n.parsed = nil, nil
		n.version = n.spec.TalosVersion
		if installed.fromImage {
			n.version = installed.version
		}
		n.mode = serveMaintenance
		n.setPhaseLocked(PhaseMaintenance)
		n.setStageLocked(runtime.MachineStageMaintenance)
		n.wantUp = true
		n.serveLocked()
		return
	}
	parsed, err := configloader.NewFromBytes(installed.config)
	if err != nil {
		// What was installed was validated on apply; a node that cannot
		// read its disk falls back to the ISO.
		n.log.Error().Err(err).Msg("talossim: installed config unreadable, booting maintenance")
		n.bootLocked(installedSystem{})
		return
	}
	n.config, n.parsed = slices.Clone(installed.config), parsed
	n.version = installed.version
	n.mode = serveConfigured
	n.bootedAt = time.Now()
	if installed.fromImage {
		if blocked := imageDiskTooSmall(n.spec.Disks, installed.imageBytes); blocked != "" {
			// The boot sequence's diskSizeCheck waits for an EPHEMERAL
			// volume the disk has no room for: apid answers (with the
			// config's CA), nothing else starts.
			n.bootBlocked = blocked
			n.log.Warn().Msg("talossim: " + blocked)
			n.setPhaseLocked(PhaseBooting)
			n.setStageLocked(runtime.MachineStageBooting)
			n.wantUp = true
			n.serveLocked()
			return
		}
	}
	if failed := n.publishVolumesLocked(installed); failed != "" {
		// No STATE, no boot sequence past it (see secureboot.go).
		n.bootBlocked = failed
		n.log.Warn().Msg("talossim: " + failed)
		n.setPhaseLocked(PhaseBooting)
		n.setStageLocked(runtime.MachineStageBooting)
		n.wantUp = true
		n.serveLocked()
		return
	}
	n.etcdJoinDeadline = n.bootedAt.Add(n.sim.scaled(n.sim.opts.Profile.EtcdJoinTimeout))
	n.setPhaseLocked(PhaseRunning)
	n.setStageLocked(runtime.MachineStageBooting)
	n.wantUp = true
	n.serveLocked()
	n.serviceEventAtLocked(n.bootedAt.Add(n.sim.scaled(n.sim.opts.Profile.KubeletReady)), "kubelet")
	n.serviceEventAtLocked(n.bootedAt.Add(n.sim.scaled(n.sim.opts.Profile.BootstrapReady)), "cri")

	publishKubernetesConfig(n.cosi, imagesOf(n.parsed))
	publishManifests(n.cosi, n.parsed)
	publishUserVolumes(n.cosi, n.parsed)
	switch {
	case installed.fromImage:
		// EPHEMERAL is on the system disk, the one the image is on.
		publishImageEphemeral(n.cosi, n.spec.Disks[0].Size, installed.imageBytes, devPathFor(n.spec.Disks, 0))
	case n.parsed.Machine() != nil:
		disk, _, _ := n.installTargetLocked(n.parsed)
		for i := range n.spec.Disks {
			if devPathFor(n.spec.Disks, i) == disk {
				publishEphemeral(n.cosi, n.spec.Disks[i].Size, disk)
			}
		}
	}
	publishExtensions(n.cosi, installed.extensions)
	info := n.infoLocked()
	if info.Role == "controlplane" {
		n.sim.mu.Lock()
		n.sim.joinEtcd(n.clusterIDLocked(), n, info.Hostname, time.Now())
		n.sim.mu.Unlock()
	}
	n.afterLocked(n.sim.scaled(n.sim.opts.Profile.BootSequence), n.finishBootLocked)
	cluster := n.sim.opts.Cluster
	go func() {
		if err := cluster.NodeConfigured(context.Background(), info); err != nil {
			n.log.Warn().Err(err).Msg("talossim: control plane did not take the node")
		}
	}()
}

// finishBootLocked ends the boot sequence: StartAllServices waits until
// every service it started is up, on a control plane etcd too
// (v1alpha1_sequencer_tasks.go at v1.13.3), so a control plane's stage
// stays booting until its etcd runs. Talos is told at once: each
// service's condition (system.WaitForService) subscribes to the service
// runner's events (internal/app/machined/pkg/system/service_events.go
// waitEvent). The simulator checks again every etcdUpCheck until then.
func (n *Node) finishBootLocked() {
	if n.phase != PhaseRunning {
		return
	}
	if n.roleLocked() == "controlplane" && !n.etcdUpLocked(time.Now()) {
		n.afterLocked(etcdUpCheck, n.finishBootLocked)
		return
	}
	n.setStageLocked(runtime.MachineStageRunning)
	if n.uncordonOnBoot {
		n.uncordonOnBoot = false
		n.setCordonedLocked(n.hostnameLocked(), false)
	}
	if n.roleLocked() == "controlplane" {
		// kubelet runs the control plane's static pods once etcd is up.
		n.setStaticPodsLocked(imagesOf(n.parsed).staticPods, true)
	}
}

// etcdUpCheck spaces the simulator's checks for etcd running at the end
// of a control plane's boot sequence: short, as Talos learns it from an
// event, and not scaled.
const etcdUpCheck = 10 * time.Millisecond

// infoLocked identifies the node to the control plane.
func (n *Node) infoLocked() NodeInfo {
	info := NodeInfo{Hostname: n.hostnameLocked(), IP: n.ip, Role: n.roleLocked()}
	if n.parsed != nil && n.parsed.Machine() != nil {
		info.KubeletImage = kubeletImage(n.parsed)
	}
	return info
}

// etcdUpLocked reports whether this control plane's etcd member runs.
func (n *Node) etcdUpLocked(now time.Time) bool {
	s := n.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	_, m := s.etcdView(n.clusterIDLocked(), n.ip)
	return m != nil && !m.readyAt.After(now) && !n.sequenceStopped
}

// rebootLocked takes the API down for the reboot time and boots from disk.
func (n *Node) rebootLocked() {
	n.gen++
	n.counters.Reboots++
	n.wantUp = false
	srv, lis := n.detachLocked()
	go stopServer(srv, lis, false)
	n.setPhaseLocked(PhaseRebooting)
	n.setStageLocked(runtime.MachineStageRebooting)
	// The event ring lives in machined's memory: the next boot starts
	// with an empty one.
	n.events = nil
	// Whether the system containerd's images outlive a reboot is
	// unverified; talossim forgets them, so a client must pull the
	// installer before every LifecycleService.Upgrade (as talosctl does).
	n.images = nil
	removeStaticPods(n.cosi, n.hostnameLocked())
	// The mirror pods stay in the API (no kubelet to remove them); the
	// node lifecycle controller marks them not Ready with the node.
	n.staticPods = nil
	d := n.sim.scaled(n.sim.opts.Profile.Reboot) + n.faults.ExtraRebootDelay
	n.afterLocked(d, func() { n.bootLocked(n.sim.installedSystem(n.ip)) })
}

// scheduleRebootLocked accepts a reboot: the API keeps answering while the
// reboot sequence stops pods and services (an apply now gets
// FailedPrecondition), then goes down.
func (n *Node) scheduleRebootLocked() {
	n.rebootPending = true
	// The reboot sequence's start (Controller.run publishes it:
	// v1alpha1_controller.go at v1.13.3) sets the stage
	// (machine_status.go).
	n.publishEventLocked("", &machine.SequenceEvent{Sequence: "reboot", Action: machine.SequenceEvent_START})
	n.setStageLocked(runtime.MachineStageRebooting)
	n.afterLocked(n.sim.scaled(n.sim.opts.Profile.RebootStart), n.rebootLocked)
}

// leaveMaintenanceLocked is what every maintenance apply does first:
// maintenance's apid stops, and the node takes the config and will serve
// it in configured mode. n.mu is held.
func (n *Node) leaveMaintenanceLocked(cfg []byte, parsed config.Provider, phase Phase) {
	n.gen++
	n.setPhaseLocked(phase)
	n.setStageLocked(runtime.MachineStageBooting) // runningMaintenance stopped
	srv, lis := n.detachLocked()
	go stopServer(srv, lis, false)
	n.config, n.parsed = slices.Clone(cfg), parsed
	n.mode = serveConfigured
	n.wantUp = true
}

// installLocked models a maintenance apply: apid restarts with mutual TLS
// and the applied config's CA (the node answers in configured mode from
// then on, while the installer pulls and writes), then the install either
// completes and the node kexecs into the installed system, or fails and
// the node reboots from the ISO into maintenance mode again.
func (n *Node) installLocked(cfg []byte, parsed config.Provider) {
	if n.fromImage {
		n.configureInPlaceLocked(cfg, parsed)
		return
	}
	n.leaveMaintenanceLocked(cfg, parsed, PhaseInstalling)
	n.afterLocked(n.sim.scaled(n.sim.opts.Profile.ApidRestart), func() {
		n.serveLocked()
		n.setStageLocked(runtime.MachineStageInstalling)
	})
	installDisk, image, selErr := n.installTargetLocked(parsed)
	crash := n.faults.CrashDuringInstall > 0
	if crash {
		n.faults.CrashDuringInstall--
	}
	pullFails := n.faults.InstallerPullFails > 0
	if pullFails {
		n.faults.InstallerPullFails--
	}
	exts, pullErr := n.sim.pullInstaller(image)
	n.afterLocked(n.sim.scaled(n.sim.opts.Profile.ApidRestart+n.sim.opts.Profile.Install), func() {
		failed := ""
		switch {
		case crash:
			failed = "install crashed (injected)"
		case pullFails:
			failed = fmt.Sprintf("failed to pull the installer image %q (injected)", image)
		case pullErr != nil:
			failed = fmt.Sprintf("failed to pull the installer image %q: %v", image, pullErr)
		case selErr != nil:
			failed = selErr.Error()
		case !diskExists(n.spec.Disks, installDisk):
			failed = fmt.Sprintf("install disk %s not found", installDisk)
		}
		if failed != "" {
			// A failed install sequence is fatal: machined logs
			// "rebooting in 10 seconds" and the VM boots the ISO again.
			n.counters.InstallCrashes++
			n.log.Warn().Msg("talossim: " + failed + "; rebooting into the ISO")
			n.afterLocked(n.sim.scaled(n.sim.opts.Profile.FailedInstallReboot), n.rebootLocked)
			return
		}
		n.counters.Installs++
		n.sim.persist(n.ip, installedSystem{config: cfg, version: installerVersion(image, n.version), extensions: exts, secureBoot: secureBootImage(image), keysEnrolled: n.sim.keysEnrolled(n.ip)})
		n.rebootLocked()
	})
}

// installerVersion is the Talos version an installer image installs: its
// tag (ghcr.io/siderolabs/installer:v1.13.3,
// factory.talos.dev/installer/<schematic>:v1.13.3); fallback without one.
func installerVersion(image, fallback string) string {
	if tag := ImageTag(image); tag != "" {
		return tag
	}
	return fallback
}

// KubeletVersion is the version a kubelet of image reports: its tag
// without the image variant (-fat, -slim: packaging upgrade-k8s keeps
// across versions, pkg/cluster/kubernetes/kubelet.go at v1.13.3).
func KubeletVersion(image string) string {
	tag := ImageTag(image)
	for _, v := range []string{"-fat", "-slim"} {
		tag = strings.TrimSuffix(tag, v)
	}
	return tag
}

// ImageTag is the tag of an image reference without its digest ("v1.36.1"
// of "registry.k8s.io/kube-apiserver:v1.36.1@sha256:…"); "" without a
// tag (a registry port is not a tag).
func ImageTag(image string) string {
	image, _, _ = strings.Cut(image, "@")
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		return ""
	}
	return image[i+1:]
}

// serveLocked starts the API if it should run and is not running. A
// configured worker needs its certificate signed by a control plane of its
// cluster first; until one is up its API stays closed and it retries.
func (n *Node) serveLocked() {
	if !n.powered || !n.wantUp || n.faults.RefuseConnections || n.srv != nil {
		return
	}
	tlsCfg, err := n.tlsConfigLocked()
	if errors.Is(err, errNoSigner) {
		n.afterLocked(max(n.sim.scaled(n.sim.opts.Profile.Reboot)/4, 5*time.Millisecond), n.serveLocked)
		return
	}
	if err != nil {
		n.log.Error().Err(err).Msg("talossim: cannot build the API's TLS config")
		return
	}
	lis, err := net.Listen("tcp", n.addr())
	if err != nil {
		n.log.Warn().Err(err).Msg("talossim: listen failed, retrying")
		n.afterLocked(20*time.Millisecond, n.serveLocked)
		return
	}
	srv := newGRPCServer(n, tlsCfg, n.mode)
	n.srv, n.lis = srv, lis
	go func() { _ = srv.Serve(lis) }()
}

// detachLocked unhooks the running server; the caller stops it without
// the lock. The listener is closed at once so new connections are refused.
func (n *Node) detachLocked() (*grpc.Server, net.Listener) {
	srv, lis := n.srv, n.lis
	n.srv, n.lis = nil, nil
	if lis != nil {
		lis.Close()
	}
	n.sim.dropSigner(n.ip)
	return srv, lis
}

// stopServer ends a detached server: gracefully (in-flight calls such as
// the apply that triggered a reboot get their answer) unless hard, and
// hard after a short grace either way.
func stopServer(srv *grpc.Server, _ net.Listener, hard bool) {
	if srv == nil {
		return
	}
	if hard {
		srv.Stop()
		return
	}
	done := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(500 * time.Millisecond):
		srv.Stop()
	}
}

func (n *Node) setStageLocked(st runtime.MachineStage) {
	if n.stage == st {
		return
	}
	n.stage = st
	ready := st == runtime.MachineStageRunning || st == runtime.MachineStageMaintenance
	publishMachineStatus(n.cosi, st, ready)
	// machined publishes every MachineStatus change on its event stream
	// (MachineStatusPublisherController, internal/app/machined/pkg/
	// controllers/runtime/machine_status_publisher.go at v1.13.3, which
	// casts the resource's stage to the event's). Unmet conditions are
	// not simulated.
	n.publishEventLocked("", &machine.MachineStatusEvent{Stage: machine.MachineStatusEvent_MachineStage(st),
		Status: &machine.MachineStatusEvent_MachineStatus{Ready: ready}})
}

func diskExists(disks []Disk, devPath string) bool {
	for i := range disks {
		if devPathFor(disks, i) == devPath {
			return true
		}
	}
	return false
}

var errNoSigner = errors.New("no control plane of this cluster can sign the certificate yet")

func (n *Node) tlsConfigLocked() (*tls.Config, error) {
	if n.mode == serveMaintenance {
		return maintenanceTLS(n.ip)
	}
	// trustd is one of the services the installed system's boot sequence
	// starts; during the install only apid runs.
	return configuredTLS(n.sim, n.ip, n.hostnameLocked(), n.parsed, n.phase == PhaseRunning)
}
