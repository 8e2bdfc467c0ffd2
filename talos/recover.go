package talos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/Masterminds/semver/v3"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/constants"

	"github.com/homelab/bootstrap/internal/wait"
)

// Recovery is an etcd snapshot to start etcd from instead of an empty
// data directory.
type Recovery struct {
	// Name says which snapshot, for plans and logs (a file name).
	Name string
	// Snapshot is read from its start on every upload attempt.
	Snapshot io.ReadSeeker
	// Replaces says a running etcd is wiped before the recovery: a dry
	// run, which wipes nothing, plans the recovery all the same.
	Replaces bool
}

// RecoverEtcd bootstraps etcd on the control plane at ip from r, as
// `talosctl bootstrap --recover-from` does (cmd/talosctl/cmd/talos/
// bootstrap.go at v1.13.3): the snapshot is uploaded with EtcdRecover, then
// Bootstrap with recover_etcd makes the node's etcd service restore it
// into its empty data directory (services/etcd.go recoverFromSnapshot) and
// start a one-member cluster the other control planes join. Both calls are
// retried while the node answers FailedPrecondition ("etcd service is not
// ready for recovery yet", "bootstrap is not available yet"), as Talos' own
// etcd recovery test does (internal/integration/api/etcd-recover.go), up
// to BootstrapTimeout. already is true when the node's etcd data directory
// was not empty (AlreadyExists): etcd runs there and nothing was restored.
func (o *Ops) RecoverEtcd(ctx context.Context, name, ip string, r Recovery) (already bool, err error) {
	log := o.opts.Log.With().Str("node", name).Str("ip", ip).Logger()
	spec := wait.Spec{
		What:          fmt.Sprintf("the etcd snapshot %s uploaded to %s (%s)", r.Name, name, ip),
		Timeout:       o.opts.BootstrapTimeout,
		Interval:      o.opts.PollInterval,
		ProgressEvery: o.opts.ProgressEvery,
		Log:           log,
	}
	err = wait.Until(ctx, spec, func(ctx context.Context) (bool, string, error) {
		if _, err := r.Snapshot.Seek(0, io.SeekStart); err != nil {
			return false, "", err
		}
		// The upload is one call carrying the whole snapshot: it gets the
		// bootstrap budget, not the single-call timeout.
		err := o.call(ctx, ip, true, o.opts.BootstrapTimeout, func(ctx context.Context, c *client.Client) error {
			_, err := c.EtcdRecover(ctx, r.Snapshot)
			return err
		})
		return acceptedWhenReady(err, "uploading the etcd snapshot to "+name)
	})
	if err != nil {
		return false, err
	}
	log.Info().Str("snapshot", r.Name).Msgf("uploaded the etcd snapshot to %s", name)
	return o.bootstrap(ctx, name, ip, &machine.BootstrapRequest{RecoverEtcd: true})
}

// ResetEtcdData throws away the etcd data of the control planes cps, as
// before a recovery onto nodes whose etcd still runs: each gets a
// non-graceful reset that wipes the EPHEMERAL partition (etcd's data
// directory lives there; from v1.14 the ETCD volume too: etcdWipe) and
// reboots (`talosctl reset --graceful=false
// --reboot --system-labels-to-wipe=EPHEMERAL`, as Talos' own etcd recovery
// test does: internal/integration/api/etcd-recover.go at v1.13.3); the
// machine configs on STATE stay. All resets are sent before any node is
// waited for, so no wiped node comes back while another still runs the
// old etcd it would try to rejoin. It returns once every node runs its
// installed system again with an etcd that waits to join a cluster,
// bounded by RebootTimeout.
func (o *Ops) ResetEtcdData(ctx context.Context, cps []Target) error {
	// The resets go out at once, not one after another: a node whose
	// reboot is quicker than the other resets' round trips would find
	// the old etcd still running on them and join it again (seen in the
	// lab, where a reboot takes milliseconds and one reset took 1.3 s).
	// What to wipe depends on the Talos each runs: asked first, all at
	// once, so the resets still go out together.
	labels := make([][]*machine.ResetPartitionSpec, len(cps))
	errs := make([]error, len(cps))
	var wg sync.WaitGroup
	for i, t := range cps {
		wg.Go(func() {
			p, err := o.Probe(ctx, t.IP)
			if err != nil {
				errs[i] = fmt.Errorf("asking %s which Talos it runs before its reset: %w", t, err)
				return
			}
			labels[i] = etcdWipe(p.Version)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for i, t := range cps {
		wg.Go(func() {
			err := o.call(ctx, t.IP, true, o.opts.CallTimeout, func(ctx context.Context, c *client.Client) error {
				_, err := c.MachineClient.Reset(ctx, &machine.ResetRequest{
					Graceful: false, Reboot: true,
					SystemPartitionsToWipe: labels[i],
				})
				return err
			})
			switch {
			case isDown(err):
				// The node went away before its answer arrived: the reset
				// sequence may already run. The wait below tells.
				o.opts.Log.Warn().Str("node", t.Name).Err(err).Msgf("no answer from %s to the reset; waiting for it to come back with an empty etcd", t)
			case err != nil:
				errs[i] = fmt.Errorf("resetting %s on %s: %w", labelsOf(labels[i]), t, err)
			default:
				o.opts.Log.Info().Str("node", t.Name).Msgf("reset %s: %s (etcd data) wiped, rebooting", t, labelsOf(labels[i]))
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, t := range cps {
		if err := o.waitEtcdEmpty(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// etcdWipe is what a reset wipes to clear etcd's data on a node running
// Talos version: EPHEMERAL, where etcd's directory lives by default, and
// from v1.14 the ETCD volume too, which may be a partition of its own
// (a VolumeConfig named ETCD) that wiping EPHEMERAL leaves alone
// (hack/release.toml notes.systemVolumes at v1.14.0-rc.1). Talos v1.14
// takes ETCD beside EPHEMERAL in either form (a directory is wiped with the
// volume it resides on); v1.13 refuses it, "volume "ETCD" is not located"
// (v1alpha1_server.go Reset at v1.13.3 and v1.14.0-rc.1).
func etcdWipe(version string) []*machine.ResetPartitionSpec {
	specs := []*machine.ResetPartitionSpec{{Label: constants.EphemeralPartitionLabel, Wipe: true}}
	if from, _ := From114(version); from {
		specs = append(specs, &machine.ResetPartitionSpec{Label: constants.EtcdDataVolumeID, Wipe: true})
	}
	return specs
}

// From114 reports whether a Talos version is v1.14 or newer (its
// prereleases too), the Talos of the typed documents, workload isolation
// and the ETCD volume; ok is false for what is no version.
func From114(version string) (from, ok bool) {
	v, err := semver.NewVersion(strings.TrimPrefix(version, "v"))
	if err != nil {
		return false, false
	}
	return !v.LessThan(semver.MustParse("1.14.0-0")), true
}

// labelsOf names what specs wipe ("EPHEMERAL and ETCD").
func labelsOf(specs []*machine.ResetPartitionSpec) string {
	names := make([]string, 0, len(specs))
	for _, s := range specs {
		names = append(names, s.GetLabel())
	}
	return strings.Join(names, " and ")
}

// waitEtcdEmpty waits until t runs its installed system again and its etcd
// does not run (it waits to join a cluster).
func (o *Ops) waitEtcdEmpty(ctx context.Context, t Target) error {
	spec := wait.Spec{
		What:          fmt.Sprintf("%s back from its reset with an empty etcd", t),
		Timeout:       o.opts.RebootTimeout,
		Interval:      o.opts.PollInterval,
		ProgressEvery: o.opts.ProgressEvery,
		Log:           o.opts.Log.With().Str("node", t.Name).Logger(),
	}
	return wait.Until(ctx, spec, func(ctx context.Context) (bool, string, error) {
		up, err := o.InstalledSystemUp(ctx, t.IP)
		if err != nil {
			return false, shortErr(err), nil
		}
		if !up.Installed {
			return false, up.Detail, nil
		}
		svcs, err := o.Services(ctx, t.IP)
		if err != nil {
			return false, shortErr(err), nil
		}
		if s, ok := findService(svcs, "etcd"); ok && s.State == "Running" {
			return false, "etcd still runs (the reset has not rebooted the node yet)", nil
		}
		return true, "", nil
	})
}
