package postcheck

import (
	"context"
	"fmt"
	"strings"

	"github.com/homelab/bootstrap/check"
)

func (c *checker) vms(ctx context.Context) (check.Status, string) {
	if c.o.Proxmox == nil {
		return check.Warnf("Proxmox not checked (no API token available to this run)")
	}
	st, err := c.vmState(ctx)
	if err != nil {
		return check.Warnf("could not list the cluster's VMs: %v", err)
	}
	if len(st.NotRunning) > 0 {
		// A node's VM that does not run is a node down, whatever else
		// still answers: never healthy for the cluster.
		return check.Failf("VMs not running: %s", strings.Join(st.NotRunning, ", "))
	}
	if len(c.o.Hosts) <= 1 {
		return check.Passf("all of the cluster's VMs are running")
	}
	// Several members: where each VM runs, and control planes that would
	// go down together with one host.
	var where []string
	cps := map[string][]string{}
	for _, n := range c.o.Nodes {
		h := st.Hosts[n.Name]
		where = append(where, n.Name+" on "+h)
		if n.Role == "controlplane" && h != "" {
			cps[h] = append(cps[h], n.Name)
		}
	}
	var shared []string
	together := 0 // the control planes on the first host that has several
	for _, h := range c.o.Hosts {
		if len(cps[h]) > 1 {
			shared = append(shared, fmt.Sprintf("%s share %s", strings.Join(cps[h], " and "), h))
			if together == 0 {
				together = len(cps[h])
			}
		}
	}
	if len(shared) > 0 {
		return check.Warnf("all running (%s), but control planes %s: that host going down takes %d etcd members with it (migrate one to another member)", strings.Join(where, ", "), strings.Join(shared, "; "), together)
	}
	return check.Passf("all of the cluster's VMs are running: %s", strings.Join(where, ", "))
}

// guestAgents warns when a VM's QEMU guest agent does not answer though
// the VM has agent: 1 and its image runs the agent: Proxmox then shows no
// addresses and a shutdown waits for a timeout before it falls back to ACPI.
func (c *checker) guestAgents(ctx context.Context) (check.Status, string) {
	if !c.o.GuestAgent {
		return check.Passf("not expected: the installed image has no siderolabs/qemu-guest-agent (VMs run with agent: 0)")
	}
	if c.o.Proxmox == nil {
		return check.Warnf("Proxmox not checked (no API token available to this run)")
	}
	res, err := c.o.Proxmox.GuestAgents(ctx)
	if err != nil {
		return check.Warnf("could not ask Proxmox: %v", err)
	}
	var silent []string
	for _, n := range c.o.Nodes {
		if err, ok := res[n.Name]; ok && err != nil {
			silent = append(silent, fmt.Sprintf("%s (%v)", n.Name, err))
		}
	}
	if len(silent) > 0 {
		return check.Warnf("guest agent not answering: %s", strings.Join(silent, ", "))
	}
	return check.Passf("the guest agent answers in all %d VMs", len(c.o.Nodes))
}
