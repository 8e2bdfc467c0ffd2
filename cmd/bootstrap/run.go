package main

import (
	"context"

	"github.com/homelab/bootstrap/internal/proc"
	"github.com/homelab/bootstrap/stages"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/ui"
)

// RunCmd is `bootstrap run`.
type RunCmd struct {
	Stage          string `default:"all" help:"Stage to run: all, ${stages} (aliases k3s, apps)." placeholder:"STAGE" predictor:"stage"`
	From           string `help:"Run STAGE and every stage after it." placeholder:"STAGE" predictor:"stage"`
	Resume         bool   `help:"Start at the stage that failed or was interrupted last time."`
	DryRun         bool   `help:"Show what each stage would change; change nothing, write nothing."`
	MergeConfigs   bool   `help:"Merge talosconfig into ~/.talos/config and kubeconfig into ~/.kube/config (backed up first)."`
	AllowDowngrade bool   `help:"Let the talos stage move nodes to an older Talos or Kubernetes than they run (refused otherwise)."`
	NewEtcd        bool   `help:"Let the talos stage bootstrap an empty etcd where the cluster's etcd was lost with its VMs (refused otherwise; see bootstrap restore)."`
}

// Run executes the selected stages.
func (r *RunCmd) Run(ctx context.Context, a *App) error {
	// Stage names are checked before the config is even read.
	for flag, name := range map[string]string{"--stage": r.Stage, "--from": r.From} {
		if name != "" && stages.Canonical(name) == "" {
			_, err := stages.Select(nil, stages.Selection{Stage: name}, nil)
			if flag == "--from" {
				_, err = stages.Select(nil, stages.Selection{From: name}, nil)
			}
			return err
		}
	}
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	paths := cfg.Paths()
	st, err := state.Load(paths.StateDir, cfg.Cluster.Name)
	if err != nil {
		return err
	}
	sel := stages.Selection{Stage: r.Stage, From: r.From, Resume: r.Resume}
	if r.From != "" || r.Resume {
		sel.Stage = ""
	}
	selected, err := stages.Select(a.Stages(), sel, st)
	if err != nil {
		return err
	}

	secrets := secretsOf(cfg)
	env := &stages.Env{Config: cfg, Paths: paths, State: st, Out: secrets.Writer(a.Stdout), DryRun: r.DryRun, Secrets: secrets,
		Options: stages.Options{MergeConfigs: r.MergeConfigs || cfg.Cluster.MergeConfigs, AllowDowngrade: r.AllowDowngrade, NewEtcd: r.NewEtcd}, Now: a.Now}

	if r.DryRun {
		// A dry run takes no lock and writes no log file: it changes nothing.
		env.Warnings = &ui.Warnings{}
		log, err := a.logger(nil, secrets, env.Warnings)
		if err != nil {
			return err
		}
		env.Log, env.UI = log, ui.NewReporter(log)
		return stages.Run(ctx, env, selected, stages.RunInfo{})
	}

	sess, err := a.lockAndLog(cfg, secrets)
	if err != nil {
		return err
	}
	defer sess.Close()
	// The state read under the lock wins: another run may have finished
	// between the first read and taking the lock.
	env.State, env.Log, env.UI, env.LogPath, env.Warnings = sess.State, sess.Log, ui.NewReporter(sess.Log), sess.LogPath, sess.Warnings
	log, logPath := sess.Log, sess.LogPath
	names := make([]string, len(selected))
	for i, s := range selected {
		names[i] = s.Name()
	}
	log.Info().Str("version", version).Str("config", cfg.File()).Strs("stages", names).Str("log", logPath).Msg("run started")
	for _, w := range cfg.Warnings() {
		log.Warn().Str("field", w.Path).Msg(w.Error())
	}

	err = stages.Run(ctx, env, selected, stages.RunInfo{ID: sess.RunID, Command: a.commandLine(), LogPath: logPath})
	if err != nil {
		log.Error().Err(err).Int("exit_code", stages.ExitCode(err)).Str("log", logPath).Int64("peak_rss_kib", proc.PeakRSSKiB()).Msg("run stopped; full log in " + logPath)
		return silentError{err}
	}
	log.Info().Str("log", logPath).Int64("peak_rss_kib", proc.PeakRSSKiB()).Msg("run finished")
	return nil
}
