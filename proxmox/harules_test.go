package proxmox

import (
	"fmt"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/lab/pvesim"
)

// haCluster is a pvesim cluster of three members on PVE version, each
// running one HA-managed control plane of cluster "lab" (70<i> on pve<i>).
func haCluster(t *testing.T, version string) ([]*pvesim.Server, *Client) {
	t.Helper()
	ms, c := newCluster(t, pvesim.Options{Version: version}, []pvesim.NodeSpec{{Name: "pve1"}, {Name: "pve2"}, {Name: "pve3"}}, nil)
	for i, m := range ms {
		id := 701 + i
		if err := m.SeedVM(id, map[string]string{"name": fmt.Sprintf("cp-%d", i+1), "memory": "2048", "tags": "talos;bootstrap-lab"}, true); err != nil {
			t.Fatal(err)
		}
		if err := c.AddToHA(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
	}
	return ms, c
}

func ruleOf(t *testing.T, s *pvesim.Server) string {
	t.Helper()
	var out []string
	for _, r := range s.HARules() {
		out = append(out, fmt.Sprintf("%s %s %s %s", r.ID, r.Type, r.Affinity, strings.Join(r.Resources, ",")))
	}
	return strings.Join(out, "; ")
}

// On PVE 9 the control planes get one negative resource-affinity rule:
// created once, left alone when it matches, its resources set when a
// control plane comes or goes.
func TestSeparationRuleOnPVE9(t *testing.T) {
	ms, c := haCluster(t, "9.0.11")
	ctx := ctxT(t)
	p, err := c.PlanSeparation(ctx, "lab", []int{703, 701, 702})
	if err != nil {
		t.Fatal(err)
	}
	if p.Skip() != "" || p.Converged() || !strings.HasPrefix(p.Change(), "create HA rule bootstrap-lab-cp (resource-affinity, negative) over vm:701,vm:702,vm:703") {
		t.Fatalf("plan on an empty rule set: skip %q, change %q", p.Skip(), p.Change())
	}
	if err := c.ApplySeparation(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := ruleOf(t, ms[1]); got != "bootstrap-lab-cp resource-affinity negative vm:701,vm:702,vm:703" {
		t.Fatalf("rules after the create: %q", got)
	}

	// A converged re-run reads and sends nothing.
	for _, m := range ms {
		m.ResetCounters()
	}
	if p, err = c.PlanSeparation(ctx, "lab", []int{701, 702, 703}); err != nil || !p.Converged() || p.Change() != "" {
		t.Fatalf("re-plan: %v, converged %v, change %q", err, p.Converged(), p.Change())
	}
	if err := c.ApplySeparation(ctx, p); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if n := m.MutatingCalls(); n != 0 {
			t.Errorf("converged run: %d mutating calls %v", n, m.MutatingCallList())
		}
	}

	// cp-3 is removed: it leaves the rule before it leaves HA (9.0 keeps a
	// deleted resource in the rules).
	if err := c.DestroyClusterVM(ctx, "lab", VMSummary{VMID: 703, Node: "pve3"}); err != nil {
		t.Fatal(err)
	}
	if got := ruleOf(t, ms[0]); got != "bootstrap-lab-cp resource-affinity negative vm:701,vm:702" {
		t.Fatalf("rules after VM 703 went: %q", got)
	}
	// A new control plane 704 on pve3: the rule's resources are set.
	if err := ms[2].SeedVM(704, map[string]string{"name": "cp-4", "memory": "2048", "tags": "talos;bootstrap-lab"}, true); err != nil {
		t.Fatal(err)
	}
	if err := c.AddToHA(ctx, 704); err != nil {
		t.Fatal(err)
	}
	p, err = c.PlanSeparation(ctx, "lab", []int{701, 702, 704})
	if err != nil {
		t.Fatal(err)
	}
	if want := "set HA rule bootstrap-lab-cp: resources vm:701,vm:702,vm:704 (was vm:701,vm:702)"; p.Change() != want {
		t.Fatalf("change %q, want %q", p.Change(), want)
	}
	if err := c.ApplySeparation(ctx, p); err != nil {
		t.Fatal(err)
	}
	if got := ruleOf(t, ms[0]); got != "bootstrap-lab-cp resource-affinity negative vm:701,vm:702,vm:704" {
		t.Fatalf("rules after the update: %q", got)
	}
	// Four control planes on three members: no rule can hold them.
	if p, err = c.PlanSeparation(ctx, "lab", []int{701, 702, 704, 705}); err != nil || !strings.Contains(p.Skip(), "4 control planes on a Proxmox cluster of 3 nodes") {
		t.Fatalf("four on three: %v, skip %q", err, p.Skip())
	}
	// Two removed: the rule cannot hold one resource, so it goes.
	if err := c.DestroyClusterVM(ctx, "lab", VMSummary{VMID: 704, Node: "pve3"}); err != nil {
		t.Fatal(err)
	}
	if err := c.DestroyClusterVM(ctx, "lab", VMSummary{VMID: 702, Node: "pve2"}); err != nil {
		t.Fatal(err)
	}
	if got := ruleOf(t, ms[0]); got != "" {
		t.Fatalf("rules with one control plane left: %q", got)
	}
	if deleted, err := c.DeleteSeparationRule(ctx, "lab"); err != nil || deleted {
		t.Fatalf("deleting a rule that is gone: %v %v", deleted, err)
	}
}

// destroy removes the rule.
func TestDeleteSeparationRule(t *testing.T) {
	ms, c := haCluster(t, "9.1.2")
	ctx := ctxT(t)
	p, err := c.PlanSeparation(ctx, "lab", []int{701, 702, 703})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ApplySeparation(ctx, p); err != nil {
		t.Fatal(err)
	}
	if deleted, err := c.DeleteSeparationRule(ctx, "lab"); err != nil || !deleted {
		t.Fatalf("delete: %v %v", deleted, err)
	}
	if got := ruleOf(t, ms[0]); got != "" {
		t.Fatalf("rules after the delete: %q", got)
	}
}

// PVE 8 has no rules: the plan says why and nothing is sent.
func TestSeparationOnPVE8SaysWhyAndSendsNothing(t *testing.T) {
	ms, c := haCluster(t, "8.4.1")
	ctx := ctxT(t)
	for _, m := range ms {
		m.ResetCounters()
	}
	p, err := c.PlanSeparation(ctx, "lab", []int{701, 702, 703})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(p.Skip(), "PVE 8.4.1 has no HA rule that keeps VMs apart") || p.Change() != "" {
		t.Fatalf("skip %q, change %q", p.Skip(), p.Change())
	}
	if err := c.ApplySeparation(ctx, p); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		for call := range m.Calls() {
			if strings.Contains(call, "/cluster/ha/rules") {
				t.Errorf("PVE 8: %s sent", call)
			}
		}
		if n := m.MutatingCalls(); n != 0 {
			t.Errorf("PVE 8: %d mutating calls %v", n, m.MutatingCallList())
		}
	}
	if deleted, err := c.DeleteSeparationRule(ctx, "lab"); err != nil || deleted {
		t.Fatalf("delete on PVE 8: %v %v", deleted, err)
	}
}

func TestSeparationRuleID(t *testing.T) {
	for in, want := range map[string]string{"lab": "bootstrap-lab-cp", "home.lab": "bootstrap-home-lab-cp"} {
		if got := SeparationRuleID(in); got != want {
			t.Errorf("SeparationRuleID(%q) = %q, want %q", in, got, want)
		}
	}
}

// The HA row names the rule on PVE 9 and says PVE 8's limit; the
// privileges ask what the rules API checks, on PVE 9 only.
func TestHARowAndPrivilegesOfTheRule(t *testing.T) {
	shared := []pvesim.StorageSpec{
		{Name: "local", Type: "dir", Content: []string{"iso", "vztmpl", "backup"}, TotalBytes: 94 << 30, Path: "/var/lib/vz", Shared: false},
		{Name: "nas", Type: "nfs", Content: []string{"images", "iso"}, TotalBytes: 2 << 40, Shared: true},
	}
	_, c := newCluster(t, pvesim.Options{Bridges: vlanBridge, Version: "9.1.2", Storages: shared},
		[]pvesim.NodeSpec{{Name: "pve1"}, {Name: "pve2"}, {Name: "pve3"}}, nil)
	in := precheckInput(3)
	for i := range in.VMs {
		in.VMs[i].DiskStorage, in.VMs[i].ISOStorage = "nas", "nas"
	}
	in.ISO.Storage = "nas"
	in.Hosts, in.HA = []string{"pve1", "pve2", "pve3"}, true
	rs := runPrechecks(t, c, in)
	expect(t, rs, "proxmox: HA", check.Pass, "HA rule bootstrap-lab-cp keeps the control planes on separate members")

	has := func(v string) bool {
		ver, _ := ParseVersion(v)
		for _, n := range RequiredPrivileges("pve1", ver, in, nil, false) {
			if n.Options[0].Path == "/" && strings.Contains(n.Why, "HA rule") && strings.Join(n.Options[0].Privs, "+") == "Sys.Audit+Sys.Console" {
				return true
			}
		}
		return false
	}
	if !has("9.0.11") || has("8.4.1") {
		t.Errorf("the rule's privileges: asked on 9.0 %v, on 8.4 %v; want only on 9", has("9.0.11"), has("8.4.1"))
	}
}
