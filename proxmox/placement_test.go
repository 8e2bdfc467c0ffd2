package proxmox

import (
	"strings"
	"testing"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/lab/pvesim"
)

func placed(specs []VMSpec) string {
	var parts []string
	for _, s := range specs {
		parts = append(parts, s.Name+"@"+s.Node)
	}
	return strings.Join(parts, " ")
}

// Control planes on distinct members while there are members to spare,
// workers by free memory, a pinned host kept, an existing VM left where
// it is, and the same answer for the same inputs.
func TestPlace(t *testing.T) {
	hosts := []HostRoom{{"pve1", 10 << 30}, {"pve2", 12 << 30}, {"pve3", 8 << 30}}
	ss := specs(5) // node-1..3 control planes, node-4..5 workers, 2 GiB each
	got := placed(Place(ss, hosts, nil))
	// Control planes: fewest so far, then most free: pve2 (12 GiB), pve1
	// (10), pve3 (8). Workers by what is left: pve2 (10), then pve1 and
	// pve2 tie at 8 and the hosts' order decides.
	want := "node-1@pve2 node-2@pve1 node-3@pve3 node-4@pve2 node-5@pve1"
	if got != want {
		t.Errorf("placement %s, want %s", got, want)
	}
	if again := placed(Place(ss, hosts, nil)); again != got {
		t.Errorf("not deterministic: %s then %s", got, again)
	}
	// node-2 already runs on pve3 (migrated there); node-1 is pinned to pve1.
	ss[0].Node = "pve1"
	got = placed(Place(ss, hosts, map[int]string{702: "pve3"}))
	if want := "node-1@pve1 node-2@pve3 node-3@pve2 node-4@pve2 node-5@pve1"; got != want {
		t.Errorf("with a pin and an existing VM: %s, want %s", got, want)
	}
	// More control planes than members: the fourth shares the roomiest.
	four := specs(4)
	four[3].Role = "controlplane"
	if got := placed(Place(four, hosts[:2], nil)); got != "node-1@pve2 node-2@pve1 node-3@pve2 node-4@pve1" {
		t.Errorf("4 control planes on 2 members: %s", got)
	}
}

// A pvesim cluster of three members: the VMs are placed, created and
// started each on its member through one endpoint, the member checks run
// on every member, and a VM migrated by the user is adopted where it is.
func TestSeveralMembers(t *testing.T) {
	ms, c := newCluster(t, pvesim.Options{Bridges: vlanBridge,
		RemoteFiles: map[string]pvesim.RemoteFile{isoURL: {Content: isoBytes}}},
		[]pvesim.NodeSpec{{Name: "pve1"}, {Name: "pve2", MemoryBytes: 32 << 30}, {Name: "pve3"}}, nil)
	ctx := ctxT(t)
	in := precheckInput(4)
	in.Hosts = []string{"pve1", "pve2", "pve3"}
	rs := runPrechecks(t, c, in)
	expect(t, rs, "proxmox: cluster quorum", check.Pass, "quorate, 3 of 3 members online")
	for _, h := range in.Hosts {
		expect(t, rs, "proxmox: node ("+h+")", check.Pass, "node "+h+" online")
		expect(t, rs, "proxmox: ISO storage ("+h+")", check.Warn, "will be downloaded", "local is not shared", "local cdrom image")
	}
	// pve2 has the most memory: a control plane and the worker.
	expect(t, rs, "proxmox: RAM and CPU headroom (pve2)", check.Pass, "4 vCPUs")
	expect(t, rs, "proxmox: RAM and CPU headroom (pve3)", check.Pass, "2 vCPUs")

	vms, err := c.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ss, err := c.PlaceVMs(ctx, specs(4), in.Hosts, vms)
	if err != nil {
		t.Fatal(err)
	}
	if got := placed(ss); got != "node-1@pve2 node-2@pve1 node-3@pve3 node-4@pve2" {
		t.Fatalf("placement %s", got)
	}
	src := iso
	src.Checksum = isoSum()
	for _, h := range []string{"pve1", "pve2", "pve3"} {
		if _, err := c.On(h).EnsureISO(ctx, src); err != nil {
			t.Fatalf("ISO on %s: %v", h, err)
		}
	}
	for _, s := range ss {
		p, err := c.PlanVM(ctx, s, vms)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.ApplyPlan(ctx, p); err != nil {
			t.Fatal(err)
		}
		if err := c.On(p.Spec.Node).Start(ctx, s.VMID); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range ss {
		if got := ms[0].VMNode(s.VMID); got != s.Node {
			t.Errorf("VM %d %s runs on %q, placed on %s", s.VMID, s.Name, got, s.Node)
		}
	}

	// The user ejects node-3's ISO and migrates it to pve1: the next plan
	// adopts it there, changes nothing, and says where it was asked to be.
	if err := ms[2].EditVM(703, map[string]string{"ide2": "none,media=cdrom"}); err != nil {
		t.Fatal(err)
	}
	if err := ms[0].Migrate(ctx, 703, "pve1"); err != nil {
		t.Fatal(err)
	}
	vms, err = c.ListVMs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pinned := spec(3)
	pinned.Node = "pve3"
	p, err := c.PlanVM(ctx, pinned, vms)
	if err != nil {
		t.Fatal(err)
	}
	if p.Create || p.Spec.Node != "pve1" || p.Elsewhere != "pve3" || p.Start {
		t.Errorf("migrated VM: create %v, node %s, elsewhere %q, start %v", p.Create, p.Spec.Node, p.Elsewhere, p.Start)
	}
	if ch := p.Changes(); len(ch) != 0 {
		t.Errorf("adopting a migrated VM changes %v", ch)
	}
	// Placement keeps it where it is when the config does not pin it.
	again, err := c.PlaceVMs(ctx, specs(4), in.Hosts, vms)
	if err != nil {
		t.Fatal(err)
	}
	if again[2].Node != "pve1" {
		t.Errorf("an existing VM is placed where it runs, got %s", again[2].Node)
	}

	// Quorum lost: the precheck says what Proxmox will refuse, and the
	// create does fail that way.
	if err := ms[0].SetQuorate(false); err != nil {
		t.Fatal(err)
	}
	rs = runPrechecks(t, c, in)
	expect(t, rs, "proxmox: cluster quorum", check.Fail, "has no quorum", "cluster not ready - no quorum?", "pvecm expected 1")
	five := spec(5)
	five.Node = "pve3"
	p, err = c.PlanVM(ctx, five, vms)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ApplyPlan(ctx, p); err == nil || !strings.Contains(err.Error(), "no quorum") {
		t.Errorf("a create without quorum: %v", err)
	}
}
