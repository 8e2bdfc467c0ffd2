package talossim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/distribution/reference"
	"github.com/google/uuid"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/compatibility"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Cordoner is what a simulated control plane may offer to mirror what
// Talos does to the Kubernetes Node around an upgrade: its controllers
// cordon the node when the upgrade sequence starts (CordonAndDrainNode
// waits for that, then drains) and uncordon it once the machine runs
// again. The lab's control plane implements it; without it the Node is
// left alone.
type Cordoner interface {
	SetCordoned(ctx context.Context, nodeName string, cordoned bool) error
}

// Upgrade implements machine.MachineServiceServer as
// internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go
// (siderolabs/talos v1.13.3) does:
//   - an uninstalled machine: FailedPrecondition "Talos is not installed";
//   - the installer image is pulled and validated before anything else
//     (install.PullAndValidateInstallerImage): a failure is the RPC's
//     error and the node keeps running its version;
//   - on a control plane, unless forced, etcd must allow it
//     (internal/pkg/etcd/etcd.go ValidateForUpgrade): a two-member cluster
//     is refused (no quorum during the upgrade), and every member must be
//     started and healthy;
//   - then the answer, and in its background the upgrade sequence
//     (v1alpha1_sequencer.go Upgrade): cordon and drain, stop services,
//     install, reboot into the new version.
//
// Staged upgrades and reboot modes are not simulated (unverified
// behaviours are refused as Unimplemented).
func (a *apid) Upgrade(ctx context.Context, in *machine.UpgradeRequest) (*machine.UpgradeResponse, error) {
	n := a.n
	n.mu.Lock()
	defer n.mu.Unlock()
	n.counters.UpgradeCalls++
	if in.GetStage() || in.GetRebootMode() != machine.UpgradeRequest_DEFAULT {
		return nil, status.Error(codes.Unimplemented, "talossim: staged upgrades and reboot modes are not simulated")
	}
	if n.phase != PhaseRunning || n.sim.installedSystem(n.ip).config == nil {
		return nil, status.Error(codes.FailedPrecondition, "Talos is not installed")
	}
	if n.rebootPending {
		// An upgrade sequence already runs: a second request waits for the
		// sequence lock in machined; the simulator refuses it instead.
		return nil, status.Error(codes.FailedPrecondition, "talossim: an upgrade or reboot is already in progress")
	}
	image := in.GetImage()
	if _, err := reference.ParseNormalizedNamed(image); err != nil {
		return nil, fmt.Errorf("error validating installer image %q: %w", image, err)
	}
	if n.faults.UpgradePullFails > 0 {
		n.faults.UpgradePullFails--
		return nil, fmt.Errorf("error validating installer image %q: failed to pull image %q: (injected) not found", image, image)
	}
	exts, err := n.sim.pullInstaller(image)
	if err != nil {
		return nil, fmt.Errorf("error validating installer image %q: %w", image, err)
	}
	if n.roleLocked() == "controlplane" && !in.GetForce() {
		if err := n.sim.validateEtcdForUpgrade(n.clusterIDLocked(), n.ip, time.Now()); err != nil {
			return nil, fmt.Errorf("error validating etcd for upgrade: %w", err)
		}
	}
	n.counters.Upgrades++
	target := installerVersion(image, n.version)
	hostname := n.hostnameLocked()
	n.rebootPending = true
	// The sequence runs under an actor ID the answer returns; its events
	// carry it (v1alpha1_server.go Upgrade: runtime.ActorIDCtxKey).
	actorID := uuid.NewString()
	n.publishEventLocked(actorID, &machine.SequenceEvent{Sequence: "upgrade", Action: machine.SequenceEvent_START})
	n.setStageLocked(runtime.MachineStageUpgrading)
	// The upgrading stage cordons the Node (NodeCordonedSpecController);
	// the next boot's booting or running stage uncordons it, whether the
	// upgrade succeeded or failed and the node was rebooted
	// (controllers/k8s/node_cordoned_spec.go, node_apply.go
	// ApplyCordoned at v1.13.3).
	n.setCordonedLocked(hostname, true)
	n.uncordonOnBoot = true
	seqErr := installerPreflight(target, n.version)
	if seqErr == nil && n.faults.UpgradeSequenceFails > 0 {
		n.faults.UpgradeSequenceFails--
		seqErr = errors.New("(injected) failed to install bootloader: no space left on device")
	}
	if err := seqErr; err != nil {
		// The installer's pre-flight check runs inside the sequence, after
		// the answer (cmd/installer/pkg/install/preflight.go at v1.13.3:
		// the installer's UpgradeableFrom the host's version), in its
		// "upgrade" phase, the ninth (v1alpha1_sequencer.go Upgrade). The
		// phases before it have run: the drain, StopAllPods, and
		// StopServicesEphemeral, which stops cri and what depends on it
		// (etcd, kubelet) and trustd (v1alpha1_sequencer_tasks.go), then
		// EPHEMERAL is unmounted. The Upgrade RPC's goroutine only logs
		// "upgrade failed" (v1alpha1_server.go); machined itself reboots
		// the node into its old version (failSequenceLocked).
		n.afterLocked(n.sim.scaled(n.sim.opts.Profile.RebootStart), func() {
			n.counters.FailedUpgrades++
			// rebootPending stays: the node is on its way to its reboot.
			n.sequenceStopped, n.sequenceStoppedAt = true, time.Now()
			n.refreshPeerLocked()
			// The pods were stopped (StopAllPods); what StaticPodStatus
			// reads with kubelet stopped is unverified: talossim lists none.
			removeStaticPods(n.cosi, hostname)
			n.staticPods = nil
			now := time.Now()
			for _, id := range []string{"cri", "etcd", "kubelet"} {
				n.serviceEventAtLocked(now, id)
			}
			n.log.Warn().Err(err).Msg("talossim: upgrade failed: machined reboots the node into its old version")
			// The failure's text is wrapped by runPhase and the task
			// runner (v1alpha1_controller.go; the task's wording is
			// unverified).
			n.failSequenceLocked(actorID, "upgrade", "error running phase 9 in upgrade sequence: task 1/1: failed, "+err.Error())
		})
		return &machine.UpgradeResponse{Messages: []*machine.Upgrade{{Ack: "Upgrade request received", ActorId: actorID}}}, nil
	}
	n.afterLocked(n.sim.scaled(n.sim.opts.Profile.RebootStart), func() {
		sys := n.sim.installedSystem(n.ip)
		sys.version, sys.extensions, sys.secureBoot = target, exts, secureBootImage(image)
		n.sim.persist(n.ip, sys)
		n.rebootLocked()
	})
	return &machine.UpgradeResponse{Messages: []*machine.Upgrade{{Ack: "Upgrade request received", ActorId: actorID}}}, nil
}

// installerPreflight is the installer's version check: the installer's
// Talos must accept the host's as one to upgrade from. A target this
// machinery does not know passes (its own installer would judge it).
func installerPreflight(target, host string) error {
	tv, err := compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: target})
	if err != nil {
		return nil
	}
	hv, err := compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: host})
	if err != nil {
		return nil
	}
	if err := tv.UpgradeableFrom(hv); err != nil && !strings.HasPrefix(err.Error(), "upgrades to version") {
		return fmt.Errorf("pre-flight checks failed: %w", err)
	}
	return nil
}

// failSequenceLocked is what machined does when a sequence fails after
// the node booted (an upgrade whose installer fails, a reset whose leave
// fails), as internal/app/machined does at v1.13.9 and v1.14.0-rc.1:
//   - Controller.Run publishes the sequence's STOP, then the failure as a
//     NOOP sequence event with a FATAL error, "sequence failed: …"
//     (pkg/runtime/v1alpha1/v1alpha1_controller.go Run), which turns the
//     machine stage to rebooting ("fatal errors lead to reboot",
//     pkg/controllers/runtime/machine_status.go);
//   - runEntrypoint's event watch takes any sequence error but LOCKED and
//     CANCELED as fatal ("fatal sequencer error in %q sequence") and
//     returns it (main.go); its deferred system.Services(...).Shutdown
//     stops every service, apid with it: the API goes away (RebootStart);
//   - handle() logs the error, reverts the bootloader to the entry it
//     booted (revertBootloader), counts "rebooting in %d seconds" down
//     from 10 and reboots (FailedSequenceReboot; no panic=0 on the kernel
//     command line). The node boots the system it ran, with its
//     services, and that boot uncordons its Node.
//
// The revert is implicit here: an upgrade persists the new version only
// once it succeeded, so the reboot boots what the disk held.
func (n *Node) failSequenceLocked(actorID, sequence, failure string) {
	if n.faults.SequenceFailureUnseen > 0 {
		n.faults.SequenceFailureUnseen--
	} else {
		n.publishEventLocked(actorID, &machine.SequenceEvent{Sequence: sequence, Action: machine.SequenceEvent_STOP})
		n.publishEventLocked(actorID, &machine.SequenceEvent{Sequence: sequence, Action: machine.SequenceEvent_NOOP,
			Error: &common.Error{Code: common.Code_FATAL, Message: "sequence failed: " + failure}})
	}
	n.rebootPending = true
	n.setStageLocked(runtime.MachineStageRebooting)
	shutdown := n.sim.scaled(n.sim.opts.Profile.RebootStart)
	n.afterLocked(shutdown, func() {
		if !n.sequenceStopped {
			n.sequenceStopped, n.sequenceStoppedAt = true, time.Now()
			n.refreshPeerLocked()
		}
		n.wantUp = false
		srv, lis := n.detachLocked()
		go stopServer(srv, lis, false)
	})
	n.afterLocked(shutdown+n.sim.scaled(n.sim.opts.Profile.FailedSequenceReboot), n.rebootLocked)
}

// validateEtcdForUpgrade is ValidateForUpgrade against the simulated
// cluster: member count and every member's etcd up on a running node.
func (s *Sim) validateEtcdForUpgrade(clusterID, selfIP string, now time.Time) error {
	s.mu.Lock()
	peers := s.etcdPeersUpLocked()
	c := s.etcd[clusterID]
	var members []*etcdMember
	if c != nil {
		for _, m := range c.members {
			members = append(members, m)
		}
	}
	s.mu.Unlock()
	if len(members) == 2 {
		return fmt.Errorf("etcd member count(%d) is insufficient to maintain quorum if upgrade commences", len(members))
	}
	for _, m := range members {
		if !m.started(now) {
			return fmt.Errorf("etcd member %016x is not started, all members must be running to perform an upgrade", m.id)
		}
		// The asking node runs (its lock is held); the others' etcd is
		// reachable when their node runs with its services
		// (etcdPeersUp: a failed upgrade sequence stopped them).
		up := m.ip == selfIP || peers[m.ip]
		if !up || m.readyAt.After(now) {
			return fmt.Errorf("etcd member %016x is not healthy; all members must be healthy to perform an upgrade: context deadline exceeded", m.id)
		}
	}
	return nil
}

// setCordonedLocked asks the control plane to (un)cordon the node's Node
// object, in the background: the Kubernetes API may be down (a single
// control plane rebooting) and Talos's controllers retry.
func (n *Node) setCordonedLocked(hostname string, cordoned bool) {
	c, ok := n.sim.opts.Cluster.(Cordoner)
	if !ok {
		return
	}
	log := n.log
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for ctx.Err() == nil {
			if err := c.SetCordoned(ctx, hostname, cordoned); err == nil {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		log.Warn().Str("node", hostname).Bool("cordoned", cordoned).Msg("talossim: could not (un)cordon the Node")
	}()
}

// EtcdSnapshotter is what a simulated control plane offers when it runs a
// real etcd: a snapshot as etcd's Maintenance.Snapshot streams it (the
// database, then its sha256). The lab's control plane implements it.
type EtcdSnapshotter interface {
	EtcdSnapshot(ctx context.Context) (io.ReadCloser, error)
}

// snapshotChunk is the size of the Data messages the snapshot is streamed
// in (talos pkg/chunker/stream's default is 4096).
const snapshotChunk = 4096

// EtcdSnapshot implements machine.MachineServiceServer as v1alpha1_server.go
// does at v1.13.3: only on a control plane (machinehelper.CheckControlplane:
// Unimplemented "etcd snapshot is only available on control plane nodes"),
// from the local etcd member (an error when it does not run), streamed in
// chunks of the snapshot etcd itself produced.
func (a *apid) EtcdSnapshot(_ *machine.EtcdSnapshotRequest, stream grpc.ServerStreamingServer[common.Data]) error {
	n := a.n
	n.mu.Lock()
	role, etcdUp := n.roleLocked(), n.etcdUpLocked(time.Now())
	n.mu.Unlock()
	if role == "" {
		return status.Error(codes.Unimplemented, "machine type is not set, cannot use etcd snapshot API")
	}
	if role != "controlplane" {
		return status.Error(codes.Unimplemented, "etcd snapshot is only available on control plane nodes")
	}
	if !etcdUp {
		return fmt.Errorf("failed to create etcd client: etcd is not running on this node")
	}
	snap, ok := n.sim.opts.Cluster.(EtcdSnapshotter)
	if !ok {
		return status.Error(codes.Unimplemented, "talossim: etcd snapshots need a control plane with a real etcd")
	}
	rd, err := snap.EtcdSnapshot(stream.Context())
	if err != nil {
		return fmt.Errorf("failed reading etcd snapshot: %w", err)
	}
	defer rd.Close()
	buf := make([]byte, snapshotChunk)
	for {
		k, err := io.ReadFull(rd, buf)
		if k > 0 {
			if serr := stream.Send(&common.Data{Bytes: append([]byte(nil), buf[:k]...)}); serr != nil {
				return serr
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("failed reading etcd snapshot: %w", err)
		}
	}
}

// ImagePull implements machine.MachineServiceServer as
// v1alpha1_images.go ImagePull does at v1.13.3 (deprecated there, still
// what upgrade-k8s pre-pulls with): os:admin or os:operator
// (services/machined.go rules), the CRI's containerd must run
// (Unavailable "error connecting to containerd" before), an image no
// registry serves is NotFound "error pulling image: …" at once (no
// retries). Pulled images are only counted.
func (a *apid) ImagePull(_ context.Context, req *machine.ImagePullRequest) (*machine.ImagePullResponse, error) {
	n := a.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if a.mode == serveMaintenance || !n.criUpLocked(time.Now()) || n.sequenceStopped {
		return nil, status.Errorf(codes.Unavailable, "error connecting to containerd: containerd is not running")
	}
	ref := req.GetReference()
	if _, err := reference.ParseNormalizedNamed(ref); err != nil {
		return nil, fmt.Errorf("error pulling image: %w", err)
	}
	if slices.Contains(n.faults.MissingImages, ref) {
		return nil, status.Errorf(codes.NotFound, "error pulling image: failed to resolve reference %q: %s: not found", ref, ref)
	}
	n.counters.ImagePulls++
	return &machine.ImagePullResponse{Messages: []*machine.ImagePull{{}}}, nil
}
