package talossim_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"google.golang.org/grpc/codes"

	"github.com/homelab/bootstrap/lab/talossim"
)

// configuredControlPlane applies cp-1's config, waits for its installed
// system and returns a client with the cluster's credentials.
func (f *fixture) configuredControlPlane(ctx context.Context) *client.Client {
	f.t.Helper()
	if _, err := insecure(f.t, f.cp).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: f.config("cp-1"), Mode: machine.ApplyConfigurationRequest_AUTO}); err != nil {
		f.t.Fatal(err)
	}
	f.waitPhase(f.node(f.cp), talossim.PhaseRunning)
	return secure(f.t, f.cfg, f.cp)
}

// bootstrappedControlPlane is configuredControlPlane with etcd
// bootstrapped on it.
func (f *fixture) bootstrappedControlPlane(ctx context.Context) *client.Client {
	f.t.Helper()
	cp := f.configuredControlPlane(ctx)
	if err := cp.Bootstrap(ctx, &machine.BootstrapRequest{}); err != nil {
		f.t.Fatal(err)
	}
	return cp
}

// TestEtcdRecover: the snapshot uploaded with EtcdRecover is what a
// recover_etcd bootstrap hands the control plane, once; the bootstrap is
// then refused as any second bootstrap is. A destroyed VM's disk is gone:
// the node boots the ISO again.
func TestEtcdRecover(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "secrets.yaml")
	ctx := callCtx(t)
	cp := f.configuredControlPlane(ctx)
	snap := bytes.Repeat([]byte("etcd snapshot "), 1000) // several 4 KiB chunks
	if _, err := cp.EtcdRecover(ctx, bytes.NewReader(snap)); err != nil {
		t.Fatal(err)
	}
	if err := cp.Bootstrap(ctx, &machine.BootstrapRequest{RecoverEtcd: true}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(f.cluster.Recovered()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the control plane was never recovered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := f.cluster.Recovered(); len(got) != 1 || !bytes.Equal(got[0], snap) {
		t.Fatalf("recovered from %d snapshot(s), want exactly the uploaded one", len(got))
	}
	err := cp.Bootstrap(ctx, &machine.BootstrapRequest{RecoverEtcd: true})
	wantCode(t, err, codes.AlreadyExists, "etcd data directory is not empty")
	if c := f.node(f.cp).Counters(); c.RecoverUploads != 1 || c.Recoveries != 1 {
		t.Fatalf("counters %+v", c)
	}

	if err := f.sim.StopNode(f.cp); err != nil {
		t.Fatal(err)
	}
	f.sim.WipeDisk(f.cp)
	n, err := f.sim.BootNode(context.Background(), talossim.NodeSpec{IP: f.cp, Hostname: "cp-1"})
	if err != nil {
		t.Fatal(err)
	}
	f.waitPhase(n, talossim.PhaseMaintenance)
	if f.sim.Installed(f.cp) != nil {
		t.Fatal("a wiped disk still holds the installed config")
	}
}

// TestRecoverWithoutSnapshotFailsEtcd: a recover_etcd bootstrap with no
// uploaded snapshot is accepted, and the etcd service then fails reading
// it, as the service's pre stage does on real Talos.
func TestRecoverWithoutSnapshotFailsEtcd(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "secrets.yaml")
	ctx := callCtx(t)
	cp := f.configuredControlPlane(ctx)
	if err := cp.Bootstrap(ctx, &machine.BootstrapRequest{RecoverEtcd: true}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := cp.ServiceList(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range resp.GetMessages()[0].GetServices() {
			if s.GetId() == "etcd" && strings.Contains(s.GetHealth().GetLastMessage(), "error verifying snapshot") {
				if len(f.cluster.Recovered()) != 0 || f.cluster.Bootstraps() != 0 {
					t.Fatal("the control plane started without a snapshot")
				}
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd never failed: %v", services(t, cp))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestResetWipesEtcd: a non-graceful reset that wipes EPHEMERAL and
// reboots leaves the node configured with an etcd that waits to join (the
// only member's data is gone, so the cluster's etcd is); other resets are
// not simulated and say so.
func TestResetWipesEtcd(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "secrets.yaml")
	ctx := callCtx(t)
	cp := f.bootstrappedControlPlane(ctx)
	_, err := cp.MachineClient.Reset(ctx, &machine.ResetRequest{Graceful: true, Reboot: true,
		SystemPartitionsToWipe: []*machine.ResetPartitionSpec{{Label: "EPHEMERAL", Wipe: true}}})
	wantCode(t, err, codes.Unimplemented, "only a non-graceful reset")
	_, err = cp.MachineClient.Reset(ctx, &machine.ResetRequest{Reboot: true,
		SystemPartitionsToWipe: []*machine.ResetPartitionSpec{{Label: "NOPE", Wipe: true}}})
	if err == nil || !strings.Contains(err.Error(), `failed to get volume status with label "NOPE"`) {
		t.Fatalf("unknown label: %v", err)
	}
	// The install rebooted the node once already: wait for the reset's.
	rebootsBefore := f.node(f.cp).Counters().Reboots
	if _, err := cp.MachineClient.Reset(ctx, &machine.ResetRequest{Reboot: true,
		SystemPartitionsToWipe: []*machine.ResetPartitionSpec{{Label: "EPHEMERAL", Wipe: true}}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if n, ok := f.sim.Node(f.cp); ok && n.Phase() == talossim.PhaseRunning && n.Counters().Reboots > rebootsBefore {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the node never came back from its reset")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cp = secure(t, f.cfg, f.cp)
	if svc := services(t, cp)["etcd"]; strings.HasPrefix(svc, "Running") {
		t.Fatalf("etcd after the wipe: %s", svc)
	}
	if f.sim.Installed(f.cp) == nil {
		t.Fatal("the reset lost the config on STATE")
	}
}

// TestGracefulResetLeavesAndPowersOff: the reset that takes a node out of
// its cluster (graceful, no reboot) powers a worker off with its disk
// wiped; on the only control plane it fails leaving etcd (the last member
// never goes): the sequence stops at that phase with a FATAL event, and
// machined reboots the node into the system it runs, not wiped (main.go
// runEntrypoint, handle at v1.13.9). EtcdLeaveCluster and EtcdRemoveMemberByID on the last
// member say the same; an unknown member ID is NotFound; workers have no
// such API.
func TestGracefulResetLeavesAndPowersOff(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "secrets.yaml")
	ctx := callCtx(t)
	cp := f.bootstrappedControlPlane(ctx)
	if _, err := insecure(t, f.wk).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: f.config("wk-1"), Mode: machine.ApplyConfigurationRequest_AUTO}); err != nil {
		t.Fatal(err)
	}
	f.waitPhase(f.node(f.wk), talossim.PhaseRunning)
	wk := secure(t, f.cfg, f.wk)

	err := wk.EtcdLeaveCluster(ctx, &machine.EtcdLeaveClusterRequest{})
	wantCode(t, err, codes.Unimplemented, "etcd leave is only available on control plane nodes")
	err = cp.EtcdRemoveMemberByID(ctx, &machine.EtcdRemoveMemberByIDRequest{MemberId: 42})
	wantCode(t, err, codes.NotFound, "member not found")
	deadline := time.Now().Add(5 * time.Second)
	var members *machine.EtcdMemberListResponse
	for members == nil || len(members.GetMessages()[0].GetMembers()) == 0 {
		if members, err = cp.EtcdMemberList(ctx, &machine.EtcdMemberListRequest{}); err != nil && time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	err = cp.EtcdRemoveMemberByID(ctx, &machine.EtcdRemoveMemberByIDRequest{MemberId: members.GetMessages()[0].GetMembers()[0].GetId()})
	wantCode(t, err, codes.Unknown, "not enough started members")
	err = cp.EtcdLeaveCluster(ctx, &machine.EtcdLeaveClusterRequest{})
	wantCode(t, err, codes.Unknown, "failed to leave cluster: failed to remove member")

	if _, err := wk.MachineClient.Reset(ctx, &machine.ResetRequest{Graceful: true}); err != nil {
		t.Fatal(err)
	}
	cpReboots := f.node(f.cp).Counters().Reboots
	if _, err := cp.MachineClient.Reset(ctx, &machine.ResetRequest{Graceful: true}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for {
		if _, up := f.sim.Node(f.wk); !up {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the worker did not power off after its reset")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if f.sim.Installed(f.wk) != nil {
		t.Error("the reset worker's disk still holds its config")
	}
	f.waitRebooted(f.node(f.cp), cpReboots)
	if n := f.node(f.cp); n.Counters().Resets != 1 || n.Counters().FailedResets != 1 || n.Counters().RebootCalls != 0 || f.sim.Installed(f.cp) == nil {
		t.Errorf("the control plane whose leave failed: phase %s, %+v, installed %v", n.Phase(), n.Counters(), f.sim.Installed(f.cp) != nil)
	}
}

// TestResetETCDLabel: the ETCD volume is a directory under EPHEMERAL by
// default. v1.13 refuses the label ("not located"); v1.14 takes it only
// with EPHEMERAL, the volume it resides on (v1alpha1_server.go Reset at
// v1.13.3 and v1.14.0-rc.1).
func TestResetETCDLabel(t *testing.T) {
	t.Parallel()
	etcdOnly := []*machine.ResetPartitionSpec{{Label: "ETCD", Wipe: true}}
	both := []*machine.ResetPartitionSpec{{Label: "EPHEMERAL", Wipe: true}, {Label: "ETCD", Wipe: true}}
	f := newFixture(t, "secrets.yaml")
	ctx := callCtx(t)
	cp := f.bootstrappedControlPlane(ctx)
	if _, err := cp.MachineClient.Reset(ctx, &machine.ResetRequest{Reboot: true, SystemPartitionsToWipe: both}); err == nil || !strings.Contains(err.Error(), `failed to reset: volume "ETCD" is not located`) {
		t.Errorf("ETCD on v1.13: %v", err)
	}
	f14 := newFixtureOn(t, "secrets.yaml", talossim.Profile{}, "v1.14.1")
	cp14 := f14.bootstrappedControlPlane(ctx)
	if _, err := cp14.MachineClient.Reset(ctx, &machine.ResetRequest{Reboot: true, SystemPartitionsToWipe: etcdOnly}); err == nil ||
		!strings.Contains(err.Error(), `volume "ETCD" resides on volume "EPHEMERAL", and therefore "ETCD" cannot be wiped without wiping "EPHEMERAL"`) {
		t.Errorf("ETCD alone on v1.14: %v", err)
	}
	if _, err := cp14.MachineClient.Reset(ctx, &machine.ResetRequest{Reboot: true, SystemPartitionsToWipe: both}); err != nil {
		t.Errorf("EPHEMERAL and ETCD on v1.14: %v", err)
	}
	if c := f14.node(f14.cp).Counters(); c.Resets != 1 {
		t.Errorf("%d resets on v1.14, want 1", c.Resets)
	}
}
