package e2e_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/lab/pvesim"
)

// A Proxmox cluster of three members: the three control planes land on
// three members, the run says so, and the postcheck reports where each
// VM runs. A control plane the user migrates next to another is adopted
// where it is on the next run (nothing created, nothing changed on
// Proxmox) and the postcheck warns that two etcd members share a host.
// With proxmox.ha every VM becomes an HA resource once, and the precheck
// says HA cannot recover VMs whose disks are on local storage; on PVE 9
// one HA rule keeps the control planes on separate members.
func TestSeveralProxmoxHosts(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	// PVE 9, whose HA rules keep the control planes apart (PVE 8 has none:
	// the stages and proxmox tests hold its warning).
	h := startHarness(t, e2e.Options{ControlPlanes: 3, Workers: 1, ProxmoxHosts: 3, ProxmoxHA: true, ProxmoxVersion: "9.1.2"})
	r := run(t, ctx, h, "run", "--stage", "all")
	if r.ExitCode != 0 {
		t.Fatalf("pipeline on three members:\n%s", r.Tail(40))
	}
	if !strings.Contains(r.Stderr, "placement: cp-1 → pve1, cp-2 → pve2, cp-3 → pve3, wk-1 → pve1") {
		t.Errorf("the run does not show the placement:\n%s", r.Tail(60))
	}
	// Each member downloads its own ISO (local storage), all at once:
	// every download started before any had finished.
	var spans []pvesim.Span
	for _, m := range h.Lab.PVEMembers {
		spans = append(spans, m.TaskSpans("download")...)
	}
	if len(spans) != 3 {
		t.Errorf("%d ISO downloads on three members with local storage", len(spans))
	} else {
		lastStart, firstEnd := spans[0].Start, spans[0].End
		for _, sp := range spans {
			if sp.Start.After(lastStart) {
				lastStart = sp.Start
			}
			if sp.End.Before(firstEnd) {
				firstEnd = sp.End
			}
		}
		if lastStart.After(firstEnd) {
			t.Errorf("the members' ISO downloads ran one after another (the last started %v after the first ended)", lastStart.Sub(firstEnd))
		}
	}
	st, err := h.State()
	if err != nil {
		t.Fatal(err)
	}
	var hosts []string
	for _, name := range []string{"cp-1", "cp-2", "cp-3"} {
		n := st.Outputs.Nodes[name]
		got := h.Lab.PVE.VMNode(n.VMID)
		if got != n.Host {
			t.Errorf("%s: VM %d runs on %q, the state says %q", name, n.VMID, got, n.Host)
		}
		hosts = append(hosts, got)
	}
	slices.Sort(hosts)
	if len(slices.Compact(slices.Clone(hosts))) != 3 {
		t.Errorf("control planes on %v, want three members", hosts)
	}
	if err := h.PostcheckGreen(); err != nil {
		t.Fatal(err)
	}
	for name, n := range st.Outputs.Nodes {
		if !h.Lab.PVEFor(n.VMID).HAManaged(n.VMID) {
			t.Errorf("%s: VM %d is not an HA resource", name, n.VMID)
		}
	}
	// One negative resource-affinity rule over the three control planes.
	var cpSIDs []string
	for _, name := range []string{"cp-1", "cp-2", "cp-3"} {
		cpSIDs = append(cpSIDs, fmt.Sprintf("vm:%d", st.Outputs.Nodes[name].VMID))
	}
	slices.Sort(cpSIDs)
	if rules := h.Lab.PVE.HARules(); len(rules) != 1 || rules[0].ID != "bootstrap-"+h.Config().Cluster.Name+"-cp" || rules[0].Type != "resource-affinity" ||
		rules[0].Affinity != "negative" || !slices.Equal(rules[0].Resources, cpSIDs) {
		t.Errorf("HA rules %+v, want one negative resource-affinity rule over %v", rules, cpSIDs)
	}
	pr := run(t, ctx, h, "run", "--stage", "precheck")
	for _, m := range []string{"pve1", "pve2", "pve3"} {
		if !strings.Contains(pr.Stdout+pr.Stderr, "proxmox: node ("+m+")") {
			t.Errorf("the precheck does not check member %s:\n%s", m, pr.Tail(40))
		}
	}
	// The ISO storage no longer counts: the talos stage ejected the ISO
	// once Talos ran from the disks.
	if !strings.Contains(pr.Stdout, "local-lvm is not shared storage: HA cannot restart") {
		t.Errorf("the precheck does not say HA cannot recover VMs on local disks:\n%s", pr.Stdout)
	}

	// The user moves cp-2 next to cp-1: possible since the talos stage
	// ejected its ISO (a cdrom on local storage blocks a migration).
	cp1, cp2 := st.Outputs.Nodes["cp-1"], st.Outputs.Nodes["cp-2"]
	if vm, _ := h.Lab.PVEFor(cp2.VMID).VM(cp2.VMID); vm.Config["ide2"] != "none,media=cdrom" {
		t.Errorf("cp-2's ISO was not ejected: ide2 %q", vm.Config["ide2"])
	}
	if err := h.Lab.PVE.Migrate(ctx, cp2.VMID, cp1.Host); err != nil {
		t.Fatal(err)
	}
	before, err := h.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r = run(t, ctx, h, "run", "--stage", "all")
	if r.ExitCode != 0 {
		t.Fatalf("run after the migration:\n%s", r.Tail(40))
	}
	after, err := h.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := after.ProxmoxMutating - before.ProxmoxMutating; n != 0 {
		t.Errorf("the run after a migration changed Proxmox %d times: %v", n, after.ProxmoxList)
	}
	if got := h.Lab.PVE.VMNode(cp2.VMID); got != cp1.Host {
		t.Errorf("cp-2 runs on %q after the run, the user put it on %s", got, cp1.Host)
	}
	want := "cp-1 and cp-2 share " + cp1.Host
	if !strings.Contains(r.Stdout, want) {
		t.Errorf("the postcheck does not warn %q:\n%s", want, r.Tail(40))
	}
	st, err = h.State()
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Outputs.Nodes["cp-2"].Host; got != cp1.Host {
		t.Errorf("state records cp-2 on %q, it runs on %s", got, cp1.Host)
	}
}
