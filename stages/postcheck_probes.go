package stages

import (
	"context"
	"fmt"
	"sort"

	"github.com/homelab/bootstrap/postcheck"
)

// postcheckTalosProbe returns what the Talos checks call, or nil when this
// build has no Talos client wired (the checks then warn "not checked").
func (e *Env) postcheckTalosProbe(ctx context.Context) postcheck.TalosProbe { return nil }

// postcheckVMProbe lists the cluster's VMs that are not running. Without a
// Proxmox token (a cron job may not have one) it returns nil and the check
// warns instead of failing.
func (e *Env) postcheckVMProbe(ctx context.Context) postcheck.VMProbe {
	if _, err := e.Config.ProxmoxTokenSecret(); err != nil {
		return nil
	}
	return vmProbe{env: e}
}

type vmProbe struct{ env *Env }

func (p vmProbe) NotRunning(ctx context.Context) ([]string, error) {
	c, err := proxmoxClient(ctx, p.env)
	if err != nil {
		return nil, err
	}
	vms, err := c.FindClusterVMs(ctx, p.env.Config.Cluster.Name)
	if err != nil {
		return nil, err
	}
	want := map[int]string{}
	for _, n := range p.env.Config.Nodes {
		want[n.VMID] = n.Name
	}
	var down []string
	seen := map[int]bool{}
	for _, v := range vms {
		seen[v.VMID] = true
		if v.Status != "running" {
			down = append(down, fmt.Sprintf("%s (vmid %d, %s)", v.Name, v.VMID, v.Status))
		}
	}
	for id, name := range want {
		if !seen[id] {
			down = append(down, fmt.Sprintf("%s (vmid %d, missing)", name, id))
		}
	}
	sort.Strings(down)
	return down, nil
}
