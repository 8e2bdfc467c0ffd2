package main

import (
	"context"
	"fmt"
	"io"

	"github.com/homelab/bootstrap/stages"
)

// NodeCmd is `bootstrap node`: day-two changes to one node.
type NodeCmd struct {
	Remove NodeRemoveCmd `cmd:"" help:"Take a node that left the config's nodes out of the cluster: drain, etcd membership, Talos reset, Kubernetes Node, VM, state."`
}

// NodeRemoveCmd is `bootstrap node remove NAME`.
type NodeRemoveCmd struct {
	Name   string `arg:"" help:"The node to remove (its entry already deleted from the config's nodes)."`
	Yes    bool   `help:"Do not ask for confirmation."`
	DryRun bool   `help:"Show what the removal would do; change nothing."`
}

// Run plans the removal (refused when etcd would lose quorum), shows the
// plan, asks for the node's name unless --yes, then removes the node under
// the cluster lock with a run log. A removal killed half way resumes: every
// step done is skipped.
func (r *NodeRemoveCmd) Run(ctx context.Context, a *App) error {
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	env, sess, err := a.commandEnv(cfg, r.DryRun)
	if err != nil {
		return err
	}
	if sess != nil {
		defer sess.Close()
		sess.Log.Info().Str("version", version).Str("node", r.Name).Str("log", sess.LogPath).Msg("node remove started")
	}
	err = removeNode(ctx, env, r, a.Stdin)
	if sess != nil {
		if err != nil {
			sess.Log.Error().Err(err).Int("exit_code", stages.ExitCode(err)).Str("log", sess.LogPath).Msg("node remove stopped; full log in " + sess.LogPath)
			return silentError{err}
		}
		sess.Log.Info().Int("changes", len(env.Changes())).Msg("node remove finished")
	}
	return err
}

func removeNode(ctx context.Context, env *stages.Env, r *NodeRemoveCmd, in io.Reader) error {
	plan, err := stages.PlanNodeRemoval(ctx, env, r.Name)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Out, "Removing %s from cluster %s:\n", r.Name, env.Config.Cluster.Name)
	for i, s := range plan.Steps() {
		fmt.Fprintf(env.Out, "  %d. %s\n", i+1, s)
	}
	if !env.DryRun && !r.Yes {
		ok, err := confirm(env.Out, in, fmt.Sprintf("Type the node's name (%s) to confirm: ", r.Name), r.Name)
		if err != nil {
			return err
		}
		if !ok {
			return errAborted
		}
	}
	if err := stages.RemoveNode(ctx, env, plan); err != nil {
		return err
	}
	if !env.DryRun {
		fmt.Fprintf(env.Out, "%s is out of the cluster\n", r.Name)
	}
	return nil
}
