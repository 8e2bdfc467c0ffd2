package talos

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"

	"github.com/homelab/bootstrap/internal/retry"
)

// OpsOptions configures the Talos API operations.
type OpsOptions struct {
	// Talosconfig is the cluster's admin talosconfig (as rendered).
	Talosconfig []byte
	// Context selects the talosconfig context; default its current one.
	Context string
	// SecretsPath is only quoted in error messages (how to recover).
	SecretsPath string

	// CallTimeout bounds every single API call (default 30s).
	CallTimeout time.Duration
	// ApplyTimeout bounds one ApplyConfiguration call (default 2m): an
	// apply that changes the node's network can hang.
	ApplyTimeout time.Duration
	// PollInterval spaces the polls of every wait (default 250ms: a poll is
	// one cheap call, and each wait on the way to a cluster loses half an
	// interval on average).
	PollInterval time.Duration
	// InstallTimeout bounds maintenance apply → install → reboot →
	// configured (default 20m).
	InstallTimeout time.Duration
	// RebootTimeout bounds a reboot after a configured-mode apply (default 10m).
	RebootTimeout time.Duration
	// DrainTimeout bounds the eviction of a node's pods before its
	// reboot into a new Talos (default 5m, talosctl upgrade's
	// --drain-timeout: nodedrain.DefaultDrainTimeout at v1.14.0-rc.1).
	DrainTimeout time.Duration
	// BootstrapTimeout bounds waiting for Bootstrap to be accepted (default 10m).
	BootstrapTimeout time.Duration
	// HealthTimeout bounds waiting for etcd members and service health (default 15m).
	HealthTimeout time.Duration
	// ProgressEvery spaces progress lines of long waits (default 10s).
	ProgressEvery time.Duration

	Log zerolog.Logger
}

func (o OpsOptions) withDefaults() OpsOptions {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.CallTimeout, 30*time.Second)
	def(&o.ApplyTimeout, 2*time.Minute)
	def(&o.PollInterval, 250*time.Millisecond)
	def(&o.InstallTimeout, 20*time.Minute)
	def(&o.RebootTimeout, 10*time.Minute)
	def(&o.DrainTimeout, 5*time.Minute)
	def(&o.BootstrapTimeout, 10*time.Minute)
	def(&o.HealthTimeout, 15*time.Minute)
	def(&o.ProgressEvery, 10*time.Second)
	return o
}

// Ops drives the Talos API of one cluster's nodes through the machinery
// client. Every call opens its own connection to the node it targets (the
// node's IP is the endpoint, as talosctl -e <ip> -n <ip> does), so a node
// that rebooted is reached again at once instead of after gRPC's reconnect
// backoff.
type Ops struct {
	opts    OpsOptions
	cfg     *clientconfig.Config
	context string
	caPEM   []byte

	// kept are the mutual-TLS clients reads reuse, by address (see read).
	keptMu sync.Mutex
	kept   map[string]*keptClient
}

// keptClient is a client shared by the reads in flight to one address;
// one that failed is dropped from Ops.kept and closed once unused.
type keptClient struct {
	c       *client.Client
	refs    int
	dropped bool
}

// NewOps prepares operations with the cluster's talosconfig.
func NewOps(opts OpsOptions) (*Ops, error) {
	opts = opts.withDefaults()
	cfg, err := clientconfig.FromBytes(opts.Talosconfig)
	if err != nil {
		return nil, fmt.Errorf("reading talosconfig: %w", err)
	}
	name := opts.Context
	if name == "" {
		name = cfg.Context
	}
	tctx := cfg.Contexts[name]
	if tctx == nil {
		return nil, fmt.Errorf("talosconfig has no context %q", name)
	}
	ca, err := base64.StdEncoding.DecodeString(tctx.CA)
	if err != nil || len(ca) == 0 {
		return nil, fmt.Errorf("talosconfig context %q has no usable CA", name)
	}
	// Target nodes only through the endpoint; a context's default nodes
	// would make apid proxy elsewhere.
	ctxCopy := *tctx
	ctxCopy.Nodes = nil
	cfg = &clientconfig.Config{Context: name, Contexts: map[string]*clientconfig.Context{name: &ctxCopy}}
	return &Ops{opts: opts, cfg: cfg, context: name, caPEM: ca}, nil
}

// Options returns the effective options (defaults filled in).
func (o *Ops) Options() OpsOptions { return o.opts }

var dialOpts = []grpc.DialOption{
	grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 200 * time.Millisecond, Multiplier: 1.6, MaxDelay: 2 * time.Second},
		MinConnectTimeout: 5 * time.Second,
	}),
}

// call runs fn with a fresh client to ip, bounded by timeout. secure uses
// the talosconfig (mutual TLS); otherwise the maintenance-mode client that
// skips server verification and presents no certificate.
func (o *Ops) call(ctx context.Context, ip string, secure bool, timeout time.Duration, fn func(context.Context, *client.Client) error) error {
	opts := []client.OptionFunc{client.WithEndpoints(ip), client.WithGRPCDialOptions(dialOpts...)}
	if secure {
		opts = append(opts, client.WithConfig(o.cfg), client.WithContextName(o.context))
	} else {
		opts = append(opts, client.WithTLSConfig(&tls.Config{InsecureSkipVerify: true})) //nolint:gosec // maintenance mode has no identity to verify
	}
	c, err := client.New(ctx, opts...)
	if err != nil {
		return fmt.Errorf("creating Talos client for %s: %w", ip, err)
	}
	defer c.Close() //nolint:errcheck
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return fn(cctx, c)
}

// read is call for a read with the cluster's credentials, over a client to
// ip that is kept for the next read while its calls succeed: a run asks
// every node hundreds of questions, and a fresh connection per question
// cost a TLS handshake on both ends each time. A read that fails on a kept
// client (its connection may have died with a reboot or a reset) drops it
// and is asked once more on a fresh one, so it fails only as a read on a
// fresh connection would. Changes (apply, bootstrap, reset, upgrade) go
// through call, on a connection of their own, and are never asked twice.
func (o *Ops) read(ctx context.Context, ip string, timeout time.Duration, fn func(context.Context, *client.Client) error) error {
	for attempt := 0; ; attempt++ {
		k, reused, err := o.keptClient(ctx, ip)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		err = fn(cctx, k.c)
		cancel()
		o.release(ip, k, err != nil)
		if err == nil || !reused || attempt > 0 || ctx.Err() != nil {
			return err
		}
	}
}

// keptDialOpts are dialOpts for a kept client: its connection goes after
// 10 s without reads.
var keptDialOpts = append(slices.Clone(dialOpts), grpc.WithIdleTimeout(10*time.Second))

// keptClient returns the kept client to ip (reused: true), or a new one
// that is kept from now on.
func (o *Ops) keptClient(ctx context.Context, ip string) (k *keptClient, reused bool, err error) {
	o.keptMu.Lock()
	defer o.keptMu.Unlock()
	if k := o.kept[ip]; k != nil {
		k.refs++
		return k, true, nil
	}
	// client.New only prepares the connection (grpc.NewClient): the dial
	// happens with the first call, outside the lock. A kept client unused
	// for a while lets its connection go (it dials again on the next
	// read), so one kept past its cluster's life does not keep dialing.
	c, err := client.New(ctx, client.WithEndpoints(ip), client.WithGRPCDialOptions(keptDialOpts...),
		client.WithConfig(o.cfg), client.WithContextName(o.context))
	if err != nil {
		return nil, false, fmt.Errorf("creating Talos client for %s: %w", ip, err)
	}
	if o.kept == nil {
		o.kept = map[string]*keptClient{}
	}
	k = &keptClient{c: c, refs: 1}
	o.kept[ip] = k
	return k, false, nil
}

// release ends one read on k; a failed one drops k, which is closed when
// the last read on it ends.
func (o *Ops) release(ip string, k *keptClient, failed bool) {
	o.keptMu.Lock()
	defer o.keptMu.Unlock()
	k.refs--
	if failed && !k.dropped {
		k.dropped = true
		if o.kept[ip] == k {
			delete(o.kept, ip)
		}
	}
	if k.dropped && k.refs == 0 {
		k.c.Close() //nolint:errcheck
	}
}

// callRetrying is read for a single read a stage cannot do without: a
// refused or cut connection, or a node not ready for the request yet
// (retryableCall), is retried with backoff (internal/retry's default: 5
// attempts over ~4 s), so one connection drop does not fail the stage.
func (o *Ops) callRetrying(ctx context.Context, ip, what string, fn func(context.Context, *client.Client) error) error {
	return retry.Named(ctx, retry.Policy{}, o.opts.Log, what, func(ctx context.Context) error {
		return retryableCall(o.read(ctx, ip, o.opts.CallTimeout, fn))
	})
}

// NodeMode is what a probe found at a node's address.
type NodeMode int

// Node modes.
const (
	// ModeDown: nothing answers (booting, installing, rebooting, off).
	ModeDown NodeMode = iota
	// ModeMaintenance: Talos runs from the ISO without a config.
	ModeMaintenance
	// ModeConfigured: configured with this cluster's CA.
	ModeConfigured
	// ModeForeign: configured with another CA (another cluster).
	ModeForeign
)

// String names the mode.
func (m NodeMode) String() string {
	switch m {
	case ModeDown:
		return "down"
	case ModeMaintenance:
		return "maintenance"
	case ModeConfigured:
		return "configured"
	case ModeForeign:
		return "foreign"
	}
	return fmt.Sprintf("NodeMode(%d)", int(m))
}

// Probe is the result of probing one node.
type Probe struct {
	Mode NodeMode
	// Version is the Talos version tag the node reports (when reachable).
	Version string
	// Detail says why a node was classified down (the last error).
	Detail string
}

// Probe classifies the node at ip by how its API answers: with the
// cluster's credentials (configured), without credentials (maintenance),
// refusing credentials-less clients while not trusting ours (another
// cluster), or not at all (down). Errors are returned only when the answer
// fits none of these.
func (o *Ops) Probe(ctx context.Context, ip string) (Probe, error) {
	return classifyProbe(ip, func(secure bool) (string, error) {
		var version string
		ask := func(ctx context.Context, c *client.Client) error {
			resp, err := c.Version(ctx)
			if err == nil {
				version = versionTag(resp.GetMessages())
			}
			return err
		}
		if secure {
			return version, o.read(ctx, ip, o.opts.CallTimeout, ask)
		}
		return version, o.call(ctx, ip, false, o.opts.CallTimeout, ask)
	})
}

// ProbeAll probes every target at once. A probe that failed is left out
// of the map, its error under the same name in errs.
func (o *Ops) ProbeAll(ctx context.Context, targets []Target) (probes map[string]Probe, errs map[string]error) {
	probes, errs = map[string]Probe{}, map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, t := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := o.Probe(ctx, t.IP)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[t.Name] = err
				return
			}
			probes[t.Name] = p
		}()
	}
	wg.Wait()
	return probes, errs
}

// classifyProbe is Probe's logic over ask, one Version call with (secure)
// or without the cluster's credentials.
func classifyProbe(ip string, ask func(secure bool) (string, error)) (Probe, error) {
	version, err := ask(true)
	if err == nil {
		return Probe{Mode: ModeConfigured, Version: version}, nil
	}
	if isDown(err) {
		return Probe{Mode: ModeDown, Detail: shortErr(err)}, nil
	}
	if !isUntrustedServer(err) {
		return Probe{}, fmt.Errorf("probing Talos API at %s: %w", ip, err)
	}
	// A server that demands a client certificate may close the connection
	// before its "certificate required" alert is read (broken pipe,
	// reset); ask again before calling the node down.
	var ierr error
	for attempt := 0; attempt < 3; attempt++ {
		version, ierr = ask(false)
		if ierr == nil || isCertRequired(ierr) || strings.Contains(ierr.Error(), "connection refused") {
			break
		}
	}
	switch {
	case ierr == nil:
		return Probe{Mode: ModeMaintenance, Version: version}, nil
	case isCertRequired(ierr):
		// The two answers may come from two servers: right after a
		// config is applied a node stops its maintenance service and
		// starts apid with the cluster's CA, and a probe whose first
		// call met the one and second met the other would take this
		// cluster's node for another cluster's. Another cluster's node
		// still does not trust us when asked again.
		if version, err := ask(true); err == nil {
			return Probe{Mode: ModeConfigured, Version: version}, nil
		} else if isDown(err) {
			return Probe{Mode: ModeDown, Detail: shortErr(err)}, nil
		}
		return Probe{Mode: ModeForeign}, nil
	case isDown(ierr):
		return Probe{Mode: ModeDown, Detail: shortErr(ierr)}, nil
	}
	return Probe{}, fmt.Errorf("probing Talos API at %s in maintenance mode: %w", ip, ierr)
}

func versionTag[T interface{ GetVersion() V }, V interface{ GetTag() string }](msgs []T) string {
	for _, m := range msgs {
		return m.GetVersion().GetTag()
	}
	return ""
}

// ForeignNodeError reports a node configured by another cluster.
type ForeignNodeError struct {
	Name, IP    string
	SecretsPath string
}

// Error says which node, why it is refused and how to recover.
func (e *ForeignNodeError) Error() string {
	return fmt.Sprintf("node %s (%s) is configured by another Talos cluster: its API certificate is not signed by "+
		"this cluster's CA (%s) and it rejects unauthenticated clients. Refusing to touch it. If it should join this "+
		"cluster, wipe it with that cluster's talosconfig (talosctl reset --graceful=false --reboot -n %s -e %s) or "+
		"boot the VM from the Talos ISO again so it comes up in maintenance mode; if this cluster's secrets bundle "+
		"was regenerated, restore the original %s from backup instead",
		e.Name, e.IP, e.SecretsPath, e.IP, e.IP, e.SecretsPath)
}

// isDown: nothing usable answered (refused, reset, timed out, EOF).
func isDown(err error) bool {
	if err == nil || isUntrustedServer(err) || isCertRequired(err) {
		return false
	}
	switch client.StatusCode(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// notSent: the call failed while connecting, so the request never
// reached the node.
func notSent(err error) bool {
	if client.StatusCode(err) != codes.Unavailable {
		return false
	}
	s := err.Error()
	return strings.Contains(s, "connection refused") || strings.Contains(s, "no route to host") || strings.Contains(s, "network is unreachable")
}

// isUntrustedServer: the node's certificate is not from our CA (a
// maintenance node's self-signed one, or another cluster's).
func isUntrustedServer(err error) bool {
	s := err.Error()
	return strings.Contains(s, "certificate signed by unknown authority") ||
		strings.Contains(s, "x509: certificate is not valid") ||
		strings.Contains(s, "certificate is valid for")
}

// isCertRequired: the node demands a client certificate (configured mode).
func isCertRequired(err error) bool {
	s := err.Error()
	return strings.Contains(s, "certificate required") || strings.Contains(s, "bad certificate")
}

func shortErr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, "desc = "); i >= 0 {
		s = s[i+len("desc = "):]
	}
	return s
}

// retryableCall marks the transient failures of a single call: node not
// reachable yet (Unavailable, deadline) or not ready for the request yet
// (FailedPrecondition). TLS trust failures are never retried.
func retryableCall(err error) error {
	if err == nil {
		return nil
	}
	if isUntrustedServer(err) || isCertRequired(err) {
		return err
	}
	switch client.StatusCode(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.FailedPrecondition:
		return retry.Retryable(err)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return retry.Retryable(err)
	}
	return err
}
