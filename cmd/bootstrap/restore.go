package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/homelab/bootstrap/backup"
	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/stages"
)

// RestoreCmd is `bootstrap restore`: disaster recovery of a cluster whose
// etcd was lost (every control plane VM gone with its disk).
type RestoreCmd struct {
	From        string `required:"" help:"The etcd snapshot to restore: one bootstrap backup kept (ai/state/<cluster>/etcd/*.snapshot) or a copy of one (.snapshot.age with --age-identity), a file or s3://<backup.s3.bucket>/<key>." placeholder:"FILE"`
	Secrets     string `help:"The secrets bundle copied with the backups (<time>.secrets.yaml.age, a file or s3://<bucket>/<key>), for a restore on a machine that lost .talos/<cluster>/: it is put in place (never over another bundle) and the Talos configs are made from it." placeholder:"FILE"`
	AgeIdentity string `help:"age identity file that decrypts an encrypted copy (.age); default $SOPS_AGE_KEY_FILE." placeholder:"FILE"`
	DryRun      bool   `help:"Verify the snapshot and show what the restore would do; change nothing."`
	Force       bool   `help:"Restore even though etcd runs: the control planes' etcd data is wiped first and every change since the snapshot is lost."`
	Node        string `help:"The control plane to restore the snapshot on (the others join it); default: the one etcd was last bootstrapped or restored on, else the first in the config." placeholder:"NAME"`
}

// Run verifies the snapshot, refuses a cluster whose etcd runs, then runs
// the talos stage with etcd started from the snapshot, and the postcheck.
func (r *RestoreCmd) Run(ctx context.Context, a *App) error {
	cfg, err := a.loadConfig()
	if err != nil {
		return err
	}
	paths := cfg.Paths()
	id := r.AgeIdentity
	if id == "" && a.LookupEnv != nil {
		id, _ = a.LookupEnv("SOPS_AGE_KEY_FILE")
	}
	from, cleanup, err := fetchCopy(ctx, cfg, "--from", r.From)
	if err != nil {
		return err
	}
	defer cleanup()
	var bundle []byte
	if r.Secrets != "" {
		if bundle, err = openBundleCopy(ctx, cfg, r.Secrets, id); err != nil {
			return err
		}
	}
	if strings.HasSuffix(from, backup.AgeSuffix) {
		if id == "" {
			return config.Userf("--from %s is encrypted with age: pass --age-identity FILE (or set SOPS_AGE_KEY_FILE)", r.From)
		}
		if err := os.MkdirAll(paths.StateDir, 0o700); err != nil {
			return err
		}
		plain, err := backup.Decrypt(from, id, paths.StateDir)
		if err != nil {
			// The copy the user named (an s3:// URL), not its download,
			// which is gone by the time this is read.
			return config.Userf("--from %s: %v; nothing was touched", r.From, err)
		}
		defer os.Remove(plain)
		from = plain
	}
	// The snapshot is checked before any lock, log or call: a bad file
	// changes nothing.
	snap, err := backup.Verify(from)
	if from != r.From {
		snap, err = backup.VerifyDecrypted(from, r.From)
	}
	if err != nil {
		return config.Userf("--from %s: %v; nothing was touched", r.From, err)
	}

	if r.Node != "" && !slices.ContainsFunc(cfg.ControlPlanes(), func(n config.Node) bool { return n.Name == r.Node }) {
		return config.Userf("--node %s is not a control plane in the config's nodes; nothing was touched", r.Node)
	}
	env, sess, err := a.commandEnv(cfg, r.DryRun)
	if err != nil {
		return err
	}
	env.Options.RecoverNode = r.Node
	if bundle != nil {
		if err := stages.RestoreBundle(env, bundle, r.Secrets); err != nil {
			if sess != nil {
				sess.Close()
			}
			return err
		}
	}
	if _, err := os.Stat(paths.Talosconfig); err != nil && env.DryRun {
		fmt.Fprintf(env.Out, "Plan (dry run: nothing was changed)\n  restore the secrets bundle, make the Talos configs from it, then restore etcd from %s on the control planes\n", snap.Source())
		return nil
	}
	if err := stages.EnsureTalosconfig(env); err != nil {
		if sess != nil {
			sess.Close()
		}
		return err
	}
	selected := stages.SelectStages(a.Stages(), stages.RestoreStages)
	if sess == nil {
		return restore(ctx, env, snap, r.Force, selected, stages.RunInfo{})
	}
	defer sess.Close()
	sess.Log.Info().Str("version", version).Str("from", r.From).Str("log", sess.LogPath).Msg("restore started")
	if err := restore(ctx, env, snap, r.Force, selected, stages.RunInfo{ID: sess.RunID, Command: a.commandLine(), LogPath: sess.LogPath}); err != nil {
		sess.Log.Error().Err(err).Int("exit_code", stages.ExitCode(err)).Str("log", sess.LogPath).Msg("restore stopped; full log in " + sess.LogPath)
		return silentError{err}
	}
	sess.Log.Info().Msg("restore finished")
	return nil
}

func restore(ctx context.Context, env *stages.Env, snap backup.Info, force bool, selected []stages.Stage, info stages.RunInfo) error {
	rec, err := stages.PrepareRestore(ctx, env, snap, force)
	if err != nil {
		return err
	}
	defer rec.Snapshot.(*os.File).Close()
	env.Options.Recover = rec
	if env.DryRun {
		// Flux and the postcheck cannot be checked before the restore: the
		// plan names them instead of running them against the lost cluster.
		selected = stages.SelectStages(selected, []string{stages.Talos})
	}
	if err := stages.Run(ctx, env, selected, info); err != nil {
		return err
	}
	if env.DryRun {
		fmt.Fprintln(env.Out, "Then the flux stage has the restored GitRepository and Kustomization reconciled, and the postcheck runs on the restored cluster (it must pass for the restore to succeed).")
		return nil
	}
	if err := stages.FinishRestore(env); err != nil {
		return err
	}
	// Only a recovery bootstrap this restore made (or an interrupted
	// attempt of it recorded) restored anything: a node whose etcd data
	// directory was not empty answers AlreadyExists and keeps its data.
	if r := env.State.Outputs.Talos.Restore; r == nil || !r.Bootstrapped {
		fmt.Fprintf(env.Out, "etcd was NOT restored from %s: the control plane's etcd already had data (Bootstrap answered AlreadyExists), and the cluster runs on that; the postcheck passed\n", snap.Source())
		return nil
	}
	fmt.Fprintf(env.Out, "restored etcd from %s (revision %d); the postcheck passed\n", snap.Source(), snap.Revision)
	return nil
}

// fetchCopy returns a local file for a copy given as a path or as
// s3://<backup.s3.bucket>/<key> (downloaded into the state directory and
// compared with the digest its upload recorded); cleanup removes the
// download.
func fetchCopy(ctx context.Context, cfg *config.Config, flag, arg string) (string, func(), error) {
	if !strings.HasPrefix(arg, "s3://") {
		return arg, func() {}, nil
	}
	if !cfg.Backup.S3.Enabled() {
		return "", nil, config.Userf("%s %s: backup.s3 is not configured; nothing was touched", flag, arg)
	}
	s3, _, err := stages.BackupBucket(cfg)
	if err != nil {
		return "", nil, err
	}
	key, err := s3.KeyOf(arg)
	if err != nil {
		return "", nil, config.Userf("%s: %v; nothing was touched", flag, err)
	}
	if err := os.MkdirAll(cfg.Paths().StateDir, 0o700); err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp(cfg.Paths().StateDir, ".download-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	p, err := s3.Download(ctx, key, dir)
	if err != nil {
		cleanup()
		return "", nil, config.Userf("%s: %v; nothing was touched", flag, err)
	}
	return p, cleanup, nil
}

// openBundleCopy reads a copy of the secrets bundle (always age-encrypted)
// and returns what it holds, decrypted with the age identity.
func openBundleCopy(ctx context.Context, cfg *config.Config, arg, identity string) ([]byte, error) {
	if !strings.HasSuffix(arg, backup.AgeSuffix) {
		return nil, config.Userf("--secrets %s: copies of the secrets bundle are age-encrypted (<time>%s)", arg, stages.BundleCopySuffix)
	}
	if identity == "" {
		return nil, config.Userf("--secrets %s is encrypted with age: pass --age-identity FILE (or set SOPS_AGE_KEY_FILE)", arg)
	}
	local, cleanup, err := fetchCopy(ctx, cfg, "--secrets", arg)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if err := os.MkdirAll(cfg.Paths().StateDir, 0o700); err != nil {
		return nil, err
	}
	plain, err := backup.Decrypt(local, identity, cfg.Paths().StateDir)
	if err != nil {
		return nil, config.Userf("--secrets %s: %v; nothing was touched", arg, err)
	}
	defer os.Remove(plain)
	return os.ReadFile(plain)
}
