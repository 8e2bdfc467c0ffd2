package stages

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"filippo.io/age"

	"github.com/homelab/bootstrap/backup"
	"github.com/homelab/bootstrap/config"
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
	if b.CopyDir == "" && !b.S3.Enabled() {
		return info, nil
	}
	recipients, err := backup.ParseRecipients(b.AgeRecipients)
	if err != nil {
		return info, &CopyError{Kept: info.Path, Dir: copyTargets(env), Err: err}
	}
	var errs []error
	if b.CopyDir != "" {
		if err := copyToDir(env, info, recipients, keep); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", b.CopyDir, err))
		}
	}
	if b.S3.Enabled() {
		if err := copyToS3(ctx, env, info, recipients, keep); err != nil {
			errs = append(errs, err)
		}
	}
	if len(recipients) == 0 {
		// The bundle holds every CA key of the cluster: never copied in
		// the clear.
		errs = append(errs, errors.New("the secrets bundle was not copied with it: set backup.ageRecipients (copies of the bundle are always encrypted), or the snapshots cannot bring the cluster back without this host"))
	}
	if len(errs) > 0 {
		// One line for the postcheck row, each cause still wrapped.
		err := errs[0]
		for _, e := range errs[1:] {
			err = fmt.Errorf("%w; %w", err, e)
		}
		return info, &CopyError{Kept: info.Path, Dir: copyTargets(env), Err: err}
	}
	return info, nil
}

// copyTargets names where copies go, for messages.
func copyTargets(env *Env) string {
	b := env.Config.Backup
	var out []string
	if b.CopyDir != "" {
		out = append(out, b.CopyDir)
	}
	if b.S3.Enabled() {
		out = append(out, "s3://"+b.S3.Bucket+"/"+backupPrefix(env.Config))
	}
	return strings.Join(out, " and ")
}

// bundleCopyName names the secrets bundle copied with a snapshot:
// <snapshot time>.secrets.yaml.age.
func bundleCopyName(info backup.Info) string {
	return strings.TrimSuffix(filepath.Base(info.Path), backup.Suffix) + BundleCopySuffix
}

// BundleCopySuffix ends the name of every copy of the secrets bundle.
const BundleCopySuffix = ".secrets.yaml" + backup.AgeSuffix

// sealedBundle writes the secrets bundle, age-encrypted to recipients, into
// dir under the snapshot's time; "" without recipients or without a bundle.
func sealedBundle(env *Env, info backup.Info, recipients []age.Recipient, dir string) (string, error) {
	if len(recipients) == 0 {
		return "", nil
	}
	if _, err := os.Stat(env.Paths.Secrets); errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	enc, err := backup.Copy(env.Paths.Secrets, dir, recipients)
	if err != nil {
		return "", fmt.Errorf("encrypting the secrets bundle: %w", err)
	}
	dst := filepath.Join(dir, bundleCopyName(info))
	if err := os.Rename(enc, dst); err != nil {
		os.Remove(enc)
		return "", err
	}
	return dst, nil
}

// copyToDir copies the snapshot (and the sealed bundle) into backup.copyDir
// and prunes both there to keep.
func copyToDir(env *Env, info backup.Info, recipients []age.Recipient, keep int) error {
	dir := env.Config.Resolve(env.Config.Backup.CopyDir)
	dst, err := backup.Copy(info.Path, dir, recipients)
	if err != nil {
		return err
	}
	env.Log.Info().Str("copy", dst).Msg("etcd snapshot copied")
	if _, err := backup.Prune(dir, keep); err != nil {
		return err
	}
	bundle, err := sealedBundle(env, info, recipients, dir)
	if err != nil || bundle == "" {
		return err
	}
	env.Log.Info().Str("copy", bundle).Msg("secrets bundle copied (age-encrypted)")
	_, err = backup.Prune(dir, keep, BundleCopySuffix)
	return err
}

// backupS3 is the client of backup.s3's bucket; its secret key and
// session token join the values masked in all output.
func backupS3(env *Env) (*backup.S3, error) {
	s3, secrets, err := BackupBucket(env.Config)
	if err == nil && env.Secrets != nil {
		for _, s := range secrets {
			env.Secrets.Add(s)
		}
	}
	return s3, err
}

// BackupBucket is the client of backup.s3's bucket (keys under
// backup.s3.prefix, default <cluster>/etcd/) and the secrets it signs
// with (the secret key, and the session token of temporary credentials).
func BackupBucket(cfg *config.Config) (*backup.S3, []string, error) {
	s := cfg.Backup.S3
	creds, err := cfg.S3Credentials()
	if err != nil {
		return nil, nil, err
	}
	secrets := []string{creds.SecretKey}
	if creds.SessionToken != "" {
		secrets = append(secrets, creds.SessionToken)
	}
	ca := ""
	if s.CAFile != "" {
		ca = cfg.Resolve(s.CAFile)
	}
	s3, err := backup.NewS3(backup.S3Options{Endpoint: s.Endpoint, Bucket: s.Bucket, Prefix: backupPrefix(cfg), Region: s.Region, PathStyle: s.PathStyle,
		AccessKey: creds.AccessKey, SecretKey: creds.SecretKey, SessionToken: creds.SessionToken, CredentialsSource: creds.Source, CAFile: ca})
	return s3, secrets, err
}

// backupPrefix is where copies go in backup.s3's bucket: backup.s3.prefix,
// default <cluster>/etcd/.
func backupPrefix(cfg *config.Config) string {
	if p := cfg.Backup.S3.Prefix; p != "" {
		return p
	}
	return cfg.Cluster.Name + "/etcd/"
}

// copyToS3 uploads the snapshot (encrypted to recipients when set) and the
// sealed bundle; each is read back and compared before it counts. Both are
// then pruned in the bucket to keep, as in a directory.
func copyToS3(ctx context.Context, env *Env, info backup.Info, recipients []age.Recipient, keep int) error {
	s3, err := backupS3(env)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(env.Paths.StateDir, ".s3-upload-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	src := info.Path
	if len(recipients) > 0 {
		if src, err = backup.Copy(info.Path, tmp, recipients); err != nil {
			return err
		}
	}
	r, err := s3.Upload(ctx, src, filepath.Base(src))
	if err != nil {
		return err
	}
	env.Log.Info().Str("copy", s3.URL(r.Key)).Str("sha256", r.SHA256).Msg("etcd snapshot uploaded and read back")
	if err := pruneS3(ctx, env, s3, keep, backup.SnapshotSuffixes...); err != nil {
		return err
	}
	bundle, err := sealedBundle(env, info, recipients, tmp)
	if err != nil || bundle == "" {
		return err
	}
	if r, err = s3.Upload(ctx, bundle, filepath.Base(bundle)); err != nil {
		return err
	}
	env.Log.Info().Str("copy", s3.URL(r.Key)).Msg("secrets bundle uploaded (age-encrypted) and read back")
	return pruneS3(ctx, env, s3, keep, BundleCopySuffix)
}

// pruneS3 prunes the bucket's copies to keep (S3.Prune) and warns about
// each copy named after now, which it neither counts nor removes.
func pruneS3(ctx context.Context, env *Env, s3 *backup.S3, keep int, suffixes ...string) error {
	removed, future, err := s3.Prune(ctx, keep, suffixes...)
	WarnFutureCopies(env, s3, future)
	if err != nil {
		return fmt.Errorf("pruning %s: %w", s3.URL(""), err)
	}
	for _, k := range removed {
		env.Log.Info().Str("copy", s3.URL(k)).Msg("old copy removed (backup.keep)")
	}
	return nil
}

// WarnFutureCopies names each copy in the bucket whose name is after now,
// once a run: pruning and the postcheck's look for the newest copy both
// see it, and one warning each is what the postcheck's row carries.
func WarnFutureCopies(env *Env, s3 *backup.S3, future []backup.Remote) {
	now := env.now()
	r := env.shared()
	for _, f := range future {
		url := s3.URL(f.Key)
		r.mu.Lock()
		seen := r.aheadWarned[url]
		if r.aheadWarned == nil {
			r.aheadWarned = map[string]bool{}
		}
		r.aheadWarned[url] = true
		r.mu.Unlock()
		if seen {
			continue
		}
		env.Log.Warn().Str("copy", s3.URL(f.Key)).Str("named_ahead_by", f.Taken.Sub(now).Round(time.Second).String()).
			Msg("a copy in the bucket is named after now (a clock that was wrong when it was written, or an object put there by hand): it does not count toward backup.keep, is never the newest and is never pruned; remove it if it is not a snapshot you keep")
	}
}

// CopyError says the snapshot was taken and kept on this host but its
// copy failed: a warning for the postcheck, not a reason to stop.
type CopyError struct {
	Kept, Dir string
	Err       error
}

func (e *CopyError) Error() string {
	return fmt.Sprintf("kept %s, but its copies to %s are incomplete: %v", filepath.Base(e.Kept), e.Dir, e.Err)
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
