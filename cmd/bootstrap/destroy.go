package main

import (
	"context"

	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/stages"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/ui"
)

// DestroyCmd is `bootstrap destroy`.
type DestroyCmd struct {
	Yes          bool `help:"Do not ask for confirmation."`
	PurgeSecrets bool `help:"Also delete the cluster's Talos directory (secrets bundle, talosconfig)."`
	DryRun       bool `help:"List what would be deleted; change nothing."`
}

// Run deletes the cluster's VMs under the cluster lock, logging to a run log.
func (d *DestroyCmd) Run(ctx context.Context, a *App) error {
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	paths := cfg.Paths()
	secrets := &redact.Set{}
	env := &stages.Env{Config: cfg, Paths: paths, Out: a.Stdout, DryRun: d.DryRun, Secrets: secrets, Now: a.Now}
	opts := stages.DestroyOptions{Yes: d.Yes, PurgeSecrets: d.PurgeSecrets, In: a.Stdin}
	if d.DryRun {
		if env.State, err = state.Load(paths.StateDir, cfg.Cluster.Name); err != nil {
			return err
		}
		log, err := a.logger(nil, secrets)
		if err != nil {
			return err
		}
		env.Log, env.UI = log, ui.NewReporter(log)
		return stages.Destroy(ctx, env, opts)
	}
	sess, err := a.lockAndLog(cfg, secrets)
	if err != nil {
		return err
	}
	defer sess.Close()
	env.State, env.Log, env.UI, env.LogPath = sess.State, sess.Log, ui.NewReporter(sess.Log), sess.LogPath
	log, logPath := sess.Log, sess.LogPath
	log.Info().Str("version", version).Str("config", cfg.File()).Str("log", logPath).Msg("destroy started")
	if err := stages.Destroy(ctx, env, opts); err != nil {
		log.Error().Err(err).Str("log", logPath).Msg("destroy stopped; full log in " + logPath)
		return err
	}
	log.Info().Int("changes", len(env.Changes())).Msg("destroy finished")
	return nil
}
