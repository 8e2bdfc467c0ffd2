package ganesha

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRpcbindNamesWhatHoldsPort111: while a connection holds local TCP
// port 111, rpcbind starts, runs and never listens there (it only warns to
// syslog). Start must say so at once, naming the connection and its
// process, instead of waiting out its bound for a port that cannot open.
func TestRpcbindNamesWhatHoldsPort111(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: no real NFS server")
	}
	if !Available() || os.Geteuid() != 0 {
		if os.Getenv("BOOTSTRAP_REQUIRE_LAB") == "1" {
			t.Fatalf("needs root and %v", ErrNotInstalled)
		}
		t.Skipf("needs root and %v", ErrNotInstalled)
	}
	if portOpen("127.0.0.1:111") {
		t.Skip("a portmapper already listens on :111")
	}
	// A connection from local port 111, as a client binding a random
	// reserved port may make.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 111}, Timeout: time.Second}
	conn, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Skipf("cannot hold port 111 for the test: %v", err)
	}
	defer conn.Close()
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	srv, err := Start(ctx, t.TempDir(), []Export{{Pseudo: "/export/k8s", Dir: t.TempDir()}})
	if err == nil {
		srv.Stop()
		t.Fatal("ganesha started while port 111 was held")
	}
	took := time.Since(start)
	want := fmt.Sprintf("127.0.0.1:111 → %s ESTABLISHED (pid %d", ln.Addr(), syscall.Getpid())
	if !strings.Contains(err.Error(), "cannot listen on TCP port 111") || !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name the holder (want %q)", err, want)
	}
	if took > 5*time.Second {
		t.Errorf("Start took %s to give up", took)
	}
	if portOpen("127.0.0.1:111") {
		t.Error("something listens on :111 after the failed start")
	}
}
