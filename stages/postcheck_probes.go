package stages

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/homelab/bootstrap/backup"
	"github.com/homelab/bootstrap/postcheck"
	"github.com/homelab/bootstrap/proxmox"
	"github.com/homelab/bootstrap/talos"
)

// postcheckTalosProbe returns what the Talos checks call, or nil when there
// is no talosconfig yet (the checks then warn "not checked").
func (e *Env) postcheckTalosProbe(ctx context.Context) postcheck.TalosProbe {
	ops, err := savedTalosOps(e)
	if err != nil {
		return nil
	}
	return talosProbe{env: e, ops: ops}
}

type talosProbe struct {
	env *Env
	ops *talos.Ops
}

// Health runs the cluster health the talos stage waits on, with the
// Kubernetes assertions when the kubeconfig works. By now a CNI must run,
// so node readiness is never skipped.
func (p talosProbe) Health(ctx context.Context) talos.HealthReport {
	in := talos.HealthInput{}
	for _, n := range p.env.Config.Nodes {
		in.Nodes = append(in.Nodes, talos.HealthTarget{Name: n.Name, IP: n.IP, Role: talos.Role(n.Role)})
	}
	if cs, _, err := kubeClient(p.env); err == nil {
		in.Kube = cs
	}
	return p.ops.Health(ctx, in)
}

// Versions asks every node for the Talos version it runs.
func (p talosProbe) Versions(ctx context.Context) (map[string]string, error) {
	return eachNode(p.env, func(ip string) (string, error) {
		pr, err := p.ops.Probe(ctx, ip)
		return pr.Version, err
	})
}

// Extensions asks every node for the system extensions it runs.
func (p talosProbe) Extensions(ctx context.Context) (map[string][]talos.Extension, error) {
	return eachNode(p.env, func(ip string) ([]talos.Extension, error) { return p.ops.Extensions(ctx, ip) })
}

// UserVolumes reads each node's user volumes (postcheck.UserVolumeProbe).
func (p talosProbe) UserVolumes(ctx context.Context, want map[string][]talos.UserVolume) (map[string]map[string]talos.VolumeState, error) {
	out := map[string]map[string]talos.VolumeState{}
	var errs []error
	for _, n := range p.env.Config.Nodes {
		vols := want[n.Name]
		if len(vols) == 0 {
			continue
		}
		st, err := p.ops.UserVolumeStates(ctx, n.IP, vols)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
			continue
		}
		out[n.Name] = st
	}
	return out, errors.Join(errs...)
}

// eachNode asks every configured node, by its address, and keeps the
// answers by node name; the nodes that failed are named in the error.
func eachNode[T any](env *Env, ask func(ip string) (T, error)) (map[string]T, error) {
	out := map[string]T{}
	var errs []error
	for _, n := range env.Config.Nodes {
		v, err := ask(n.IP)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
			continue
		}
		out[n.Name] = v
	}
	return out, errors.Join(errs...)
}

// postcheckBackup returns the postcheck's way to take a backup, nil
// without a talosconfig (the check then says so).
func (e *Env) postcheckBackup(ctx context.Context) func(context.Context) (string, error) {
	ops, err := savedTalosOps(e)
	if err != nil {
		return nil
	}
	return func(ctx context.Context) (string, error) {
		// What the backup warns about is the etcd-backup row's.
		info, err := TakeBackup(ctx, e.inCheck(ctx), ops)
		var copyErr *CopyError
		if errors.As(err, &copyErr) {
			// Kept here: the check warns (a recent snapshot exists).
			return info.String(), err
		}
		if err != nil {
			return "", err
		}
		return info.String(), nil
	}
}

// postcheckRemote reads the newest verified copy in backup.s3's bucket
// (nil without one): a copy counts when its upload recorded the sha256 it
// was read back with.
func (e *Env) postcheckRemote() func(context.Context) (postcheck.RemoteCopies, error) {
	if !e.Config.Backup.S3.Enabled() {
		return nil
	}
	return func(ctx context.Context) (postcheck.RemoteCopies, error) {
		var rc postcheck.RemoteCopies
		s3, err := backupS3(e)
		if err != nil {
			return rc, err
		}
		r, ok, future, err := s3.Newest(ctx, backup.SnapshotSuffixes...)
		// Logged for the etcd-backup row: the warning is the row's too.
		WarnFutureCopies(e.inCheck(ctx), s3, future)
		if err != nil || !ok || r.SHA256 == "" {
			return rc, err
		}
		rc.URL, rc.Taken = s3.URL(r.Key), r.Taken
		return rc, nil
	}
}

// postcheckVMProbe lists the cluster's VMs that are not running. Without a
// Proxmox token (a cron job may not have one) it returns nil and the check
// warns instead of failing.
func (e *Env) postcheckVMProbe(ctx context.Context) postcheck.VMProbe {
	if _, err := e.Config.ProxmoxTokenSecret(); err != nil {
		return nil
	}
	return &vmProbe{env: e}
}

// vmProbe answers both Proxmox rows from one listing of the cluster's VMs
// (the rows run side by side).
type vmProbe struct {
	env     *Env
	once    sync.Once
	client  *proxmox.Client
	listing []proxmox.VMSummary
	err     error
}

func (p *vmProbe) VMs(ctx context.Context) (postcheck.VMState, error) {
	c, vms, err := p.list(ctx)
	if err != nil {
		return postcheck.VMState{}, err
	}
	want := map[int]string{}
	for _, n := range p.env.Config.Nodes {
		want[n.VMID] = n.Name
	}
	out := postcheck.VMState{Hosts: map[string]string{}, Down: map[string]string{}}
	seen := map[int]bool{}
	for _, v := range vms {
		seen[v.VMID] = true
		if name, ok := want[v.VMID]; ok {
			out.Hosts[name] = v.Node
		}
		// The listed status lags by up to one pvestatd broadcast (10 s):
		// just after the pipeline started a VM it may still say stopped.
		st, err := c.On(v.Node).Status(ctx, v.VMID)
		if err != nil {
			return postcheck.VMState{}, err
		}
		if !st.Running() {
			out.NotRunning = append(out.NotRunning, fmt.Sprintf("%s (vmid %d, %s)", v.Name, v.VMID, st.Status))
			if name, ok := want[v.VMID]; ok {
				out.Down[name] = st.Status
			}
		}
	}
	for id, name := range want {
		if !seen[id] {
			out.NotRunning = append(out.NotRunning, fmt.Sprintf("%s (vmid %d, missing)", name, id))
			out.Down[name] = "missing"
		}
	}
	sort.Strings(out.NotRunning)
	return out, nil
}

// list is the cluster's VMs, each with the member that runs it, read once.
func (p *vmProbe) list(ctx context.Context) (*proxmox.Client, []proxmox.VMSummary, error) {
	p.once.Do(func() {
		if p.client, p.err = ProxmoxClient(ctx, p.env); p.err == nil {
			p.listing, p.err = p.client.FindClusterVMs(ctx, p.env.Config.Cluster.Name)
		}
	})
	return p.client, p.listing, p.err
}

// GuestAgents pings the guest agent of every node's VM, on the member
// that runs it.
func (p *vmProbe) GuestAgents(ctx context.Context) (map[string]error, error) {
	c, vms, err := p.list(ctx)
	if err != nil {
		return nil, err
	}
	member := map[int]string{}
	for _, v := range vms {
		member[v.VMID] = v.Node
	}
	out := map[string]error{}
	for _, n := range p.env.Config.Nodes {
		out[n.Name] = c.On(member[n.VMID]).AgentPing(ctx, n.VMID)
	}
	return out, nil
}
