package talos

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/homelab/bootstrap/lab/talossim"
)

// loseEveryVM destroys every node's VM with its disk and boots a new one
// at the same address: fresh nodes in maintenance mode, etcd's data gone.
func (h *harness) loseEveryVM(ctx context.Context) {
	h.t.Helper()
	for _, n := range h.res.Nodes {
		if err := h.sim.StopNode(n.IP); err != nil {
			h.t.Fatal(err)
		}
		h.sim.WipeDisk(n.IP)
		node, err := h.sim.BootNode(ctx, talossim.NodeSpec{IP: n.IP, Hostname: n.Name, Disks: []talossim.Disk{{Bus: "scsi", Size: 64 << 30}}})
		if err != nil {
			h.t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = node.WaitPhase(wctx, talossim.PhaseMaintenance)
		cancel()
		if err != nil {
			h.t.Fatal(err)
		}
	}
}

// TestLostEtcdIsRestoredNotReplaced: after every VM of a bootstrapped
// cluster was re-created, Converge applies the configs but refuses to
// bootstrap an empty etcd (EtcdLostError, no Bootstrap call); with a
// recovery snapshot it uploads it to the bootstrap node and bootstraps
// with recover_etcd, once; NewEtcd starts empty on purpose.
func TestLostEtcdIsRestoredNotReplaced(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 3})
	ctx := testCtx(t)
	if _, err := h.converge(ctx, nil); err != nil {
		t.Fatal(err)
	}
	h.loseEveryVM(ctx)
	opts := ConvergeOptions{Nodes: h.targets(), KubeconfigPath: filepath.Join(h.dir, KubeconfigFile), BootstrapNode: "cp-1", BootstrappedAt: fixedNow}
	_, err := h.ops.Converge(ctx, opts)
	var lost *EtcdLostError
	if !errors.As(err, &lost) || lost.Node != "cp-1" {
		t.Fatalf("converge over a lost etcd: %v", err)
	}
	if total, _ := h.counters(); total.BootstrapCalls != 0 || total.Installs != 3 {
		t.Fatalf("refused run: %d bootstrap calls, %d installs", total.BootstrapCalls, total.Installs)
	}

	snap := bytes.Repeat([]byte{7}, 10_000)
	opts.Recover = &Recovery{Name: "test.snapshot", Snapshot: bytes.NewReader(snap)}
	res, err := h.ops.Converge(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Recovered || !res.Bootstrapped {
		t.Fatalf("result %+v", res)
	}
	if got := h.cluster.Recovered(); len(got) != 1 || !bytes.Equal(got[0], snap) {
		t.Fatalf("recovered %d snapshot(s), want the one given", len(got))
	}
	_, byNode := h.counters()
	if c := h.node("cp-1").Counters(); c.RecoverUploads != 1 || c.Recoveries != 1 || byNode["cp-2"].BootstrapCalls+byNode["cp-3"].BootstrapCalls != 0 {
		t.Fatalf("cp-1 %+v; other control planes bootstrapped", c)
	}

	h.loseEveryVM(ctx)
	opts.Recover, opts.NewEtcd = nil, true
	if res, err := h.ops.Converge(ctx, opts); err != nil || !res.Bootstrapped || res.Recovered {
		t.Fatalf("new etcd on purpose: %+v %v", res, err)
	}
}

// TestReplacedControlPlaneRejoinsUnderANewMemberID: a control plane whose
// VM was re-created with an empty disk joins again as Talos' etcd service
// makes it: the member its old disk held is removed (same hostname) and
// it is added anew under another member ID, so the cluster ends with
// three members, none a learner, and converge's health wait passes.
func TestReplacedControlPlaneRejoinsUnderANewMemberID(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 3})
	ctx := testCtx(t)
	if _, err := h.converge(ctx, nil); err != nil {
		t.Fatal(err)
	}
	ids := func() map[string]uint64 {
		t.Helper()
		members, err := h.ops.EtcdMembers(ctx, h.res.Nodes[0].IP)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]uint64{}
		for _, m := range members {
			if _, dup := out[m.Hostname]; dup || m.Learner {
				t.Fatalf("members %+v: a hostname twice or a learner", members)
			}
			out[m.Hostname] = m.ID
		}
		return out
	}
	before := ids()
	cp3 := h.res.Nodes[2]
	if err := h.sim.StopNode(cp3.IP); err != nil {
		t.Fatal(err)
	}
	h.sim.WipeDisk(cp3.IP)
	node, err := h.sim.BootNode(ctx, talossim.NodeSpec{IP: cp3.IP, Hostname: cp3.Name, Disks: []talossim.Disk{{Bus: "scsi", Size: 64 << 30}}})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := node.WaitPhase(wctx, talossim.PhaseMaintenance); err != nil {
		t.Fatal(err)
	}
	if _, err := h.converge(ctx, nil); err != nil {
		t.Fatal(err)
	}
	after := ids()
	if len(after) != 3 || after["cp-1"] != before["cp-1"] || after["cp-2"] != before["cp-2"] {
		t.Errorf("members %v, were %v: want cp-1 and cp-2 unchanged", after, before)
	}
	if after[cp3.Name] == before[cp3.Name] {
		t.Errorf("%s rejoined under its old member ID %x: Talos removes the stale member and adds a new one", cp3.Name, after[cp3.Name])
	}
}

// TestEtcdAddsNoMemberWhileAVoterIsDown: etcd v3.6.11 refuses to add a
// member (a learner too) unless the member asked is connected to
// quorum(voters+1) of the voting members (server/etcdserver/server.go
// mayAddMember). cp-2 is re-created while cp-3 is powered off: its stale
// member goes (a member that is down may), then cp-1 and cp-3 are the
// voters and only cp-1 runs, 1 < quorum(3) = 2, so cp-2's etcd asks again
// and again without joining. Once cp-3 runs again, cp-2 joins.
func TestEtcdAddsNoMemberWhileAVoterIsDown(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 3})
	ctx := testCtx(t)
	if _, err := h.converge(ctx, nil); err != nil {
		t.Fatal(err)
	}
	cp1, cp2, cp3 := h.res.Nodes[0], h.res.Nodes[1], h.res.Nodes[2]
	if err := h.sim.StopNode(cp3.IP); err != nil {
		t.Fatal(err)
	}
	if err := h.sim.StopNode(cp2.IP); err != nil {
		t.Fatal(err)
	}
	h.sim.WipeDisk(cp2.IP)
	boot := func(n RenderedNode, phase talossim.Phase) {
		t.Helper()
		node, err := h.sim.BootNode(ctx, talossim.NodeSpec{IP: n.IP, Hostname: n.Name, Disks: []talossim.Disk{{Bus: "scsi", Size: 64 << 30}}})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := node.WaitPhase(wctx, phase); err != nil {
			t.Fatal(err)
		}
	}
	boot(cp2, talossim.PhaseMaintenance)
	target := h.targets()[1]
	if _, err := h.ops.EnsureConfig(ctx, target, EnsureOptions{}); err != nil {
		t.Fatal(err)
	}
	members := func() []string {
		t.Helper()
		ms, err := h.ops.EtcdMembers(ctx, cp1.IP)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range ms {
			out = append(out, m.Hostname)
		}
		slices.Sort(out)
		return out
	}
	// Refused, and asked again (EtcdJoinRetry is 20 ms here).
	deadline := time.Now().Add(5 * time.Second)
	for h.node("cp-2").Counters().EtcdAddsRefused < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("cp-2 joining with cp-3 down: %d refused adds after 5 s, members %v", h.node("cp-2").Counters().EtcdAddsRefused, members())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := members(); !slices.Equal(got, []string{"cp-1", "cp-3"}) {
		t.Fatalf("members with cp-3 down %v, want cp-1 and cp-3 (cp-2's stale member removed, no new one)", got)
	}
	boot(cp3, talossim.PhaseRunning)
	deadline = time.Now().Add(5 * time.Second)
	for !slices.Equal(members(), []string{"cp-1", "cp-2", "cp-3"}) {
		if time.Now().After(deadline) {
			t.Fatalf("cp-2 did not join once cp-3 ran again: members %v", members())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestResetClearsADedicatedEtcdVolume: from Talos v1.14 etcd may live on a
// partition of its own (a VolumeConfig named ETCD), which a reset of
// EPHEMERAL alone leaves alone: etcd would come back with its old data and
// rejoin the cluster a forced restore is replacing. ResetEtcdData wipes
// ETCD too on v1.14 (and only there: v1.13 refuses the label).
func TestResetClearsADedicatedEtcdVolume(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	patch := writePatch(t, dir, "etcd-volume.yaml", `apiVersion: v1alpha1
kind: VolumeConfig
name: ETCD
provisioning:
  diskSelector:
    match: system_disk
  minSize: 2GiB
  maxSize: 4GiB
`)
	h := newHarness(t, harnessOptions{controlPlanes: 1, talosVersion: "v1.14.1", patches: []string{patch}})
	ctx := testCtx(t)
	if _, err := h.converge(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := h.ops.ResetEtcdData(ctx, h.targets()); err != nil {
		t.Fatalf("resetting etcd's data on a dedicated ETCD volume: %v", err)
	}
	if c := h.node("cp-1").Counters(); c.Resets != 1 {
		t.Fatalf("%d resets", c.Resets)
	}
}
