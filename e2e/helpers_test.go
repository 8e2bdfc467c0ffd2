package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/internal/testbin"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
)

// startHarness starts a lab for the test with the real binary; the lab's
// own log goes to a file that is printed (its tail) when the test fails.
// With E2E_KEEP=<dir> each test's lab directory (config, state, every
// run's output) is kept as <dir>/<test name> for a look afterwards.
func startHarness(t *testing.T, o e2e.Options) *e2e.Harness {
	t.Helper()
	bins := kubetest.Binaries(t)
	o.BinDir = bins.Dir
	// The version contract's RSA-4096 service account key costs a new
	// cluster up to seconds of one CPU (it was 42% of bootstrap's CPU in
	// a pipeline test): the tests that do not name one take ECDSA, and
	// TestPipeline keeps the default RSA a user gets.
	if o.ServiceAccountKey == "" {
		o.ServiceAccountKey = config.ServiceAccountKeyECDSA
	}
	o.Binary = testbin.Bootstrap(t)
	if o.Dir == "" {
		o.Dir = t.TempDir()
		if keep := os.Getenv("E2E_KEEP"); keep != "" {
			// Absolute: the binary runs from another directory, and a
			// relative lab path would name no config there.
			abs, err := filepath.Abs(keep)
			if err != nil {
				t.Fatal(err)
			}
			o.Dir = filepath.Join(abs, strings.ReplaceAll(t.Name(), "/", "_"))
			if err := os.RemoveAll(o.Dir); err != nil {
				t.Fatal(err)
			}
		}
	}
	logPath := filepath.Join(o.Dir, "lab.log")
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	o.Log = zerolog.New(f).With().Timestamp().Logger()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h, err := e2e.Start(ctx, o)
	if err != nil {
		f.Close()
		t.Fatalf("starting the lab: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("lab log (last 40 lines of %s):\n%s", logPath, lastLines(string(b), 40))
			if kc, err := h.Lab.Kube.Cluster(); err == nil {
				t.Logf("control plane logs:\n%s", kc.LogTail(15))
			}
		}
		if err := h.Stop(); err != nil {
			t.Errorf("stopping the lab: %v", err)
		}
		if left := h.Leftovers(); len(left) > 0 {
			t.Errorf("processes left running after the lab stopped:\n  %s", strings.Join(left, "\n  "))
		}
		f.Close()
	})
	return h
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// run runs the binary and fails the test when it cannot be started.
func run(t *testing.T, ctx context.Context, h *e2e.Harness, args ...string) *e2e.Result {
	t.Helper()
	r, err := h.Run(ctx, args...)
	if err != nil {
		t.Fatalf("bootstrap %v: %v", args, err)
	}
	return r
}

// counters reads the lab's counters or fails the test.
func counters(t *testing.T, ctx context.Context, h *e2e.Harness) e2e.Counters {
	t.Helper()
	c, err := h.Counters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testContext bounds a test.
func testContext(t *testing.T, d time.Duration) context.Context {
	// The budget starts once the test holds its lab slot: a wait for one
	// (other tests run their labs) must not eat the test's own time.
	kubetest.Binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
