package main

import (
	"context"
	"fmt"
	"io"

	"github.com/homelab/bootstrap/stages"
)

// NodeCmd is `bootstrap node`: day-two changes to one node.
type NodeCmd struct {
	Remove  NodeRemoveCmd  `cmd:"" help:"Take a node that left the config's nodes out of the cluster: drain, etcd membership, Talos reset, Kubernetes Node, VM, state."`
	Replace NodeReplaceCmd `cmd:"" help:"Re-create a configured node: take it out as remove does, then provision it again (same name, IP and MAC), join it and run the postcheck."`
}

// NodeRemoveCmd is `bootstrap node remove NAME`.
type NodeRemoveCmd struct {
	Name   string `arg:"" help:"The node to remove (its entry already deleted from the config's nodes)."`
	Yes    bool   `help:"Do not ask for confirmation."`
	DryRun bool   `help:"Show what the removal would do; change nothing."`
}

// NodeReplaceCmd is `bootstrap node replace NAME`.
type NodeReplaceCmd struct {
	Name   string `arg:"" help:"The configured node to re-create."`
	Yes    bool   `help:"Do not ask for confirmation."`
	DryRun bool   `help:"Show what the replacement would do; change nothing."`
}

// Run plans the removal (refused when etcd would lose quorum), shows the
// plan, asks for the node's name unless --yes, then removes the node under
// the cluster lock with a run log. A removal killed half way resumes: every
// step done is skipped.
func (r *NodeRemoveCmd) Run(ctx context.Context, a *App) error {
	return a.nodeChange(ctx, nodeChange{verb: "remove", name: r.Name, yes: r.Yes, dryRun: r.DryRun, plan: stages.PlanNodeRemoval})
}

// Run takes the node out as remove does, then runs provision, talos and
// the postcheck, which create it again and prove the cluster. Killed half
// way, running it again resumes: the removal skips what is done, the
// stages converge.
func (r *NodeReplaceCmd) Run(ctx context.Context, a *App) error {
	return a.nodeChange(ctx, nodeChange{verb: "replace", name: r.Name, yes: r.Yes, dryRun: r.DryRun, plan: stages.PlanNodeReplacement, then: stages.ReplaceStages})
}

// nodeChange is one `bootstrap node` command.
type nodeChange struct {
	verb, name  string
	yes, dryRun bool
	plan        func(context.Context, *stages.Env, string) (*stages.NodeRemoval, error)
	// then are the stages run after the removal.
	then []string
}

func (a *App) nodeChange(ctx context.Context, c nodeChange) error {
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	env, sess, err := a.commandEnv(cfg, c.dryRun)
	if err != nil {
		return err
	}
	info := stages.RunInfo{}
	if sess != nil {
		defer sess.Close()
		info = stages.RunInfo{ID: sess.RunID, Command: a.commandLine(), LogPath: sess.LogPath}
		sess.Log.Info().Str("version", version).Str("node", c.name).Str("log", sess.LogPath).Msg("node " + c.verb + " started")
	}
	err = a.changeNode(ctx, env, c, info)
	if sess != nil {
		if err != nil {
			sess.Log.Error().Err(err).Int("exit_code", stages.ExitCode(err)).Str("log", sess.LogPath).Msg("node " + c.verb + " stopped; full log in " + sess.LogPath)
			return silentError{err}
		}
		sess.Log.Info().Int("changes", len(env.Changes())).Msg("node " + c.verb + " finished")
	}
	return err
}

func (a *App) changeNode(ctx context.Context, env *stages.Env, c nodeChange, info stages.RunInfo) error {
	if len(c.then) > 0 && stages.ReplacementRemoved(env, c.name) {
		fmt.Fprintf(env.Out, "%s was taken out by an earlier %s; creating it again\n", c.name, c.verb)
		return a.thenStages(ctx, env, c, info)
	}
	plan, err := c.plan(ctx, env, c.name)
	if err != nil {
		return err
	}
	verb := map[string]string{"remove": "Removing", "replace": "Replacing"}[c.verb]
	fmt.Fprintf(env.Out, "%s %s in cluster %s:\n", verb, c.name, env.Config.Cluster.Name)
	for i, s := range plan.Steps() {
		fmt.Fprintf(env.Out, "  %d. %s\n", i+1, s)
	}
	if !env.DryRun && !c.yes {
		if err := confirmNode(env.Out, a.Stdin, c.name); err != nil {
			return err
		}
	}
	if err := stages.RemoveNode(ctx, env, plan); err != nil {
		return err
	}
	return a.thenStages(ctx, env, c, info)
}

// thenStages runs the stages after the removal (none for remove).
func (a *App) thenStages(ctx context.Context, env *stages.Env, c nodeChange, info stages.RunInfo) error {
	if env.DryRun {
		return nil // the stages' plans need the node gone first
	}
	if len(c.then) > 0 {
		if err := stages.Run(ctx, env, stages.SelectStages(a.Stages(), c.then), info); err != nil {
			return err
		}
		if err := stages.FinishReplacement(env); err != nil {
			return err
		}
	}
	fmt.Fprintf(env.Out, "%s: %s done\n", c.name, c.verb)
	return nil
}

// confirmNode asks for the node's name.
func confirmNode(out io.Writer, in io.Reader, name string) error {
	ok, err := confirm(out, in, fmt.Sprintf("Type the node's name (%s) to confirm: ", name), name)
	if err != nil {
		return err
	}
	if !ok {
		return errAborted
	}
	return nil
}
