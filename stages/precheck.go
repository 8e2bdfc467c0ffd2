package stages

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/proxmox"
)

// PrecheckStage verifies, without changing anything, that a run can
// succeed: the config, the local output directories, and each area's
// reachability and capacity, contributed by the stages that own the areas
// (each a Prechecker). All checks run, then one table is printed.
type PrecheckStage struct {
	// Areas are the stages whose Prechecks run, in pipeline order.
	Areas []Stage
}

// Prechecker is a stage that contributes checks to the precheck stage: what
// it will need (a reachable host, capacity, credentials), proved before any
// stage changes anything. Checks only read.
type Prechecker interface {
	Prechecks(ctx context.Context, env *Env) []check.Check
}

// precheckConcurrency bounds the checks run at once. Checks only read, and
// reads shared between checks are made once, so more at once adds no calls;
// with four, a cluster of three members' per-member checks queued behind
// the slow shared ones (the privileges wait for every VM's plan).
const precheckConcurrency = 16

// Name implements Stage.
func (PrecheckStage) Name() string { return Precheck }

// Run implements Stage.
func (s PrecheckStage) Run(ctx context.Context, env *Env) error {
	checks := localChecks(env)
	for _, a := range s.Areas {
		if p, ok := a.(Prechecker); ok {
			checks = append(checks, p.Prechecks(ctx, env)...)
		}
	}

	results := check.RunAll(ctx, checks, precheckConcurrency)
	if err := check.Table(env.Out, results); err != nil {
		return err
	}
	for _, r := range results {
		// The table already went to the user: every verdict goes to the
		// run log only (debug), not to the console a second time.
		env.Log.Debug().Str("check", r.Name).Str("result", string(r.Status)).Dur("duration", r.Duration).Msg(r.Reason)
	}
	if n := check.Count(results, check.Fail); n > 0 {
		err := fmt.Errorf("%d precheck(s) failed: see the table above", n)
		if s := check.Count(results, check.Skip); s > 0 {
			err = fmt.Errorf("%d precheck(s) failed (%d more skipped because of them): see the table above", n, s)
		}
		// proxmox.boot image on a host that cannot import the image is the
		// config asking the impossible: an invalid config's exit (2).
		if refusal := bootRefused(env, results); refusal != nil {
			return errors.Join(config.Userf("%v; nothing was changed", refusal), err)
		}
		return err
	}
	return nil
}

// bootRefused is the boot row's refusal of proxmox.boot image, when that
// row failed.
func bootRefused(env *Env, results []check.Result) error {
	for _, r := range results {
		if r.Name != proxmox.BootCheck || r.Status != check.Fail {
			continue
		}
		s := env.shared()
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.boot != nil {
			return s.boot.refusal
		}
	}
	return nil
}

// localChecks cover this host: config warnings and writable output dirs.
func localChecks(env *Env) []check.Check {
	out := []check.Check{{
		Name: "config",
		Run: func(context.Context) (check.Status, string) {
			if w := env.Config.Warnings(); len(w) > 0 {
				return check.Warnf("%s valid with %d warning(s); first: %s", env.Config.File(), len(w), w[0].Error())
			}
			return check.Passf("%s valid", env.Config.File())
		},
	}}
	dirs := []struct{ name, path string }{
		{"state dir writable", env.Paths.StateDir},
		{"talos dir writable", env.Paths.TalosDir},
	}
	if kd := filepath.Dir(env.Paths.Kubeconfig); kd != env.Paths.TalosDir {
		dirs = append(dirs, struct{ name, path string }{"kubeconfig dir writable", kd})
	}
	for _, d := range dirs {
		out = append(out, check.Check{Name: d.name, Run: func(context.Context) (check.Status, string) {
			return dirWritable(d.path)
		}})
	}
	if env.Config.Backup.S3.Enabled() {
		// Backups do not stop a bring-up: a bucket that cannot be used
		// warns here, and every backup's copy warns until it can.
		out = append(out, check.Check{Name: "backup: S3 bucket", Run: func(ctx context.Context) (check.Status, string) {
			s3, err := backupS3(env)
			if err == nil {
				err = s3.Check(ctx)
			}
			if err != nil {
				return check.Warnf("%v: etcd snapshots will not be copied there", err)
			}
			return check.Passf("%s exists and takes these credentials", s3.URL(""))
		}})
	}
	return out
}

// dirWritable checks that path, or the nearest existing ancestor it would be
// created in, is a writable directory, without creating anything.
func dirWritable(path string) (check.Status, string) {
	p := path
	for {
		st, err := os.Stat(p)
		if err == nil {
			if !st.IsDir() {
				return check.Failf("%s is not a directory", p)
			}
			if err := unix.Access(p, unix.W_OK|unix.X_OK); err != nil {
				return check.Failf("%s is not writable: %v", p, err)
			}
			if p == path {
				return check.Passf("%s", path)
			}
			return check.Passf("%s (will be created under %s)", path, p)
		}
		if !errors.Is(err, os.ErrNotExist) {
			return check.Failf("%s: %v", p, err)
		}
		parent := filepath.Dir(p)
		if parent == p {
			return check.Failf("no existing parent directory for %s", path)
		}
		p = parent
	}
}
