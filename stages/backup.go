package stages

import (
	"context"
	"errors"
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

// etcdSnapshot streams a snapshot from the first control plane that gives
// one, in config order; w only ever receives one node's complete stream
// (a failed node's partial bytes are discarded with its temp file).
func etcdSnapshot(ctx context.Context, env *Env, ops *talos.Ops, w io.Writer) (int64, error) {
	var errs []error
	for _, n := range env.Config.ControlPlanes() {
		tmp, err := os.CreateTemp(BackupDir(env), ".taking-node-*")
		if err != nil {
			return 0, err
		}
		_, err = ops.EtcdSnapshot(ctx, talos.Target{Name: n.Name, IP: n.IP, Role: talos.RoleControlPlane}, tmp)
		if err == nil {
			_, err = tmp.Seek(0, io.SeekStart)
		}
		if err == nil {
			var written int64
			written, err = io.Copy(w, tmp)
			tmp.Close()
			os.Remove(tmp.Name())
			return written, err
		}
		tmp.Close()
		os.Remove(tmp.Name())
		errs = append(errs, err)
	}
	return 0, fmt.Errorf("no control plane gave an etcd snapshot: %w", errors.Join(errs...))
}

// TakeBackup takes, verifies and keeps one etcd snapshot, then prunes to
// backup.keep. It is what `bootstrap backup` runs and what the talos stage
// runs before upgrading.
func TakeBackup(ctx context.Context, env *Env, ops *talos.Ops) (backup.Info, error) {
	if err := os.MkdirAll(BackupDir(env), 0o700); err != nil {
		return backup.Info{}, err
	}
	src := func(ctx context.Context, w io.Writer) (int64, error) { return etcdSnapshot(ctx, env, ops, w) }
	info, err := backup.Take(ctx, src, BackupDir(env), env.now())
	if err != nil {
		return info, err
	}
	if _, err := backup.Prune(BackupDir(env), max(1, env.Config.Backup.Keep)); err != nil {
		env.Log.Warn().Err(err).Msg("pruning old etcd snapshots")
	}
	return info, nil
}

// Backup is `bootstrap backup`: one verified etcd snapshot now, through
// the talosconfig the talos stage wrote.
func Backup(ctx context.Context, env *Env) (backup.Info, error) {
	tc, err := os.ReadFile(env.Paths.Talosconfig)
	if err != nil {
		return backup.Info{}, fmt.Errorf("no talosconfig at %s (run the talos stage first): %w", env.Paths.Talosconfig, errors.Unwrap(err))
	}
	ops, err := talosOps(env, tc)
	if err != nil {
		return backup.Info{}, err
	}
	return TakeBackup(ctx, env, ops)
}
