package stages

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/homelab/bootstrap/backup"
	"github.com/homelab/bootstrap/talos"
)

// BackupDir is where the cluster's etcd snapshots are kept:
// ai/state/<cluster>/etcd.
func BackupDir(env *Env) string { return filepath.Join(env.Paths.StateDir, "etcd") }

// TakeBackup takes, verifies and keeps one etcd snapshot, then prunes to
// backup.keep. It is what `bootstrap backup` runs and what the talos stage
// runs before upgrading.
func TakeBackup(ctx context.Context, env *Env, ops *talos.Ops) (backup.Info, error) {
	if err := os.MkdirAll(BackupDir(env), 0o700); err != nil {
		return backup.Info{}, err
	}
	// One source per control plane, in config order: the first that gives
	// a complete snapshot wins.
	var srcs []backup.Source
	for _, n := range env.Config.ControlPlanes() {
		t := talos.Target{Name: n.Name, IP: n.IP, Role: talos.RoleControlPlane}
		srcs = append(srcs, func(ctx context.Context, w io.Writer) (int64, error) { return ops.EtcdSnapshot(ctx, t, w) })
	}
	info, err := backup.Take(ctx, srcs, BackupDir(env), env.now())
	if err != nil {
		return info, err
	}
	keep := max(1, env.Config.Backup.Keep)
	if _, err := backup.Prune(BackupDir(env), keep); err != nil {
		env.Log.Warn().Err(err).Msg("pruning old etcd snapshots")
	}
	b := env.Config.Backup
	if b.CopyDir == "" {
		return info, nil
	}
	recipients, err := backup.ParseRecipients(b.AgeRecipients)
	if err == nil {
		var dst string
		if dst, err = backup.Copy(info.Path, env.Config.Resolve(b.CopyDir), recipients); err == nil {
			env.Log.Info().Str("copy", dst).Msg("etcd snapshot copied")
			_, err = backup.Prune(env.Config.Resolve(b.CopyDir), keep)
		}
	}
	if err != nil {
		return info, &CopyError{Kept: info.Path, Dir: b.CopyDir, Err: err}
	}
	return info, nil
}

// CopyError says the snapshot was taken and kept on this host but its
// copy failed: a warning for the postcheck, not a reason to stop.
type CopyError struct {
	Kept, Dir string
	Err       error
}

func (e *CopyError) Error() string {
	return fmt.Sprintf("kept %s, but copying it to %s failed: %v", filepath.Base(e.Kept), e.Dir, e.Err)
}

func (e *CopyError) Unwrap() error { return e.Err }

// Backup is `bootstrap backup`: one verified etcd snapshot now, through
// the talosconfig the talos stage wrote.
func Backup(ctx context.Context, env *Env) (backup.Info, error) {
	ops, err := savedTalosOps(env)
	if err != nil {
		return backup.Info{}, err
	}
	return TakeBackup(ctx, env, ops)
}
