package talos

import (
	"context"
	"fmt"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Taking a node out of its cluster: the etcd membership rule checked
// before anything changes, then what `talosctl etcd leave` /
// `talosctl etcd remove-member` and `talosctl reset` ask Talos for.

// RemovalQuorum is what removing one member does to etcd's quorum, under
// etcd's strict reconfiguration check (etcd v3.6.11, the etcd Talos
// v1.13.3 runs: server/etcdserver/server.go mayRemoveMember, unchanged
// since v3.6.5, on by default): the members left must still be a quorum
// of themselves among those that run, unless the member removed is itself
// down.
type RemovalQuorum struct {
	// Members is the voting members before the removal (learners do not
	// count), Running those whose etcd runs, TargetRuns whether the
	// member removed is one of them.
	Members, Running int
	TargetRuns       bool
}

// Allowed says whether etcd would accept the removal, and why not.
func (q RemovalQuorum) Allowed() (bool, string) {
	left := q.Members - 1
	if left < 1 {
		return false, "it is etcd's last member: the cluster would have no etcd"
	}
	if !q.TargetRuns {
		return true, "" // a member that is down is not part of the active quorum
	}
	// (active - 1) < 1 + (members-1)/2 is refused.
	if running, need := q.Running-1, 1+left/2; running < need {
		return false, fmt.Sprintf("%d of the %d members left would run, and etcd needs %d of them for quorum", running, left, need)
	}
	return true, ""
}

// EtcdLeave asks the control plane at t to leave its etcd cluster
// (EtcdLeaveCluster, what `talosctl etcd leave` sends): Talos removes its
// own member, stops etcd and deletes the data. A member already gone is
// not an error on Talos' side.
func (o *Ops) EtcdLeave(ctx context.Context, t Target) error {
	err := o.call(ctx, t.IP, true, o.opts.HealthTimeout, func(ctx context.Context, c *client.Client) error {
		return c.EtcdLeaveCluster(ctx, &machine.EtcdLeaveClusterRequest{})
	})
	if err != nil {
		return fmt.Errorf("%s leaving etcd: %w", t, err)
	}
	return nil
}

// EtcdRemoveMember removes the member id through the control plane at via
// (EtcdRemoveMemberByID, what `talosctl etcd remove-member` sends), for a
// member whose own node cannot leave. gone is true when etcd no longer
// had it (NotFound).
func (o *Ops) EtcdRemoveMember(ctx context.Context, via Target, id uint64) (gone bool, err error) {
	err = o.call(ctx, via.IP, true, o.opts.CallTimeout, func(ctx context.Context, c *client.Client) error {
		return c.EtcdRemoveMemberByID(ctx, &machine.EtcdRemoveMemberByIDRequest{MemberId: id})
	})
	if status.Code(err) == codes.NotFound || err != nil && strings.Contains(err.Error(), "member not found") {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("removing etcd member %x through %s: %w", id, via, err)
	}
	return false, nil
}

// ResetAndShutdown asks the node at t for the reset `talosctl reset`
// sends by default (graceful, the whole system disk, no reboot): Talos
// cordons and drains it, a control plane leaves etcd, the disk is wiped
// and the machine powers off (v1alpha1_sequencer.go Reset at v1.13.3).
// The sequence runs after the answer: callers wait for the power-off.
// A node that went away before answering is reported as such (down),
// not as an error: the sequence may already run.
func (o *Ops) ResetAndShutdown(ctx context.Context, t Target) (down bool, err error) {
	err = o.call(ctx, t.IP, true, o.opts.CallTimeout, func(ctx context.Context, c *client.Client) error {
		_, err := c.MachineClient.Reset(ctx, &machine.ResetRequest{Graceful: true, Reboot: false})
		return err
	})
	if isDown(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("resetting %s: %w", t, err)
	}
	return false, nil
}
