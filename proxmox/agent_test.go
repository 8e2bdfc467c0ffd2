package proxmox

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/lab/pvesim"
)

// The guest agent row of the postcheck rests on Proxmox's three refusals
// (assert_agent_available, qemu-server src/PVE/QemuServer/Agent.pm at
// 9.2.6), in its order, and on agent: 0 for an image without the agent.
func TestAgentPingAndTheAgentOption(t *testing.T) {
	answering := map[int]bool{}
	e := newEnv(t, pvesim.Options{GuestAgent: func(vmid int) bool { return answering[vmid] }})
	ctx := ctxT(t)
	with, without := spec(1), spec(2)
	without.GuestAgent = false
	e.provision(ctx, e.c, []VMSpec{with, without})

	for _, s := range []VMSpec{with, without} {
		cfg, err := e.c.VMConfig(ctx, s.VMID)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]string{true: "1", false: "0"}[s.GuestAgent]; cfg.Agent != want {
			t.Errorf("VM %d: agent %q, want %q", s.VMID, cfg.Agent, want)
		}
	}
	if err := e.c.AgentPing(ctx, with.VMID); err == nil || !strings.Contains(err.Error(), "QEMU guest agent is not running") {
		t.Errorf("agent: 1 with no agent in the guest: %v", err)
	}
	answering[with.VMID], answering[without.VMID] = true, true
	if err := e.c.AgentPing(ctx, with.VMID); err != nil {
		t.Errorf("agent: 1 with the agent in the guest: %v", err)
	}
	// pveproxy's 503 is asked again, not taken for a silent agent (it once
	// made the nightly's guest-agent row warn).
	e.sim.InjectFault(pvesim.Fault{Kind: pvesim.FaultStatus, Status: 503, Message: "proxy: backend unavailable", Method: "POST", Path: "/nodes/*/qemu/*/agent/ping", Times: 1})
	if err := e.c.AgentPing(ctx, with.VMID); err != nil {
		t.Errorf("a ping answered 503 once: %v", err)
	}
	// agent: 0 gives QEMU no agent channel: nothing can answer.
	if err := e.c.AgentPing(ctx, without.VMID); err == nil || !strings.Contains(err.Error(), "QEMU guest agent is not running") {
		t.Errorf("agent: 0: %v", err)
	}

	// An adopted VM whose image lost the agent is set to agent: 0.
	plan, err := e.c.PlanVM(ctx, func() VMSpec { s := with; s.GuestAgent = false; return s }(), mustList(t, e))
	if err != nil {
		t.Fatal(err)
	}
	if plan.Update["agent"] != "0" || !strings.Contains(strings.Join(plan.Changes(), "\n"), "qemu agent 1 → 0") {
		t.Errorf("plan lacks the agent change: %v %v", plan.Update, plan.Changes())
	}
}

func mustList(t *testing.T, e *env) []VMSummary {
	t.Helper()
	vms, err := e.c.ListVMs(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return vms
}

// A token that may do everything the run does but not ping the agents gets
// a warning, not a failure, from the privileges row; what the warning names
// is what Proxmox then refuses (PVE 9: VM.GuestAgent.Audit or
// .Unrestricted; PVE 8: VM.Monitor).
func TestPrecheckWarnsWithoutTheAgentPrivilege(t *testing.T) {
	for _, tc := range []struct {
		version string
		lack    []string
		want    string
		refusal string
	}{
		{"9.1.2", []string{"VM.GuestAgent.Audit", "VM.GuestAgent.Unrestricted"}, "VM.GuestAgent.Audit or VM.GuestAgent.Unrestricted on /vms/701, /vms/702",
			"Permission check failed (/vms/701, VM.GuestAgent.Audit|VM.GuestAgent.Unrestricted)"},
		{"8.4.1", []string{"VM.Monitor"}, "VM.Monitor on /vms/701, /vms/702", "Permission check failed (/vms/701, VM.Monitor)"},
	} {
		t.Run(tc.version, func(t *testing.T) {
			var acl []string
			for _, p := range pvesim.AllPrivileges(tc.version) {
				if !slices.Contains(tc.lack, p) {
					acl = append(acl, p)
				}
			}
			e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Version: tc.version,
				GuestAgent: func(int) bool { return true },
				Tokens: []pvesim.Token{
					{ID: "bootstrap@pve!run", Secret: "s", ACL: []pvesim.ACE{{Path: "/", Privileges: acl}}},
					{ID: "bootstrap@pve!full", Secret: "s", ACL: pvesim.Admin(tc.version)},
				}})
			c := e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!run", "s" })
			rs := runPrechecks(t, c, precheckInput(2))
			expect(t, rs, "proxmox: privileges", check.Warn, tc.want, "guest-agent")

			// Without the agent in the image nothing pings it: no warning.
			in := precheckInput(2)
			for i := range in.VMs {
				in.VMs[i].GuestAgent = false
			}
			expect(t, runPrechecks(t, c, in), "proxmox: privileges", check.Pass)

			// The prediction holds: the run works, the ping is refused.
			ctx := ctxT(t)
			e.provision(ctx, c, specs(1))
			err := c.AgentPing(ctx, 701)
			var ae *APIError
			if !errors.As(err, &ae) || ae.Status != 403 || !strings.Contains(err.Error(), tc.refusal) {
				t.Errorf("ping without %s: %v, want %q", tc.lack[0], err, tc.refusal)
			}
			full := e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!full", "s" })
			if err := full.AgentPing(ctx, 701); err != nil {
				t.Errorf("ping with every privilege: %v", err)
			}
		})
	}
}
