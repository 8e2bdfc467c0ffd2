package talossim

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// How a node leaves: etcd membership changes under etcd's strict
// reconfiguration check, and the graceful reset that takes a node out of
// its cluster and powers it off.

// etcdUnhealthy is what etcd answers a member removal or addition that
// would break the active quorum (etcd v3.6.11 server/etcdserver/errors/
// errors.go ErrUnhealthy, relayed as api/v3rpc/rpctypes ErrGRPCUnhealthy:
// codes.Unavailable).
var etcdUnhealthy = status.Error(codes.Unavailable, "etcdserver: unhealthy cluster")

// etcdNotEnoughStarted is etcd's answer to removing a member when the
// members left that ever started would not be a quorum of those left,
// the last member among them (etcdserver/api/membership/cluster.go
// IsReadyToRemoveVotingMember at etcd v3.6.11; rpctypes
// ErrGRPCMemberNotEnoughStarted).
var etcdNotEnoughStarted = status.Error(codes.FailedPrecondition, "etcdserver: re-configuration failed due to not enough started members")

// etcdMemberRemoved is what a removed member's etcd reports before it
// stops (etcd v3.6.11 server/etcdserver/errors/errors.go ErrMemberRemoved...
// message "the member has been permanently removed from the cluster").
const etcdMemberRemoved = "the member has been permanently removed from the cluster"

// etcdPeersUp lists the nodes whose etcd its peers can reach: powered,
// running their installed system, their services not stopped by a failed
// upgrade sequence (Node.etcdPeer). It takes s.mu; etcdPeersUpLocked is
// for callers that hold it.
func (s *Sim) etcdPeersUp() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.etcdPeersUpLocked()
}

func (s *Sim) etcdPeersUpLocked() map[string]bool {
	up := map[string]bool{}
	for ip, n := range s.nodes {
		if n.etcdPeer.Load() {
			up[ip] = true
		}
	}
	return up
}

// mayRemoveLocked is etcd's strict reconfiguration check for removing m
// (etcd v3.6.11 server/etcdserver/server.go mayRemoveMember, unchanged
// since v3.6.5; on by default: --strict-reconfig-check): a learner goes freely; the voting
// members left that ever started must be a quorum of the voting members
// left (so the last member never goes); a member that is down is not part
// of the active quorum and then goes; otherwise the active voting members
// less m must still be a quorum of the voting members less m. up lists the
// nodes whose etcd its peers reach (etcdPeersUp); s.mu is held.
func (c *etcdCluster) mayRemoveLocked(m *etcdMember, up map[string]bool, now time.Time) error {
	learner := func(x *etcdMember) bool { return c.learner(x, now) }
	if learner(m) {
		return nil
	}
	others, started := 0, 0
	for _, x := range c.members {
		if x != m && !learner(x) {
			others++
			if x.started(now) {
				started++
			}
		}
	}
	if started < others/2+1 {
		return etcdNotEnoughStarted
	}
	active := func(x *etcdMember) bool { return up[x.ip] && !x.dataLost && x.started(now) }
	if !active(m) {
		return nil
	}
	voting, live := 0, 0
	for _, x := range c.members {
		if learner(x) {
			continue
		}
		voting++
		if active(x) {
			live++
		}
	}
	if live-1 < 1+(voting-1)/2 {
		return etcdUnhealthy
	}
	return nil
}

// removeMemberLocked takes m out of the cluster; s.mu is held.
func (c *etcdCluster) removeMemberLocked(m *etcdMember) {
	delete(c.members, m.ip)
	c.removed++
}

// leaveEtcd is Talos' etcd LeaveCluster for the node at ip
// (internal/pkg/etcd/etcd.go LeaveCluster at v1.13.3): remove its own
// member by ID, retrying etcd's "unhealthy cluster" for 5 minutes, then
// stop etcd and delete its data. A member already gone is not an error
// (ErrMemberNotFound: "already removed, nothing to do").
func (s *Sim) leaveEtcd(ctx context.Context, clusterID, ip string) error {
	deadline := time.Now().Add(s.scaled(5 * time.Minute))
	for {
		up := s.etcdPeersUp()
		s.mu.Lock()
		c := s.etcd[clusterID]
		if c != nil && c.quorumLost {
			s.mu.Unlock()
			return status.Error(codes.Unavailable, "etcdserver: no leader")
		}
		var m *etcdMember
		if c != nil {
			m = c.members[ip]
		}
		if m == nil {
			s.mu.Unlock()
			return nil
		}
		err := c.mayRemoveLocked(m, up, time.Now())
		if err == nil {
			c.removeMemberLocked(m)
		}
		id := m.id
		s.mu.Unlock()
		if err == nil {
			return nil
		}
		// Only "unhealthy" (and "stopped") is retried.
		if err != etcdUnhealthy || !time.Now().Before(deadline) {
			return fmt.Errorf("failed to remove member %d: %s", id, status.Convert(err).Message())
		}
		// retry.Constant(5*time.Minute, retry.WithUnits(10*time.Second))
		t := time.NewTimer(s.scaled(10 * time.Second))
		select {
		case <-ctx.Done():
			t.Stop()
			return status.FromContextError(ctx.Err()).Err()
		case <-t.C:
		}
	}
}

// controlPlaneOnly is CheckControlplane
// (internal/app/internal/machinehelper/machinehelper.go at v1.13.3).
func (a *apid) controlPlaneOnly(api string) (clusterID string, err error) {
	if a.mode == serveMaintenance {
		return "", status.Errorf(codes.Unimplemented, "machine type is not set, cannot use %s API", api)
	}
	n := a.n
	n.mu.Lock()
	role, clusterID := n.roleLocked(), n.clusterIDLocked()
	n.mu.Unlock()
	if role != "controlplane" {
		return "", status.Errorf(codes.Unimplemented, "%s is only available on control plane nodes", api)
	}
	return clusterID, nil
}

// EtcdLeaveCluster implements machine.MachineServiceServer as
// v1alpha1_server.go EtcdLeaveCluster does at v1.13.3: control planes
// only; the node's own member is removed (LeaveCluster, above), its etcd
// stops and its data is deleted.
func (a *apid) EtcdLeaveCluster(ctx context.Context, _ *machine.EtcdLeaveClusterRequest) (*machine.EtcdLeaveClusterResponse, error) {
	clusterID, err := a.controlPlaneOnly("etcd leave")
	if err != nil {
		return nil, err
	}
	if err := a.n.sim.leaveEtcd(ctx, clusterID, a.n.ip); err != nil {
		return nil, status.Errorf(codes.Unknown, "failed to leave cluster: %v", err)
	}
	a.n.mu.Lock()
	a.n.etcdLeft = true
	a.n.mu.Unlock()
	return &machine.EtcdLeaveClusterResponse{Messages: []*machine.EtcdLeaveCluster{{}}}, nil
}

// EtcdRemoveMemberByID implements machine.MachineServiceServer as
// v1alpha1_server.go EtcdRemoveMemberByID does at v1.13.3: control planes
// only, WithRequireLeader, NotFound for an unknown ID, etcd's strict
// reconfiguration check otherwise ("failed to remove member: ..."). etcd's
// client hands Talos an rpctypes.EtcdError, which carries no gRPC status,
// so the wrapped error reaches the caller as codes.Unknown (grpc-go's
// server default for a non-status error). A removed member whose node
// still runs stops serving.
func (a *apid) EtcdRemoveMemberByID(_ context.Context, req *machine.EtcdRemoveMemberByIDRequest) (*machine.EtcdRemoveMemberByIDResponse, error) {
	clusterID, err := a.controlPlaneOnly("etcd remove member")
	if err != nil {
		return nil, err
	}
	s := a.n.sim
	up := s.etcdPeersUp()
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.etcd[clusterID]
	if c != nil && c.quorumLost {
		return nil, status.Error(codes.Unavailable, "etcdserver: no leader")
	}
	var m *etcdMember
	if c != nil {
		for _, x := range c.members {
			if x.id == req.GetMemberId() {
				m = x
			}
		}
	}
	if m == nil {
		return nil, status.Errorf(codes.NotFound, "failed to remove member %d: etcdserver: member not found", req.GetMemberId())
	}
	if err := c.mayRemoveLocked(m, up, time.Now()); err != nil {
		return nil, status.Errorf(codes.Unknown, "failed to remove member: failed to remove member %d: %s", m.id, status.Convert(err).Message())
	}
	c.removeMemberLocked(m)
	if up[m.ip] {
		if c.evicted == nil {
			c.evicted = map[string]bool{}
		}
		c.evicted[m.ip] = true
	}
	return &machine.EtcdRemoveMemberByIDResponse{Messages: []*machine.EtcdRemoveMemberByID{{}}}, nil
}

// gracefulShutdownReset is the reset `talosctl reset` asks for by default
// (graceful, no reboot, the whole system disk): v1alpha1_sequencer.go
// Reset at v1.13.3 runs drain, cleanup, leave (control planes: LeaveEtcd,
// which skips a node whose etcd data is already gone), the wipe and
// shutdown; a failed phase ends the sequence there, and machined reboots
// the node into the system it runs, not wiped (failSequenceLocked). The
// drain is not simulated (the pods are kwok's; docs/lab.md).
// The wiped system disk boots nothing; the shutdown powers the VM off
// through the hypervisor (Options.PowerOff).
func (a *apid) gracefulShutdownReset(req *machine.ResetRequest) (*machine.ResetResponse, error) {
	n := a.n
	n.mu.Lock()
	if n.phase != PhaseRunning {
		n.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "talossim: a reset outside the installed system is not simulated")
	}
	n.counters.Resets++
	clusterID, role, left, vmid := n.clusterIDLocked(), n.roleLocked(), n.etcdLeft, n.spec.VMID
	n.mu.Unlock()
	s := n.sim
	go func() {
		time.Sleep(s.scaled(s.opts.Profile.RebootStart))
		if role == "controlplane" && !left {
			if err := s.leaveEtcd(context.Background(), clusterID, n.ip); err != nil {
				n.log.Warn().Err(err).Msg("talossim: reset failed: failed to leave cluster; machined reboots the node")
				n.mu.Lock()
				n.counters.FailedResets++
				// leave is the graceful control plane's fourth phase
				// (drain, cleanup, dbus, leave: v1alpha1_sequencer.go
				// Reset at v1.13.9); the task's wording is unverified.
				n.failSequenceLocked("talossim", "reset", "error running phase 4 in reset sequence: task 1/1: failed, failed to leave cluster: "+err.Error())
				n.mu.Unlock()
				return
			}
		}
		s.mu.Lock()
		s.installed[n.ip] = installedSystem{}
		s.swapRecoverySnapshotLocked(n.ip, nil)
		s.mu.Unlock()
		if s.opts.PowerOff != nil {
			s.opts.PowerOff(vmid)
		} else {
			_ = s.StopNode(n.ip)
		}
	}()
	return &machine.ResetResponse{Messages: []*machine.Reset{{ActorId: "talossim"}}}, nil
}

// EtcdMembers lists, by hostname, the etcd members of the cluster the node
// at ip is a member of (nil when it is none's).
func (s *Sim) EtcdMembers(ip string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.etcd {
		if c.members[ip] == nil {
			continue
		}
		var out []string
		for _, m := range c.members {
			out = append(out, m.hostname)
		}
		slices.Sort(out)
		return out
	}
	return nil
}
