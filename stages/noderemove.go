package stages

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/kube"
	"github.com/homelab/bootstrap/proxmox"
	"github.com/homelab/bootstrap/talos"
)

// drainRetry spaces out the drain's polls and its re-asked evictions (a
// PodDisruptionBudget said not now): Talos' own drain waits 5 s.
const drainRetry = 2 * time.Second

// NodeRemoval is what `bootstrap node remove` found about a node before
// changing anything: where it is, whether it still answers, its etcd
// membership, and what etcd's quorum allows. Every step it plans is
// skipped when already done, so a removal killed half way resumes.
type NodeRemoval struct {
	Name, Role, IP string
	// VM is the node's VM (nil: gone already).
	VM *proxmox.VMSummary
	// Answers: the node's Talos API answers from its installed system.
	Answers bool
	// Member is the node's etcd member (nil: none, or gone already), seen
	// through Via, a control plane that stays.
	Member *talos.EtcdMember
	Via    talos.Target
	Quorum talos.RemovalQuorum
	// KubeNode: the Kubernetes Node object exists; KubePods: pods are
	// bound to it.
	KubeNode, KubePods bool
	// replacing: the node stays in the config and is created again.
	replacing bool
	// VMGrants: the token holds privileges on the VM's own path (an ACL
	// entry on /vms/<vmid>, or its pool's), which Proxmox deletes with the
	// VM (see proxmox.Client.VMGrants).
	VMGrants bool
}

// RemovalRefusedError says why a node cannot be removed now; nothing was
// changed.
type RemovalRefusedError struct {
	Node, Reason string
}

func (e *RemovalRefusedError) Error() string {
	return fmt.Sprintf("not removing %s: %s; nothing was changed", e.Node, e.Reason)
}

// PlanNodeRemoval looks at the node called name, which must have left the
// config's nodes (a run would add it back otherwise), without changing
// anything. A control plane whose removal etcd would refuse (its last
// member, or too few members left running) is refused here, before any
// drain.
func PlanNodeRemoval(ctx context.Context, env *Env, name string) (*NodeRemoval, error) {
	for _, n := range env.Config.Nodes {
		if n.Name == name {
			return nil, config.Userf("%s is still in the config's nodes: delete its entry from %s first (a run would add it back), then run bootstrap node remove %s; to re-create it in place, run bootstrap node replace %s", name, env.Config.File(), name, name)
		}
	}
	return planRemoval(ctx, env, name, nil)
}

// PlanNodeReplacement is PlanNodeRemoval for a node that stays in the
// config: it is taken out the same way, then ReplaceStages create it again
// (same name, VMID, IP and MAC, a new disk, a new etcd member). A control
// plane that is the cluster endpoint's address without a VIP is refused:
// the API would be unreachable while it is gone.
func PlanNodeReplacement(ctx context.Context, env *Env, name string) (*NodeRemoval, error) {
	var node *config.Node
	for i, n := range env.Config.Nodes {
		if n.Name == name {
			node = &env.Config.Nodes[i]
		}
	}
	if node == nil {
		return nil, config.Userf("%s is not in the config's nodes: bootstrap node replace re-creates a configured node (add its entry first)", name)
	}
	if node.Role == config.RoleControlPlane && env.Config.Cluster.VIP == "" && strings.Contains(env.Config.Cluster.Endpoint, "//"+node.IP+":") {
		return nil, &RemovalRefusedError{name, "the cluster endpoint " + env.Config.Cluster.Endpoint + " is its address: the Kubernetes API would be gone while it is re-created (set cluster.vip first)"}
	}
	return planRemoval(ctx, env, name, node)
}

// ReplaceStages re-create a replaced node and prove the cluster: the VM,
// its Talos config and etcd join, then the postcheck.
var ReplaceStages = []string{Provision, Talos, Postcheck}

// planRemoval plans taking out the node called name; configured is its
// config entry when it is being replaced (nil when it left the config),
// which supplies its address and role when the state has none.
func planRemoval(ctx context.Context, env *Env, name string, configured *config.Node) (*NodeRemoval, error) {
	replacing := configured != nil
	r := &NodeRemoval{Name: name, replacing: replacing}
	recorded, inState := env.State.Outputs.Nodes[name]
	r.Role, r.IP = recorded.Role, recorded.IP
	if replacing && r.IP == "" {
		r.IP = configured.IP
	}
	if replacing && r.Role == "" {
		r.Role = configured.Role
	}
	pve, err := ProxmoxClient(ctx, env)
	if err != nil {
		return nil, err
	}
	vms, err := pve.FindClusterVMs(ctx, env.Config.Cluster.Name)
	if err != nil {
		return nil, err
	}
	for i, v := range vms {
		if inState && recorded.VMID != 0 && v.VMID == recorded.VMID || (!inState || recorded.VMID == 0) && v.Name == name {
			r.VM = &vms[i]
		}
	}
	if !inState && r.VM == nil && !replacing {
		return nil, config.Userf("no node %s: neither the state (%s) nor a VM tagged %s knows it", name, env.Paths.StateDir, proxmox.ClusterTag(env.Config.Cluster.Name))
	}
	if r.VM != nil {
		// The destroy deletes the VM's own ACL entries and pool
		// membership: a replacement would then create the VM with only
		// what /vms grants, so it is refused here, before the node leaves,
		// when that is not enough.
		perVM, lack, err := pve.VMGrants(ctx, r.VM.VMID)
		if err != nil {
			return nil, err
		}
		r.VMGrants = perVM
		if perVM && replacing && len(lack) > 0 {
			return nil, &RemovalRefusedError{name, fmt.Sprintf("Proxmox deletes the ACL entries on /vms/%d (and its pool membership) with the VM, and creating it again then needs %s on /vms/%d, which the token would not hold: grant them on /vms or / first",
				r.VM.VMID, strings.Join(lack, ", "), r.VM.VMID)}
		}
	}

	ops, err := savedTalosOps(env)
	if err != nil {
		return nil, err
	}
	if r.IP != "" {
		up, err := ops.InstalledSystemUp(ctx, r.IP)
		r.Answers = err == nil && up.Installed
	}
	if err := r.planEtcd(ctx, env, ops); err != nil {
		return nil, err
	}
	if cs, _, err := kubeClient(env); err == nil {
		if _, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err == nil {
			r.KubeNode = true
		}
		pods, err := kube.PodsOn(ctx, cs, name)
		r.KubePods = err == nil && len(pods) > 0
	}
	return r, nil
}

// planEtcd finds the node's etcd member through a control plane that
// stays and checks etcd's quorum rule for its removal, and, for a control
// plane that is replaced, etcd's rule for adding the re-created node once
// its member is gone. Each member's etcd is asked at its peer address.
func (r *NodeRemoval) planEtcd(ctx context.Context, env *Env, ops *talos.Ops) error {
	if r.Role != config.RoleControlPlane && r.Role != "" {
		return nil
	}
	var stays []talos.Target
	for _, cp := range env.Config.ControlPlanes() {
		if cp.Name != r.Name {
			stays = append(stays, talos.Target{Name: cp.Name, IP: cp.IP, Role: talos.RoleControlPlane})
		}
	}
	if len(stays) == 0 {
		return &RemovalRefusedError{r.Name, "no control plane would be left"}
	}
	members, via, err := ops.EtcdMembersVia(ctx, stays)
	if err != nil {
		return &RemovalRefusedError{r.Name, fmt.Sprintf("no control plane that stays lists the etcd members: %v", err)}
	}
	r.Via = via
	isTarget := func(name, ip string) bool { return name == r.Name || r.IP != "" && ip == r.IP }
	for i, m := range members {
		if isTarget(m.Hostname, "") || slices.ContainsFunc(m.IPs, func(ip string) bool { return isTarget("", ip) }) {
			r.Member = &members[i]
		}
	}
	voters := ops.Voters(ctx, members)
	for _, v := range voters {
		r.Quorum.Members++
		if v.Runs {
			r.Quorum.Running++
		}
		if isTarget(v.Name, v.IP) {
			r.Quorum.TargetRuns = v.Runs
		}
	}
	if r.Member != nil && !r.Member.Learner {
		if ok, why := r.Quorum.Allowed(); !ok {
			return &RemovalRefusedError{r.Name, "etcd would refuse to remove its member: " + why}
		}
	}
	if r.replacing {
		return joinAfterRemoval(r, voters)
	}
	return nil
}

// warnLeftNodes names the nodes that left the config's nodes but not the
// cluster (one of clusterVMs, the VMs with the cluster's tag, or a node in
// the state): a run leaves them alone, and says how to take them out.
func warnLeftNodes(env *Env, clusterVMs []proxmox.VMSummary) {
	inConfig := map[string]bool{}
	for _, n := range env.Config.Nodes {
		inConfig[n.Name] = true
	}
	left := map[string]bool{}
	for name := range env.State.Outputs.Nodes {
		if !inConfig[name] {
			left[name] = true
		}
	}
	for _, v := range clusterVMs {
		if !inConfig[v.Name] && !slices.ContainsFunc(env.Config.Nodes, func(n config.Node) bool { return n.VMID == v.VMID }) {
			left[v.Name] = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(left)) {
		env.UI.Warn("%s is in the cluster but not in the config's nodes: left alone; run `bootstrap node remove %s` to take it out", name, name)
	}
}

// Steps lists what RemoveNode does, in order, for the plan shown first.
func (r *NodeRemoval) Steps() []string {
	var s []string
	if r.KubeNode {
		s = append(s, fmt.Sprintf("cordon and drain Kubernetes node %s (its pods evicted, PodDisruptionBudgets respected)", r.Name))
	}
	switch {
	case r.Member != nil && r.Answers:
		s = append(s, fmt.Sprintf("remove %s from etcd: it leaves the cluster (%d members → %d)", r.Name, r.Quorum.Members, r.Quorum.Members-1))
	case r.Member != nil:
		s = append(s, fmt.Sprintf("remove etcd member %x (%s, not answering) through %s", r.Member.ID, r.Name, r.Via))
	}
	if r.Answers {
		s = append(s, fmt.Sprintf("reset %s (Talos wipes its disk and powers it off)", r.Name))
	}
	if r.KubeNode || r.KubePods {
		s = append(s, "delete Kubernetes node "+r.Name+" and the pods still bound to it")
	}
	if r.VM != nil {
		s = append(s, fmt.Sprintf("stop and delete VM %d (%s) with its disks", r.VM.VMID, r.VM.Name))
		if r.VMGrants {
			s = append(s, fmt.Sprintf("Proxmox also deletes the ACL entries on /vms/%d and the VM's pool membership with it (re-grant them if anything else needs them)", r.VM.VMID))
		}
	}
	s = append(s, "forget "+r.Name+" in the state")
	if r.replacing {
		s = append(s, "create "+r.Name+" again: the stages "+strings.Join(ReplaceStages, ", ")+" (same name, VMID, IP and MAC; a new disk and etcd member)")
	}
	return s
}

// RemoveNode takes the planned node out of the cluster: drain, etcd
// membership, Talos reset and power-off, the Kubernetes Node, the VM (only
// a VM with the cluster's tag), the state. Each step is bounded and says
// what it waits for.
func RemoveNode(ctx context.Context, env *Env, r *NodeRemoval) error {
	t := env.Config.Cluster.Timeouts
	var cs kubernetes.Interface
	if r.KubeNode || r.KubePods {
		c, _, err := kubeClient(env)
		if err != nil {
			return err
		}
		cs = c
	}
	if r.KubeNode {
		err := env.Wet("cordon and drain Kubernetes node "+r.Name, func() error {
			if _, err := kube.Cordon(ctx, cs, r.Name); err != nil {
				return fmt.Errorf("cordoning %s: %w", r.Name, err)
			}
			evicted, err := kube.Drain(ctx, cs, r.Name, t.Health.D(), drainRetry)
			if len(evicted) > 0 {
				env.UI.OK("evicted %d pod(s) from %s: %s", len(evicted), r.Name, strings.Join(evicted, ", "))
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	ops, err := savedTalosOps(env)
	if err != nil {
		return err
	}
	target := talos.Target{Name: r.Name, IP: r.IP, Role: talos.Role(r.Role)}
	if r.Member != nil {
		if r.Answers {
			err = env.Wet(fmt.Sprintf("remove %s from etcd (it leaves the cluster)", r.Name), func() error { return ops.EtcdLeave(ctx, target) })
		} else {
			err = env.Wet(fmt.Sprintf("remove etcd member %x (%s) through %s", r.Member.ID, r.Name, r.Via), func() error {
				_, err := ops.EtcdRemoveMember(ctx, r.Via, r.Member.ID)
				return err
			})
		}
		if err != nil {
			return err
		}
	}
	pve, err := ProxmoxClient(ctx, env)
	if err != nil {
		return err
	}
	if r.Answers {
		err = env.Wet(fmt.Sprintf("reset %s and wait for it to power off", r.Name), func() error {
			if _, err := ops.ResetAndShutdown(ctx, target); err != nil {
				return err
			}
			return waitPoweredOff(ctx, env, pve, ops, r)
		})
		if err != nil {
			return err
		}
	}
	if r.KubeNode || r.KubePods {
		// Its mirror and DaemonSet pods would wait 40 s for the pod
		// garbage collector (and fail the health checks meanwhile).
		if err := env.Wet("delete Kubernetes node "+r.Name+" and the pods still bound to it", func() error {
			if _, err := kube.DeleteNode(ctx, cs, r.Name); err != nil {
				return err
			}
			_, err := kube.DeleteNodePods(ctx, cs, r.Name)
			return err
		}); err != nil {
			return err
		}
	}
	if r.VM != nil {
		if err := env.Wet(fmt.Sprintf("stop and delete VM %d (%s)", r.VM.VMID, r.VM.Name), func() error {
			return pve.DestroyClusterVM(ctx, env.Config.Cluster.Name, *r.VM)
		}); err != nil {
			return err
		}
	}
	return env.Wet("forget "+r.Name+" in the state", func() error {
		env.forgetNode(r.Name)
		if r.replacing {
			env.State.Outputs.Replacing = r.Name
		}
		return env.SaveState()
	})
}

// ReplacementRemoved reports whether an earlier `bootstrap node replace`
// of name already took the node out: only the stages are left to run.
func ReplacementRemoved(env *Env, name string) bool {
	return env.State.Outputs.Replacing == name
}

// FinishReplacement forgets the replacement once the stages created the
// node again and the postcheck passed.
func FinishReplacement(env *Env) error {
	env.State.Outputs.Replacing = ""
	return env.SaveState()
}

// waitPoweredOff waits, bounded by the reboot timeout, until the reset
// node's VM stopped (Talos powers it off at the end of its reset), or,
// without a VM, until its Talos API stops answering.
func waitPoweredOff(ctx context.Context, env *Env, pve *proxmox.Client, ops *talos.Ops, r *NodeRemoval) error {
	spec := wait.Spec{What: r.Name + " to power off after its reset", Timeout: env.Config.Cluster.Timeouts.Reboot.D(), Log: env.Log}
	return wait.Until(ctx, spec, func(ctx context.Context) (bool, string, error) {
		if r.VM != nil {
			st, err := pve.On(r.VM.Node).Status(ctx, r.VM.VMID)
			if proxmox.IsNotFound(err) {
				return true, "", nil
			}
			if err != nil {
				return false, err.Error(), nil
			}
			return st.Status == "stopped", "VM " + st.Status, nil
		}
		up, err := ops.InstalledSystemUp(ctx, r.IP)
		if err != nil {
			return true, "", nil
		}
		return false, "Talos answers: " + up.Detail, nil
	})
}
