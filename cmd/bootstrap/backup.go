package main

import (
	"context"
	"fmt"

	"github.com/homelab/bootstrap/stages"
	"github.com/homelab/bootstrap/ui"
)

// BackupCmd is `bootstrap backup`: take, verify and keep one etcd snapshot
// now (the nightly postcheck takes one too).
type BackupCmd struct{}

// Run takes the snapshot under the cluster lock.
func (b *BackupCmd) Run(ctx context.Context, a *App) error {
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	secrets := secretsOf(cfg)
	sess, err := a.lockAndLog(cfg, secrets)
	if err != nil {
		return err
	}
	defer sess.Close()
	env := &stages.Env{Config: cfg, Paths: cfg.Paths(), Out: secrets.Writer(a.Stdout), Secrets: secrets, Now: a.Now,
		State: sess.State, Log: sess.Log, UI: ui.NewReporter(sess.Log), LogPath: sess.LogPath}
	info, err := stages.Backup(ctx, env)
	if err != nil {
		sess.Log.Error().Err(err).Str("log", sess.LogPath).Msg("backup failed; full log in " + sess.LogPath)
		return err
	}
	fmt.Fprintf(a.Stdout, "etcd snapshot %s\n  %s\n", info, info.Path)
	return nil
}
