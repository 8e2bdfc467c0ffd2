package kubetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/lab/kube"
)

// A shared lab is one control plane the tests of a package use one after
// another instead of a lab each: it is started by the first test that asks
// for it and stopped when the test binary's tests are done (Main). Only
// tests that leave it as they found it, or that touch only objects of their
// own (their own namespaces and names), may share it; a test that breaks a
// lab (stops a server, a heartbeat, restores etcd) starts its own.
type shared struct {
	once sync.Once
	c    *kube.Cluster
	err  error
	log  *lockedBuffer
}

var (
	sharedMu   sync.Mutex
	sharedLabs = map[string]*shared{}
)

// Shared returns the package's shared lab named name, started with opts
// (whose empty fields get Start's defaults) by the first test asking for
// it. The asking test holds a lab slot (Slot) as it would for a lab of its
// own: the shared lab counts as load only while a test uses it. The
// package's TestMain must run its tests through Main, which stops the
// shared labs. When the test fails, the lab's log so far is printed.
func Shared(t testing.TB, name string, opts kube.Options) *kube.Cluster {
	t.Helper()
	bins := Binaries(t)
	sharedMu.Lock()
	s := sharedLabs[name]
	if s == nil {
		s = &shared{log: &lockedBuffer{}}
		sharedLabs[name] = s
	}
	sharedMu.Unlock()
	s.once.Do(func() {
		if opts.BinDir == "" {
			opts.BinDir = bins.Dir
		}
		if len(opts.PKI.CACertPEM) == 0 {
			opts.PKI = PKI(t)
		}
		if opts.Endpoint == "" {
			opts.Endpoint = "https://" + LoopbackIP() + ":6443"
		}
		opts.Log = zerolog.New(zerolog.ConsoleWriter{Out: s.log, NoColor: true}).With().Timestamp().Str("lab", name).Logger()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		s.c, s.err = kube.Start(ctx, opts)
		if s.err == nil {
			t.Logf("lab control plane (Kubernetes %s) ready at %s in %s (shared: %s)", s.c.KubernetesVersion(), s.c.Server(), s.c.StartupTime().Round(10*time.Millisecond), name)
		}
	})
	if s.c == nil {
		// s.err is nil when the test that started it stopped first.
		t.Fatalf("the shared lab %s did not start: %v", name, s.err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("shared lab %s, its log so far:\n%s\nits servers' logs:\n%s", name, s.log.String(), s.c.LogTail(80))
		}
	})
	return s.c
}

// Main runs the package's tests, then stops its shared labs; a package
// whose tests call Shared has
//
//	func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }
//
// A test binary that dies without it leaves no server behind either (the
// lab's processes die with their parent), only their temporary dirs,
// which the next lab start removes.
func Main(m *testing.M) int {
	code := m.Run()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	for name, s := range sharedLabs {
		if s.c == nil {
			continue
		}
		if err := s.c.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping the shared lab %s: %v\n", name, err)
			code = 1
		}
	}
	return code
}

// lockedBuffer is a shared lab's log: written by its servers' watchers
// and the tests, read when one fails.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
