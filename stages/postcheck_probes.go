package stages

import (
	"context"
	"fmt"
	"os"
	"sort"

	"github.com/homelab/bootstrap/postcheck"
	"github.com/homelab/bootstrap/talos"
)

// postcheckTalosProbe returns what the Talos checks call, or nil when there
// is no talosconfig yet (the checks then warn "not checked").
func (e *Env) postcheckTalosProbe(ctx context.Context) postcheck.TalosProbe {
	tc, err := os.ReadFile(e.Paths.Talosconfig)
	if err != nil {
		return nil
	}
	ops, err := talosOps(e, tc, talos.OpsOptions{})
	if err != nil {
		return nil
	}
	return talosProbe{env: e, ops: ops}
}

type talosProbe struct {
	env *Env
	ops *talos.Ops
}

// EtcdMembers asks the control planes in turn; the first that answers
// tells the membership and its own etcd health.
func (p talosProbe) EtcdMembers(ctx context.Context) ([]string, bool, error) {
	var lastErr error
	for _, n := range p.env.Config.ControlPlanes() {
		members, err := p.ops.EtcdMembers(ctx, n.IP)
		if err != nil {
			lastErr = fmt.Errorf("%s: %w", n.Name, err)
			continue
		}
		names := make([]string, 0, len(members))
		for _, m := range members {
			names = append(names, m.Hostname)
		}
		svcs, err := p.ops.Services(ctx, n.IP)
		if err != nil {
			return names, false, fmt.Errorf("%s services: %w", n.Name, err)
		}
		healthy := false
		for _, s := range svcs {
			if s.ID == "etcd" {
				healthy = s.Healthy
			}
		}
		return names, healthy, nil
	}
	return nil, false, lastErr
}

// Ping calls the node's Talos API with the cluster's credentials.
func (p talosProbe) Ping(ctx context.Context, node string) error {
	for _, n := range p.env.Config.Nodes {
		if n.Name != node {
			continue
		}
		pr, err := p.ops.Probe(ctx, n.IP)
		if err != nil {
			return err
		}
		if pr.Mode != talos.ModeConfigured {
			return fmt.Errorf("not configured for this cluster (%s)", pr.Detail)
		}
		return nil
	}
	return fmt.Errorf("node %s is not in the config", node)
}

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
