package stages

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/homelab/bootstrap/backup"
	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/internal/fsutil"
	"github.com/homelab/bootstrap/internal/sealed"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/talos"
)

// RestoreStages are the stages `bootstrap restore` runs once it has checked
// the snapshot and the cluster: talos (configs applied, etcd started from
// the snapshot instead of empty, the other control planes joined, health,
// kubeconfig), flux (the restored Flux objects carry a Ready status from
// before the loss; the stage asks for a reconciliation and waits for it, so
// the restore ends with Flux really syncing), then the postcheck.
// Provision is the user's step before: a restore needs the VMs, and
// creating them is not something to do behind a restore's back.
var RestoreStages = []string{Talos, Flux, Postcheck}

// EtcdRunsError refuses a restore onto a cluster whose etcd runs: the
// restore would replace it, and what was written since the snapshot would
// be lost.
type EtcdRunsError struct {
	Node     string
	Members  int
	Snapshot backup.Info
	// NoLeader: etcd runs on Node but answers without a leader (or not
	// at all): the cluster lost quorum, and the survivors' data can only
	// be replaced.
	NoLeader error
}

func (e *EtcdRunsError) Error() string {
	if e.NoLeader != nil {
		return fmt.Sprintf("etcd runs on %s but has no leader (%v): the cluster lost quorum, more than half of its members are gone. %s. "+
			"To restore, pass --force: the etcd data the surviving control planes keep is wiped first",
			e.Node, e.NoLeader, e.loss())
	}
	return fmt.Sprintf("etcd runs on %s (%d member(s)): %s. "+
		"A restore replaces a lost etcd; to replace this one anyway, pass --force (the control planes' etcd data is wiped first)",
		e.Node, e.Members, e.loss())
}

// loss says what restoring the snapshot over a running etcd loses.
func (e *EtcdRunsError) loss() string {
	what := "it"
	if e.NoLeader != nil {
		what = "what the surviving members hold"
	}
	return fmt.Sprintf("restoring %s (taken %s, revision %d) would replace %s and lose every change written since then",
		filepath.Base(e.Snapshot.Source()), e.Snapshot.Taken.Format(time.RFC3339), e.Snapshot.Revision, what)
}

// PrepareRestore checks a restore of the verified snapshot info (the
// caller verifies it before taking the lock: a bad file changes nothing)
// before anything changes: etcd must run on no control plane. Where it runs, the restore is refused unless force: then it says
// what is lost and the talos stage wipes every control plane's etcd data
// first (Recovery.Replaces). An etcd this very restore started (an earlier
// `bootstrap restore` of the same snapshot that was interrupted) is
// resumed, not refused. The restore is recorded in the state (outside a dry run) before
// anything changes; the returned recovery is for the talos stage, and the
// caller closes its file.
func PrepareRestore(ctx context.Context, env *Env, info backup.Info, force bool) (*talos.Recovery, error) {
	// The state records the file the user has (an encrypted copy, not
	// the plaintext it was decrypted to for this run).
	from := info.Source()
	ops, err := savedTalosOps(env)
	if err != nil {
		return nil, err
	}
	out := &env.State.Outputs.Talos
	prev := out.Restore
	same := prev != nil && prev.SHA256 == info.SHA256 && prev.Finished.IsZero()
	var running, leaderless *EtcdRunsError
	for _, n := range env.Config.ControlPlanes() {
		if running != nil {
			break
		}
		members, err := ops.EtcdMembers(ctx, n.IP)
		if err != nil && leaderless == nil && (talos.IsNoLeader(err) || ops.EtcdServiceRuns(ctx, n.IP)) {
			// etcd runs there but the member list (which needs a
			// leader) fails: quorum is lost, and the survivors' data
			// is what a restore replaces.
			leaderless = &EtcdRunsError{Node: n.Name, Snapshot: info, NoLeader: err}
		}
		if err != nil || len(members) == 0 {
			// A control plane in maintenance mode, powered off or without
			// etcd: no etcd answers there.
			env.Log.Debug().Str("node", n.Name).Err(err).Msg("no etcd answers")
			continue
		}
		running = &EtcdRunsError{Node: n.Name, Members: len(members), Snapshot: info}
	}
	if running == nil {
		running = leaderless
	}
	resuming := same && (running == nil || prev.Bootstrapped || !prev.Forced)
	switch {
	case running != nil && resuming:
		// Not refused: a restore that did not wipe a running etcd only
		// finds etcd running because it started it.
		env.UI.Warn("etcd already runs from %s (restore started %s); resuming", filepath.Base(from), prev.Started.Format(time.RFC3339))
	case running != nil && !force:
		return nil, &config.UserError{Err: running}
	}
	env.UI.OK("restore: %s", info)
	if !env.DryRun && !resuming {
		out.Restore = &state.Restore{From: from, SHA256: info.SHA256, Revision: info.Revision, Forced: running != nil, Started: env.now().UTC()}
		if err := env.SaveState(); err != nil {
			return nil, fmt.Errorf("writing state: %w", err)
		}
	}
	if running != nil && !resuming {
		// The talos stage wipes it (Recovery.Replaces), before it restores.
		env.UI.Warn("--force: %s", running.loss())
	}
	f, err := os.Open(info.Path)
	if err != nil {
		return nil, err
	}
	return &talos.Recovery{Name: filepath.Base(from), Snapshot: f, Replaces: running != nil && !resuming}, nil
}

// FinishRestore records the restore as done.
func FinishRestore(env *Env) error {
	if r := env.State.Outputs.Talos.Restore; r != nil && !env.DryRun {
		r.Finished = env.now().UTC()
		return env.SaveState()
	}
	return nil
}

// SelectStages returns the named stages of all, in pipeline order.
func SelectStages(all []Stage, names []string) []Stage {
	var out []Stage
	for _, s := range all {
		for _, n := range names {
			if strings.EqualFold(s.Name(), n) {
				out = append(out, s)
			}
		}
	}
	return out
}

// RestoreBundle puts a secrets bundle recovered from a backup copy (plain:
// the copy decrypted, in the form the old host kept it: SOPS-encrypted or
// plaintext) where this cluster's bundle lives, when there is none: a
// restore on a new machine. A bundle already there is never overwritten; a
// different one is refused (the configs it made would not match the
// cluster's). Checked before anything is written: the copy must open (with
// secrets.age.keyFile when SOPS-encrypted) into a valid bundle.
func RestoreBundle(env *Env, plain []byte, from string) error {
	dir, err := os.MkdirTemp(env.Paths.StateDir, ".bundle-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	candidate := filepath.Join(dir, filepath.Base(env.Paths.Secrets))
	if err := os.WriteFile(candidate, plain, 0o600); err != nil {
		return err
	}
	got, err := talos.LoadSecrets(candidate, bundleSealer(env))
	if err != nil {
		return config.Userf("--secrets %s: %v; nothing was touched", from, err)
	}
	have, err := talos.LoadSecrets(env.Paths.Secrets, bundleSealer(env))
	switch {
	case err == nil && have.Cluster.ID == got.Cluster.ID && bytes.Equal(have.Certs.OS.Key, got.Certs.OS.Key):
		env.UI.OK("the secrets bundle %s is the one in %s", env.Paths.Secrets, from)
		return nil
	case err == nil:
		return config.Userf("--secrets %s is not the bundle this host has at %s (another cluster's?): move that one away first if it is the wrong one; nothing was touched", from, env.Paths.Secrets)
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	return env.Wet(fmt.Sprintf("restore the secrets bundle %s from %s", env.Paths.Secrets, from), func() error {
		if err := os.MkdirAll(filepath.Dir(env.Paths.Secrets), 0o700); err != nil {
			return err
		}
		_, err := fsutil.WriteIfChanged(env.Paths.Secrets, plain, 0o600)
		return err
	})
}

// EnsureTalosconfig renders the cluster's Talos configs and talosconfig
// from its bundle when the talosconfig is missing (a new machine): the
// restore reaches the nodes with it.
func EnsureTalosconfig(env *Env) error {
	if _, _, err := sealed.Stored(env.Paths.Talosconfig); !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if _, err := os.Stat(env.Paths.Secrets); err != nil {
		return config.Userf("no talosconfig at %s and no secrets bundle at %s to make one from: pass --secrets with the bundle copied with the backups (<time>%s)", env.Paths.Talosconfig, env.Paths.Secrets, BundleCopySuffix)
	}
	gen, err := talosGenerateOptions(env)
	if err != nil {
		return err
	}
	_, err = renderTalos(env, gen)
	return err
}
