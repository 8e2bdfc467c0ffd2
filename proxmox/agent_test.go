package proxmox

import (
	"strings"
	"testing"

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
