package proxmox

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/lab/pvesim"
)

// roleEnv is a host where bootstrap@pve and its privilege-separated token
// run hold exactly the given privileges on /, as RunnerSetup grants them.
func roleEnv(t *testing.T, version string, privs []string) (*env, *Client) {
	t.Helper()
	acl := []pvesim.ACE{{Path: "/", Privileges: privs}}
	e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Version: version,
		GuestAgent: func(int) bool { return true },
		Users:      []pvesim.User{{ID: "bootstrap@pve", ACL: acl}},
		Tokens:     []pvesim.Token{{ID: "bootstrap@pve!run", Secret: "s", ACL: acl}}})
	return e, e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!run", "s" })
}

func testVersion(t *testing.T, s string) Version {
	t.Helper()
	v, err := ParseVersion(s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The documented role is enough for everything the tool does with
// Proxmox, day one and day two: the precheck passes without a warning, the
// ISO downloads, VMs are created on a VLAN and started, an adopted VM is
// resized and its disk grown, the guest agent answers, a removed node's VM
// is stopped and destroyed.
func TestRunnerRoleIsEnough(t *testing.T) {
	for _, version := range []string{"9.1.2", "8.4.1", "8.1.4"} {
		t.Run(version, func(t *testing.T) {
			e, c := roleEnv(t, version, RunnerPrivileges(testVersion(t, version)))
			rs := runPrechecks(t, c, precheckInput(2))
			for name, r := range rs {
				if r.Status != check.Pass {
					t.Errorf("%s: %s %s", name, r.Status, r.Reason)
				}
			}
			ctx := ctxT(t)
			ss := specs(2)
			e.provision(ctx, c, ss)
			e.checkProvisioned(ss)
			if err := c.AgentPing(ctx, ss[0].VMID); err != nil {
				t.Errorf("agent ping: %v", err)
			}
			grown := ss[0]
			grown.Cores, grown.MemoryMiB, grown.DiskGiB = 4, 4096, 30
			vms, err := c.ListVMs(ctx)
			if err != nil {
				t.Fatal(err)
			}
			plan, err := c.PlanVM(ctx, grown, vms)
			if err != nil {
				t.Fatal(err)
			}
			if plan.GrowDisk == 0 || len(plan.Update) == 0 {
				t.Fatalf("plan changes nothing: %v", plan.Changes())
			}
			if _, err := c.ApplyPlan(ctx, plan); err != nil {
				t.Errorf("resize and grow: %v", err)
			}
			if err := c.DestroyClusterVM(ctx, "lab", VMSummary{VMID: ss[1].VMID}); err != nil {
				t.Errorf("remove a node's VM: %v", err)
			}
			if n := len(e.sim.VMIDs()); n != 1 {
				t.Errorf("%d VMs left, want 1", n)
			}
		})
	}
}

// Nothing in the role is spare: without any one of its privileges the
// precheck's privileges row fails (or, for the guest agent's, warns) and
// names it.
func TestRunnerRoleIsMinimal(t *testing.T) {
	for _, version := range []string{"9.1.2", "8.1.4"} {
		role := RunnerPrivileges(testVersion(t, version))
		for _, p := range role {
			t.Run(version+"/"+p, func(t *testing.T) {
				_, c := roleEnv(t, version, slices.DeleteFunc(slices.Clone(role), func(q string) bool { return q == p }))
				r := runPrechecks(t, c, precheckInput(2))["proxmox: privileges"]
				if r.Status == check.Pass || !strings.Contains(r.Reason, p) {
					t.Errorf("without %s: %s %s", p, r.Status, r.Reason)
				}
			})
		}
	}
}

// README's setup commands are the ones RunnerSetup prints for PVE 9 and 8.
func TestReadmeHasTheRunnerSetup(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, version := range []string{"9.1.2", "8.4.1"} {
		want := RunnerSetup(testVersion(t, version), "bootstrap@pve", "homelab")
		if !strings.Contains(string(readme), want) {
			t.Errorf("README lacks the setup for PVE %s:\n%s", version, want)
		}
	}
}
