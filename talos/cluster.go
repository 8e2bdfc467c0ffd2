package talos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"google.golang.org/grpc/codes"

	"github.com/homelab/bootstrap/internal/wait"
)

// Bootstrap starts etcd on the node at ip, the first control plane. It is
// called for that node only, ever: bootstrapping a second control plane
// that has not joined etcd would start a second cluster. AlreadyExists
// ("etcd data directory is not empty") from this node means an earlier run
// bootstrapped it and counts as success (already = true). FailedPrecondition
// (not ready, time not in sync) and unreachable are retried until
// BootstrapTimeout.
func (o *Ops) Bootstrap(ctx context.Context, name, ip string) (already bool, err error) {
	return o.bootstrap(ctx, name, ip, &machine.BootstrapRequest{})
}

func (o *Ops) bootstrap(ctx context.Context, name, ip string, req *machine.BootstrapRequest) (already bool, err error) {
	log := o.opts.Log.With().Str("node", name).Str("ip", ip).Logger()
	spec := wait.Spec{
		What:          fmt.Sprintf("etcd bootstrap on %s (%s) to be accepted", name, ip),
		Timeout:       o.opts.BootstrapTimeout,
		Interval:      o.opts.PollInterval,
		ProgressEvery: o.opts.ProgressEvery,
		Log:           log,
	}
	err = wait.Until(ctx, spec, func(ctx context.Context) (bool, string, error) {
		err := o.call(ctx, ip, true, o.opts.CallTimeout, func(ctx context.Context, c *client.Client) error {
			return c.Bootstrap(ctx, req)
		})
		if client.StatusCode(err) == codes.AlreadyExists {
			already = true
			return true, "", nil
		}
		return acceptedWhenReady(err, "bootstrapping "+name)
	})
	if err != nil {
		return false, err
	}
	if already {
		log.Info().Msgf("etcd on %s was already bootstrapped", name)
	} else {
		log.Info().Msgf("bootstrapped etcd on %s", name)
	}
	return already, nil
}

// acceptedWhenReady classifies the answer to a call a node refuses until
// it is ready (Bootstrap, EtcdRecover): nil is done; FailedPrecondition
// (not ready yet, time not in sync) and an unreachable node are retried;
// a server or client certificate problem and Unimplemented (not a control
// plane: machinehelper.CheckControlplane) are fatal, as is anything else.
func acceptedWhenReady(err error, doing string) (bool, string, error) {
	switch {
	case err == nil:
		return true, "", nil
	case isUntrustedServer(err) || isCertRequired(err), client.StatusCode(err) == codes.Unimplemented:
		return false, "", fmt.Errorf("%s: %w", doing, err)
	}
	switch client.StatusCode(err) {
	case codes.FailedPrecondition, codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return false, shortErr(err), nil
	}
	return false, "", fmt.Errorf("%s: %w", doing, err)
}

// EtcdMember is one member of the etcd cluster.
type EtcdMember struct {
	ID       uint64
	Hostname string
	Learner  bool
	// IPs are the hosts of the member's peer URLs: the node's address,
	// which, unlike the hostname, a user's config patch does not change.
	IPs []string
}

// EtcdMembers lists etcd members as the node at ip sees them.
func (o *Ops) EtcdMembers(ctx context.Context, ip string) ([]EtcdMember, error) {
	var out []EtcdMember
	err := o.read(ctx, ip, o.opts.CallTimeout, func(ctx context.Context, c *client.Client) (err error) {
		out, err = etcdMembersOn(ctx, c)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listing etcd members via %s: %w", ip, err)
	}
	return out, nil
}

func etcdMembersOn(ctx context.Context, c *client.Client) ([]EtcdMember, error) {
	resp, err := c.EtcdMemberList(ctx, &machine.EtcdMemberListRequest{})
	if err != nil {
		return nil, err
	}
	var out []EtcdMember
	for _, m := range resp.GetMessages() {
		for _, mem := range m.GetMembers() {
			out = append(out, EtcdMember{ID: mem.GetId(), Hostname: mem.GetHostname(), Learner: mem.GetIsLearner(), IPs: peerIPs(mem.GetPeerUrls())})
		}
	}
	return out, nil
}

// peerIPs are the hosts of etcd peer URLs ("https://10.0.0.11:2380"), as
// talosctl's EtcdControlPlaneNodesAssertion reads them
// (pkg/cluster/check/etcd.go at v1.13.3: url.Parse, then Hostname).
func peerIPs(urls []string) []string {
	var out []string
	for _, u := range urls {
		if p, err := url.Parse(u); err == nil && p.Hostname() != "" {
			out = append(out, p.Hostname())
		}
	}
	return out
}

// IsNoLeader reports whether err is etcd refusing a request for want of a
// leader ("etcdserver: no leader", etcd api/v3rpc/rpctypes ErrNoLeader):
// EtcdMemberList asks WithRequireLeader (v1alpha1_server.go at v1.13.3),
// so a cluster that lost quorum answers this while its survivors' etcd
// service still reads Running.
func IsNoLeader(err error) bool {
	return err != nil && strings.Contains(err.Error(), "etcdserver: no leader")
}

// EtcdServiceRuns reports whether the etcd service on the node at ip runs
// (whatever its health), from ServiceList.
func (o *Ops) EtcdServiceRuns(ctx context.Context, ip string) bool {
	svcs, err := o.Services(ctx, ip)
	if err != nil {
		return false
	}
	s, ok := findService(svcs, "etcd")
	return ok && s.State == "Running"
}

// Service is one Talos service's state on a node.
type Service struct {
	ID    string
	State string
	// Healthy is true when the service runs and its last health check passed.
	Healthy bool
	// LastEvent is the message of the service's last event.
	LastEvent string
}

// Services lists the services of the node at ip.
func (o *Ops) Services(ctx context.Context, ip string) ([]Service, error) {
	var out []Service
	err := o.read(ctx, ip, o.opts.CallTimeout, func(ctx context.Context, c *client.Client) (err error) {
		out, err = servicesOn(ctx, c)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listing services of %s: %w", ip, err)
	}
	return out, nil
}

func servicesOn(ctx context.Context, c *client.Client) ([]Service, error) {
	resp, err := c.ServiceList(ctx)
	if err != nil {
		return nil, err
	}
	var out []Service
	for _, m := range resp.GetMessages() {
		for _, s := range m.GetServices() {
			svc := Service{ID: s.GetId(), State: s.GetState()}
			if ev := s.GetEvents().GetEvents(); len(ev) > 0 {
				last := ev[len(ev)-1]
				svc.LastEvent = last.GetMsg()
				svc.State = last.GetState()
			}
			h := s.GetHealth()
			svc.Healthy = svc.State == "Running" && h != nil && !h.GetUnknown() && h.GetHealthy()
			out = append(out, svc)
		}
	}
	return out, nil
}

// HealthTarget is a node whose health is checked.
type HealthTarget struct {
	Name string
	IP   string
	Role Role
}

// Kubeconfig fetches the admin kubeconfig from the control plane at ip
// (as `talosctl kubeconfig`), retrying while the node is not ready.
func (o *Ops) Kubeconfig(ctx context.Context, name, ip string) ([]byte, error) {
	var data []byte
	spec := wait.Spec{
		What:          fmt.Sprintf("kubeconfig from %s (%s)", name, ip),
		Timeout:       o.opts.HealthTimeout,
		Interval:      o.opts.PollInterval,
		ProgressEvery: o.opts.ProgressEvery,
		Log:           o.opts.Log,
	}
	err := wait.Until(ctx, spec, func(ctx context.Context) (bool, string, error) {
		err := o.read(ctx, ip, o.opts.CallTimeout, func(ctx context.Context, c *client.Client) error {
			var err error
			data, err = c.Kubeconfig(ctx)
			return err
		})
		if err == nil {
			if len(data) == 0 {
				return false, "", fmt.Errorf("kubeconfig from %s is empty", name)
			}
			return true, "", nil
		}
		// A stream cut short (node rebooting, deadline) leaves a truncated archive.
		if retryableCall(err) != err || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return false, shortErr(err), nil
		}
		return false, "", fmt.Errorf("fetching kubeconfig from %s: %w", name, err)
	})
	if err != nil {
		return nil, err
	}
	return data, nil
}

// fatalWhileWaiting keeps a health wait going through whatever a node that
// is still starting answers (apid relays etcd's own errors as Unknown),
// and stops it only for what waiting cannot fix: a node that does not
// trust us or that we do not trust.
func fatalWhileWaiting(err error) error {
	if isUntrustedServer(err) || isCertRequired(err) || client.StatusCode(err) == codes.PermissionDenied {
		return err
	}
	return nil
}

// EtcdSnapshot streams an etcd snapshot from the control plane t (as
// `talosctl etcd snapshot`) into w and returns the bytes written.
func (o *Ops) EtcdSnapshot(ctx context.Context, t Target, w io.Writer) (int64, error) {
	var n int64
	err := o.call(ctx, t.IP, true, o.opts.HealthTimeout, func(ctx context.Context, c *client.Client) error {
		rd, err := c.EtcdSnapshot(ctx, &machine.EtcdSnapshotRequest{})
		if err != nil {
			return err
		}
		defer rd.Close()
		n, err = io.Copy(w, rd)
		return err
	})
	if err != nil {
		return n, fmt.Errorf("etcd snapshot from %s: %w", t, err)
	}
	return n, nil
}
