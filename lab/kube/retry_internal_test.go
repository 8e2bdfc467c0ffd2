package kube

import (
	"bytes"
	"context"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
)

// syncBuffer is a log sink safe for the lab's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestStartRetriesWhenAPortIsTaken(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no lab")
	}
	if _, err := LoadBinaries(""); err != nil {
		if os.Getenv("BOOTSTRAP_REQUIRE_LAB") == "1" {
			t.Fatalf("BOOTSTRAP_REQUIRE_LAB=1 but the lab is unavailable: %v", err)
		}
		t.Skipf("lab unavailable (set BOOTSTRAP_REQUIRE_LAB=1 to fail instead): %v", err)
	}
	bundle, err := secrets.NewBundle(secrets.NewClock(), config.TalosVersionCurrent)
	if err != nil {
		t.Fatal(err)
	}
	pki, err := PKIFromBundle(bundle)
	if err != nil {
		t.Fatal(err)
	}
	// Someone else holds the first port the lab picks (the API server's).
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	var once sync.Once
	pickPort = func(host string) (int, error) {
		p := 0
		once.Do(func() { p = taken.Addr().(*net.TCPAddr).Port })
		if p != 0 {
			return p, nil
		}
		return FreePort(host)
	}
	defer func() { pickPort = FreePort }()

	var logs syncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{PKI: pki, Log: zerolog.New(&logs)})
	if err != nil {
		t.Fatalf("start with a taken port: %v", err)
	}
	defer c.Stop()
	t.Logf("started in %s after a retry", c.StartupTime())
	if !strings.Contains(logs.String(), "starting again") {
		t.Errorf("no retry logged:\n%s", logs.String())
	}
	if err := c.Healthy(ctx); err != nil {
		t.Error(err)
	}
}

// TestFreePortNeverRepeats: FreePort may return the same port twice in a
// row (it closes its listener); the ports a cluster hands its servers are
// distinct all the same.
func TestFreePortNeverRepeats(t *testing.T) {
	picks := []int{41001, 41001, 41001, 41002, 41001, 41003}
	pickPort = func(string) (int, error) {
		p := picks[0]
		picks = picks[1:]
		return p, nil
	}
	defer func() { pickPort = FreePort }()
	c := &Cluster{ports: map[string]int{}}
	var got []int
	for _, name := range []string{"storage", "sc-health", "sc-metrics"} {
		p, err := c.freePort(name, "127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p)
	}
	if got[0] != 41001 || got[1] != 41002 || got[2] != 41003 {
		t.Fatalf("ports %v, want three distinct ones", got)
	}
	if c.ports["sc-health"] != 41002 {
		t.Fatalf("recorded %v", c.ports)
	}
}
