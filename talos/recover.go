package talos

import (
	"context"
	"fmt"
	"io"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"google.golang.org/grpc/codes"

	"github.com/homelab/bootstrap/internal/wait"
)

// Recovery is an etcd snapshot to start etcd from instead of an empty
// data directory.
type Recovery struct {
	// Name says which snapshot, for plans and logs (a file name).
	Name string
	// Snapshot is read from its start on every upload attempt.
	Snapshot io.ReadSeeker
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
		switch {
		case err == nil:
			return true, "", nil
		case isUntrustedServer(err) || isCertRequired(err), client.StatusCode(err) == codes.Unimplemented:
			return false, "", fmt.Errorf("uploading the etcd snapshot to %s: %w", name, err)
		}
		switch client.StatusCode(err) {
		case codes.FailedPrecondition, codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
			return false, shortErr(err), nil
		}
		return false, "", fmt.Errorf("uploading the etcd snapshot to %s: %w", name, err)
	})
	if err != nil {
		return false, err
	}
	log.Info().Str("snapshot", r.Name).Msgf("uploaded the etcd snapshot to %s", name)
	return o.bootstrap(ctx, name, ip, &machine.BootstrapRequest{RecoverEtcd: true})
}
