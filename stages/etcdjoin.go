package stages

import (
	"context"
	"slices"
	"strings"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/talos"
)

// refuseEtcdJoin refuses, before a stage changes anything, a run that
// would add a control plane to a running etcd that cannot take it now:
// etcd refuses to add a member while it could lose quorum (talos
// JoinAllowed: with three voting members and one down, none is added), so
// the new control plane's etcd would ask for 30 minutes and then fail. A
// control plane joins when it is in the config but no etcd member has its
// address: one added to the config, or one re-created (`bootstrap node
// replace`, after its old member was removed). A voting member whose etcd
// does not run counts as down unless it is a configured control plane
// that this run brings up (comingUp: the provision stage starts a stopped
// VM, the talos stage waits for a node still booting or rebooting, which
// includes the reboot Talos does by itself after a failed upgrade or reset
// sequence: talos.SequenceFailure); one outside the config, or one that
// answers settled with its etcd stopped, nothing here brings back. The
// refusal names the members
// that do not run and is a user error (exit 2). Nothing is checked for a
// cluster this state never bootstrapped, a restore or a new etcd, or when
// no control plane lists the members (the talos stage judges those).
func refuseEtcdJoin(ctx context.Context, env *Env, comingUp func(talos.Voter) bool) error {
	if env.State.Outputs.Talos.BootstrapNode == "" || env.Options.Recover != nil || env.Options.NewEtcd {
		return nil
	}
	var cps []talos.Target
	for _, n := range env.Config.ControlPlanes() {
		cps = append(cps, talos.Target{Name: n.Name, IP: n.IP, Role: talos.RoleControlPlane})
	}
	ops, err := savedTalosOps(env)
	if err != nil {
		return nil // no talosconfig yet: nothing was bootstrapped from here
	}
	members, _, err := ops.EtcdMembersVia(ctx, cps)
	if err != nil {
		env.Log.Debug().Err(err).Msg("no control plane lists the etcd members: the check for joining control planes is left to the talos stage")
		return nil
	}
	isMember := map[string]bool{}
	for _, m := range members {
		for _, ip := range m.IPs {
			isMember[ip] = true
		}
	}
	var joining []string
	for _, cp := range cps {
		if !isMember[cp.IP] {
			joining = append(joining, cp.Name)
		}
	}
	if len(joining) == 0 {
		return nil
	}
	voters := ops.Voters(ctx, members)
	for i, v := range voters {
		if !v.Runs && slices.ContainsFunc(cps, func(t talos.Target) bool { return t.IP == v.IP }) && comingUp(v) {
			env.Log.Info().Str("member", v.String()).Msg("an etcd member that does not run yet is a control plane this run brings up: counted as running for the joining control planes")
			voters[i].Runs = true
		}
	}
	if ok, why := talos.JoinAllowed(voters); !ok {
		return config.Userf("not adding control plane %s to etcd: %s; nothing was changed", strings.Join(joining, ", "), why)
	}
	env.Log.Debug().Strs("joining", joining).Msg("etcd can add the joining control planes")
	return nil
}

// booting is the talos stage's comingUp: a configured control plane that
// does not answer yet, still boots (its VM just started) or reboots (also
// machined's own reboot after a failed sequence, whose stage reads
// rebooting until then: talos.SequenceFailure) is waited for by the
// converge, and its etcd starts with it.
func booting(v talos.Voter) bool {
	return !v.Answers || v.Stage == talos.StageBooting || v.Stage == talos.StageRebooting
}

// joinAfterRemoval is JoinAllowed for a control plane about to be
// replaced: its own member (removed first) does not vote any more when
// the re-created node asks to be added.
func joinAfterRemoval(r *NodeRemoval, voters []talos.Voter) error {
	var left []talos.Voter
	for _, v := range voters {
		if v.Name != r.Name && (r.IP == "" || v.IP != r.IP) {
			left = append(left, v)
		}
	}
	if ok, why := talos.JoinAllowed(left); !ok {
		return config.Userf("not replacing %s: once its member is removed, etcd would refuse to add the re-created node: %s; nothing was changed", r.Name, why)
	}
	return nil
}
