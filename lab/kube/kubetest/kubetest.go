// Package kubetest starts the lab control plane for tests: it skips (or,
// with BOOTSTRAP_REQUIRE_LAB=1, fails) when the lab binaries are not built,
// prints the servers' logs when a test fails, and always stops the lab.
package kubetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"

	"github.com/homelab/bootstrap/lab/kube"
)

// RequireEnv, set to 1, turns a missing lab into a test failure (CI sets it).
const RequireEnv = "BOOTSTRAP_REQUIRE_LAB"

// Binaries returns the built lab binaries, or skips the test (fails it when
// BOOTSTRAP_REQUIRE_LAB=1) with the reason they are unusable. With -short
// every test that needs the lab is skipped. Every test that needs the lab
// asks for its binaries first: the test then holds a lab slot (Slot) until
// it ends.
func Binaries(t testing.TB) *kube.Binaries {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: no lab (make test-quick runs the unit tests and one pipeline)")
	}
	b, err := kube.LoadBinaries("")
	if err != nil {
		Unavailable(t, err.Error())
	}
	Slot(t)
	return b
}

// Unavailable skips the test with reason, or fails it when
// BOOTSTRAP_REQUIRE_LAB=1.
func Unavailable(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("%s=1 but the lab is unavailable: %s", RequireEnv, reason)
	}
	t.Skipf("lab unavailable (set %s=1 to fail instead): %s", RequireEnv, reason)
}

// NewBundle generates a fresh Talos secrets bundle for the current Talos
// version contract.
func NewBundle(t testing.TB) *secrets.Bundle {
	t.Helper()
	b, err := secrets.NewBundle(secrets.NewClock(), config.TalosVersionCurrent)
	if err != nil {
		t.Fatalf("generating a Talos secrets bundle: %v", err)
	}
	return b
}

// PKI returns the Kubernetes PKI of a fresh Talos secrets bundle.
func PKI(t testing.TB) kube.PKI {
	t.Helper()
	p, err := kube.PKIFromBundle(NewBundle(t))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// LoopbackIP returns a random 127.X.Y.1 so that parallel test binaries do
// not collide on well-known ports such as 6443.
func LoopbackIP() string {
	return fmt.Sprintf("127.%d.%d.1", 1+rand.IntN(254), 1+rand.IntN(254))
}

// Logger writes zerolog lines into the test log.
func Logger(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.ConsoleWriter{Out: zerolog.TestWriter{T: t, Frame: 6}, NoColor: true}).With().Timestamp().Logger()
}

// Start runs a lab control plane for the test, logging to the test log.
// Empty fields of opts get test defaults: a fresh Talos PKI and an endpoint
// on a random loopback address. The lab is stopped when the test ends, after its
// logs were printed if the test failed.
func Start(t testing.TB, opts kube.Options) *kube.Cluster {
	t.Helper()
	bins := Binaries(t)
	if opts.BinDir == "" {
		opts.BinDir = bins.Dir
	}
	if len(opts.PKI.CACertPEM) == 0 {
		opts.PKI = PKI(t)
	}
	opts.Log = Logger(t)
	if opts.Endpoint == "" {
		opts.Endpoint = "https://" + LoopbackIP() + ":6443"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := kube.Start(ctx, opts)
	if err != nil {
		t.Fatalf("starting the lab: %v", err)
	}
	t.Logf("lab control plane (Kubernetes %s) ready at %s in %s", c.KubernetesVersion(), c.Server(), c.StartupTime().Round(10*time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("lab logs:\n%s", c.LogTail(80))
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping the lab: %v", err)
		}
	})
	return c
}

// AdminKubeconfig is the lab's admin kubeconfig, for clients that take one
// in memory.
func AdminKubeconfig(t testing.TB, c *kube.Cluster) []byte {
	t.Helper()
	data, err := os.ReadFile(c.AdminKubeconfigPath())
	if err != nil {
		t.Fatal(err)
	}
	return data
}
