package talossim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config"
	blockcfg "github.com/siderolabs/talos/pkg/machinery/config/types/block"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// EtcdRecoverer is what a simulated control plane offers when it can start
// from an etcd snapshot: the lab's control plane restores it with etcd's
// own restore into a fresh data directory and starts the real control
// plane on it. Recover replaces Cluster.Bootstrap for a recover_etcd
// bootstrap; the rules for Bootstrap's error hold for it too.
type EtcdRecoverer interface {
	Recover(ctx context.Context, bootstrapNodeConfig, snapshot []byte, skipHashCheck bool) error
}

// EtcdLoser is told when the last etcd member of the cluster lost its
// data (every control plane VM destroyed with its disks): a real control
// plane is gone then, and the next Bootstrap or Recover starts a new one.
type EtcdLoser interface {
	EtcdLost(ctx context.Context)
}

// etcdRecovery is a recover_etcd bootstrap's input, taken from the node's
// disk.
type etcdRecovery struct {
	snapshot      []byte
	skipHashCheck bool
}

// EtcdRecover implements machine.MachineServiceServer as v1alpha1_server.go
// does at v1.13.3: FailedPrecondition "etcd service is not ready for
// recovery yet" until /var/lib exists (the installed system's EPHEMERAL
// partition is mounted; the simulator says so once the node runs its
// installed system — whether maintenance mode has /var/lib is unverified),
// only on a control plane (machinehelper.CheckControlplane), then the
// streamed bytes are written to /var/lib/etcd.snapshot
// (constants.EtcdRecoverySnapshotPath), truncating an earlier upload; a
// broken upload removes the file.
func (a *apid) EtcdRecover(srv grpc.ClientStreamingServer[common.Data, machine.EtcdRecoverResponse]) error {
	n := a.n
	n.mu.Lock()
	phase, role := n.phase, n.roleLocked()
	n.mu.Unlock()
	if phase != PhaseRunning || a.mode == serveMaintenance {
		return status.Error(codes.FailedPrecondition, "etcd service is not ready for recovery yet")
	}
	if role != "controlplane" {
		return status.Error(codes.Unimplemented, "etcd recover is only available on control plane nodes")
	}
	var snapshot []byte
	for {
		msg, err := srv.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			n.setRecoverySnapshot(nil)
			return err
		}
		snapshot = append(snapshot, msg.GetBytes()...)
	}
	n.setRecoverySnapshot(snapshot)
	n.mu.Lock()
	n.counters.RecoverUploads++
	n.mu.Unlock()
	return srv.SendAndClose(&machine.EtcdRecoverResponse{Messages: []*machine.EtcdRecover{{}}})
}

// setRecoverySnapshot writes (nil: removes) /var/lib/etcd.snapshot.
func (n *Node) setRecoverySnapshot(b []byte) {
	n.sim.mu.Lock()
	defer n.sim.mu.Unlock()
	n.sim.swapRecoverySnapshotLocked(n.ip, slices.Clone(b))
}

// swapRecoverySnapshotLocked replaces the recovery snapshot on the disk of
// the VM at ip (nil removes it) and returns the one it held. s.mu is held.
func (s *Sim) swapRecoverySnapshotLocked(ip string, b []byte) []byte {
	sys := s.installed[ip]
	old := sys.recoverySnapshot
	sys.recoverySnapshot = b
	s.installed[ip] = sys
	return old
}

// takeRecoverySnapshotLocked is the etcd service's pre stage of a
// recover_etcd bootstrap (services/etcd.go recoverFromSnapshot at
// v1.13.3): it reads /var/lib/etcd.snapshot (nil snapshot when there is
// none: the restore then fails) and removes the file, which real Talos does
// after a successful restore. n.mu is held.
func (n *Node) takeRecoverySnapshotLocked(skipHashCheck bool) *etcdRecovery {
	n.counters.Recoveries++
	n.sim.mu.Lock()
	defer n.sim.mu.Unlock()
	return &etcdRecovery{snapshot: n.sim.swapRecoverySnapshotLocked(n.ip, nil), skipHashCheck: skipHashCheck}
}

// recoverCluster starts the control plane from the recovery snapshot. The
// etcd service fails when there is no snapshot or the control plane cannot
// restore one; the error shows on the etcd service as Bootstrap's does.
func (s *Sim) recoverCluster(ctx context.Context, cfg []byte, r *etcdRecovery) error {
	if r.snapshot == nil {
		return errors.New("error verifying snapshot: open /var/lib/etcd.snapshot: no such file or directory")
	}
	rec, ok := s.opts.Cluster.(EtcdRecoverer)
	if !ok {
		return fmt.Errorf("talossim: a recover_etcd bootstrap needs a control plane that can restore etcd (%T cannot)", s.opts.Cluster)
	}
	return rec.Recover(ctx, cfg, r.snapshot, r.skipHashCheck)
}

// WipeDisk forgets what the VM at ip kept on its disks (the installed
// system, etcd's data, an uploaded recovery snapshot), as when Proxmox
// destroys the VM with the volumes it owns; the VM must be off. When the
// node was the last etcd member of its cluster, the cluster's etcd data
// is gone and an EtcdLoser control plane is told. A member whose cluster
// keeps other members stays in the member list, as etcd keeps a member
// until it is removed: the re-created node, joining with an empty data
// directory, removes it and is added under a new member ID (joinEtcd).
func (s *Sim) WipeDisk(ip string) {
	s.mu.Lock()
	delete(s.installed, ip)
	lost := false
	for id := range s.etcd {
		lost = s.loseMemberLocked(id, ip) || lost
	}
	s.mu.Unlock()
	s.tellEtcdLost(lost)
}

// tellEtcdLost tells an EtcdLoser control plane when lost; s.mu is not
// held (the control plane may call back).
func (s *Sim) tellEtcdLost(lost bool) {
	if l, ok := s.opts.Cluster.(EtcdLoser); ok && lost {
		l.EtcdLost(context.Background())
	}
}

// Reset implements machine.MachineServiceServer for what a forced restore
// needs, as v1alpha1_server.go Reset does at v1.13.3: the partitions to
// wipe are validated (a label the node has no volume for is an error),
// the reset sequence runs in the background of the answer. The simulator
// models one reset: a non-graceful wipe of EPHEMERAL followed by a reboot
// (`talosctl reset --graceful=false --reboot
// --system-labels-to-wipe=EPHEMERAL`, what Talos' own etcd recovery test
// runs): the node's etcd data and an uploaded recovery snapshot are gone,
// its config (STATE) stays, and it boots its installed system again with
// an empty etcd that waits to join a cluster. The reset that takes a node
// out of its cluster (graceful, no reboot, the whole system disk) is
// gracefulShutdownReset (remove.go). Other resets answer Unimplemented.
func (a *apid) Reset(_ context.Context, req *machine.ResetRequest) (*machine.ResetResponse, error) {
	n := a.n
	if a.mode == serveMaintenance {
		return nil, status.Error(codes.Unimplemented, "talossim: reset in maintenance mode is not simulated")
	}
	if req.GetGraceful() && !req.GetReboot() && len(req.GetSystemPartitionsToWipe()) == 0 && len(req.GetUserDisksToWipe()) == 0 &&
		req.GetMode() != machine.ResetRequest_USER_DISKS {
		return a.gracefulShutdownReset(req)
	}
	n.mu.Lock()
	version := n.version
	dedicated := atLeast114(version) && n.parsed != nil && dedicatedEtcdVolume(n.parsed)
	n.mu.Unlock()
	ephemeral, etcdVolume := false, false
	for _, p := range req.GetSystemPartitionsToWipe() {
		switch p.GetLabel() {
		case "EPHEMERAL":
			ephemeral = ephemeral || p.GetWipe()
		case "ETCD":
			// A VolumeStatus ETCD exists on v1.13 too, a directory under
			// EPHEMERAL without a location: v1.13 refuses it, v1.14 takes
			// it along with the volume it resides on, or wipes its own
			// partition (v1alpha1_server.go Reset at v1.13.3 and
			// v1.14.0-rc.1).
			if !atLeast114(version) {
				return nil, fmt.Errorf("failed to reset: volume %q is not located", p.GetLabel())
			}
			etcdVolume = etcdVolume || p.GetWipe()
		case "STATE", "META":
			return nil, status.Errorf(codes.Unimplemented, "talossim: wiping %s is not simulated", p.GetLabel())
		default:
			// safe.ReaderGetByID on the VolumeStatus: not found.
			return nil, fmt.Errorf("failed to get volume status with label %q: resource VolumeStatuses.block.talos.dev(runtime/%s) doesn't exist", p.GetLabel(), p.GetLabel())
		}
	}
	if etcdVolume && !dedicated && !ephemeral {
		return nil, fmt.Errorf("failed to reset: volume %q resides on volume %q, and therefore %q cannot be wiped without wiping %q", "ETCD", "EPHEMERAL", "ETCD", "EPHEMERAL")
	}
	if !ephemeral || req.GetGraceful() || !req.GetReboot() || len(req.GetUserDisksToWipe()) > 0 {
		return nil, status.Error(codes.Unimplemented, "talossim: only a non-graceful reset that wipes EPHEMERAL and reboots is simulated")
	}
	n.mu.Lock()
	if n.phase != PhaseRunning {
		n.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "talossim: a reset outside the installed system is not simulated")
	}
	n.counters.Resets++
	clusterID := n.clusterIDLocked()
	n.mu.Unlock()
	// The wipe (and, with the last member's data, the control plane's
	// stop) happens before the reboot is scheduled: the answer goes out
	// while the node still runs, as the real reset sequence starts in the
	// background of it.
	// etcd's data is on EPHEMERAL unless it has a partition of its own,
	// which only wiping ETCD clears (hack/release.toml notes.systemVolumes
	// at v1.14.0-rc.1).
	n.sim.wipeEphemeral(clusterID, n.ip, !dedicated || etcdVolume)
	n.mu.Lock()
	if n.phase == PhaseRunning && !n.rebootPending {
		n.scheduleRebootLocked()
	}
	n.mu.Unlock()
	return &machine.ResetResponse{Messages: []*machine.Reset{{ActorId: "talossim"}}}, nil
}

// wipeEphemeral forgets the node's recovery snapshot and, with etcd, its
// etcd data; when no member of its cluster keeps data, the cluster's etcd
// is gone.
func (s *Sim) wipeEphemeral(clusterID, ip string, etcd bool) {
	s.mu.Lock()
	s.swapRecoverySnapshotLocked(ip, nil)
	lost := false
	if etcd {
		lost = s.loseMemberLocked(clusterID, ip)
	}
	s.mu.Unlock()
	s.tellEtcdLost(lost)
}

// dedicatedEtcdVolume reports whether cfg puts etcd's data on a partition
// of its own: a VolumeConfig named ETCD that asks for provisioning
// (GetPromotableSystemVolumesTransformer, volumeconfig/system_volumes.go at
// v1.14.0-rc.1, with machinery's block.ProvisioningRequested). By default
// it is a directory under EPHEMERAL.
func dedicatedEtcdVolume(cfg config.Provider) bool {
	v, ok := cfg.Volumes().ByName(constants.EtcdDataVolumeID)
	return ok && blockcfg.ProvisioningRequested(v.Provisioning())
}

// loseMemberLocked marks the member's data lost and drops the cluster when
// no member keeps data. It reports whether the cluster's etcd stopped
// serving with this loss: its last data, or its quorum (the survivors
// keep their data, but without a leader etcd serves nothing, so the
// control plane stops as well). s.mu is held.
func (s *Sim) loseMemberLocked(clusterID, ip string) bool {
	c := s.etcd[clusterID]
	if c == nil {
		return false
	}
	m, ok := c.members[ip]
	if !ok {
		return false
	}
	m.dataLost = true
	wasLost := c.quorumLost
	if !c.hasQuorum(time.Now()) {
		c.quorumLost = true
	}
	for _, m := range c.members {
		if !m.dataLost {
			return c.quorumLost && !wasLost
		}
	}
	delete(s.etcd, clusterID)
	return !wasLost
}
