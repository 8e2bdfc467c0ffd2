package postcheck

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/homelab/bootstrap/backup"
	"github.com/homelab/bootstrap/check"
)

// etcdBackup takes an etcd snapshot (not in a dry run), verifies and keeps
// it, prunes to BackupKeep, and judges the newest one's age. A snapshot
// that cannot be taken while a recent one exists is a warning; no recent
// one at all fails: the cluster has no way back.
func (c *checker) etcdBackup(ctx context.Context) (check.Status, string) {
	if c.o.BackupDir == "" {
		return check.Warnf("no backup directory configured")
	}
	var took string
	var takeErr error
	switch {
	case c.o.DryRun:
		took = "dry run: none taken"
	case c.o.TakeBackup == nil:
		takeErr = errors.New("no talosconfig to reach etcd through")
	default:
		took, takeErr = c.o.TakeBackup(ctx)
	}
	newest, at, err := backup.Newest(c.o.BackupDir)
	if err != nil {
		return check.Failf("reading %s: %v", c.o.BackupDir, err)
	}
	if c.o.Observed != nil && newest != "" {
		c.o.Observed.NewestBackup = at
	}
	age := c.o.now().Sub(at)
	switch {
	case newest == "" && takeErr != nil:
		return check.Failf("no etcd snapshot, and taking one failed: %v", takeErr)
	case newest == "":
		return check.Failf("no etcd snapshot in %s", c.o.BackupDir)
	case c.o.BackupMaxAge > 0 && age > c.o.BackupMaxAge:
		if takeErr != nil {
			return check.Failf("taking a snapshot failed (%v) and the newest, %s, is %s old (limit %s)", takeErr, filepath.Base(newest), age.Round(time.Minute), c.o.BackupMaxAge)
		}
		return check.Failf("the newest etcd snapshot, %s, is %s old (limit %s)", filepath.Base(newest), age.Round(time.Minute), c.o.BackupMaxAge)
	case takeErr != nil && took == "":
		return check.Warnf("taking a snapshot failed: %v; the newest, %s, is %s old", takeErr, filepath.Base(newest), age.Round(time.Minute))
	}
	if c.o.NewestRemote == nil {
		if takeErr != nil {
			// Taken and kept here; only a later step (a copy) failed.
			return check.Warnf("%s; %v", took, takeErr)
		}
		return check.Passf("%s", took)
	}
	// Off the host: the newest verified copy must exist, be younger than
	// BackupMaxAge and be a copy of the newest local snapshot (a copy that
	// failed tonight leaves an older one there).
	rc, err := c.o.NewestRemote(ctx)
	remote, rat := rc.URL, rc.Taken
	rage := c.o.now().Sub(rat)
	var problem string
	switch {
	case err != nil:
		problem = fmt.Sprintf("the remote copies cannot be listed: %v", err)
	case remote == "":
		problem = "no verified remote copy"
	case c.o.BackupMaxAge > 0 && rage > c.o.BackupMaxAge:
		problem = fmt.Sprintf("the newest verified remote copy, %s, is %s old (limit %s)", remote, rage.Round(time.Minute), c.o.BackupMaxAge)
	case rat.Before(at):
		problem = fmt.Sprintf("the newest verified remote copy, %s, is older than the newest local snapshot %s (by %s)", remote, filepath.Base(newest), at.Sub(rat).Round(time.Second))
	}
	switch {
	case problem != "" && takeErr != nil:
		return check.Warnf("%s; %s (%v)", took, problem, takeErr)
	case problem != "":
		return check.Warnf("%s; %s", took, problem)
	case takeErr != nil:
		return check.Warnf("%s; %v", took, takeErr)
	}
	return check.Passf("%s; newest verified remote copy %s, %s old", took, remote, rage.Round(time.Minute))
}
