package proxmox

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/internal/wait"
)

// TalosAPIPort is the port of the Talos API, also served in maintenance mode.
const TalosAPIPort = 50000

// ProbeTLS connects to addr and completes a TLS handshake. The certificate
// is not verified: a node in maintenance mode serves a self-signed one, and
// this only asks whether the API is up (the talos stage authenticates).
func ProbeTLS(ctx context.Context, addr string) error {
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 3 * time.Second}, Config: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return conn.Close()
}

// TalosWait describes a wait for nodes' Talos APIs.
type TalosWait struct {
	// Nodes maps node name to IP address.
	Nodes map[string]string
	// Port defaults to TalosAPIPort.
	Port    int
	Timeout time.Duration
	// Interval between probes of one node (default 100ms: a probe of a
	// node still booting is a refused or unanswered connect).
	Interval time.Duration
	Log      zerolog.Logger
}

// WaitTalosAPI waits until every node's Talos API answers a TLS handshake,
// probing nodes in parallel and reporting n/m done with the pending names.
func WaitTalosAPI(ctx context.Context, w TalosWait) error {
	if w.Port == 0 {
		w.Port = TalosAPIPort
	}
	if w.Interval <= 0 {
		w.Interval = 100 * time.Millisecond
	}
	names := make([]string, 0, len(w.Nodes))
	for n := range w.Nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	what := fmt.Sprintf("Talos API on :%d of %d node(s)", w.Port, len(names))
	errs := wait.Each(ctx, w.Log, what, 5*time.Second, names, func(ctx context.Context, name string) error {
		addr := net.JoinHostPort(w.Nodes[name], strconv.Itoa(w.Port))
		return wait.Until(ctx, wait.Spec{What: fmt.Sprintf("Talos API of %s at %s", name, addr), Timeout: w.Timeout, Interval: w.Interval, Log: w.Log},
			func(ctx context.Context) (bool, string, error) {
				if err := ProbeTLS(ctx, addr); err != nil {
					return false, err.Error(), nil
				}
				return true, "TLS handshake done", nil
			})
	})
	if len(errs) > 0 {
		return fmt.Errorf("waiting for %s (%d/%d answered): %w", what, len(names)-len(errs), len(names), errors.Join(wait.Errors(errs)...))
	}
	return nil
}
