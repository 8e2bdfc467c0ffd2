package postcheck

import (
	"context"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/check"
)

type vmState VMState

func (p vmState) VMs(context.Context) (VMState, error)                  { return VMState(p), nil }
func (p vmState) GuestAgents(context.Context) (map[string]error, error) { return nil, nil }

// With several Proxmox members the VM row says where each VM runs and
// warns when control planes share a member.
func TestVMRowReportsPlacement(t *testing.T) {
	nodes := []Node{{Name: "cp-1", Role: "controlplane"}, {Name: "cp-2", Role: "controlplane"}, {Name: "cp-3", Role: "controlplane"}, {Name: "wk-1", Role: "worker"}}
	spread := vmState{Hosts: map[string]string{"cp-1": "pve1", "cp-2": "pve2", "cp-3": "pve3", "wk-1": "pve1"}}
	c := &checker{o: Options{Nodes: nodes, Hosts: []string{"pve1", "pve2", "pve3"}, Proxmox: spread}}
	if st, why := c.vms(context.Background()); st != check.Pass || !strings.Contains(why, "cp-1 on pve1, cp-2 on pve2, cp-3 on pve3, wk-1 on pve1") {
		t.Errorf("spread: %s %s", st, why)
	}
	// A checker reads the VMs once a run: each case is a run of its own.
	c = &checker{o: c.o}
	c.o.Proxmox = vmState{Hosts: map[string]string{"cp-1": "pve1", "cp-2": "pve1", "cp-3": "pve3", "wk-1": "pve1"}}
	if st, why := c.vms(context.Background()); st != check.Warn || !strings.Contains(why, "cp-1 and cp-2 share pve1") || !strings.Contains(why, "2 etcd members") {
		t.Errorf("two control planes on pve1: %s %s", st, why)
	}
	// One host: nothing to spread over.
	c.o.Hosts = nil
	if st, why := c.vms(context.Background()); st != check.Pass || strings.Contains(why, "pve1") {
		t.Errorf("one host: %s %s", st, why)
	}
	c = &checker{o: c.o}
	c.o.Proxmox = vmState{NotRunning: []string{"cp-2 (vmid 702, stopped)"}}
	if st, why := c.vms(context.Background()); st != check.Fail || !strings.Contains(why, "cp-2 (vmid 702, stopped)") {
		t.Errorf("a stopped VM: %s %s", st, why)
	}
}
