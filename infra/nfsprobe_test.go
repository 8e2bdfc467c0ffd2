package infra

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/lab/ganesha"
	labnfs "github.com/homelab/bootstrap/lab/nfs"
)

func requireGanesha(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: no real NFS server")
	}
	if ganesha.Available() && os.Geteuid() == 0 {
		return
	}
	if os.Getenv("BOOTSTRAP_REQUIRE_LAB") == "1" {
		t.Fatalf("the real-NFS tier needs root and %v", ganesha.ErrNotInstalled)
	}
	t.Skipf("skipping the real-NFS tier: needs root and %v", ganesha.ErrNotInstalled)
}

// TestProbeNFSAgainstGanesha covers every verdict against a real NFS server.
func TestProbeNFSAgainstGanesha(t *testing.T) {
	requireGanesha(t)
	dir := t.TempDir()
	open := filepath.Join(dir, "open")
	locked := filepath.Join(dir, "locked")
	for _, d := range []string{open, locked} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	srv, err := ganesha.Start(ctx, dir, []ganesha.Export{
		{Pseudo: "/export/k8s", Dir: open},
		{Pseudo: "/export/squashed", Dir: locked, RootSquash: true},
		{Pseudo: "/export/elsewhere", Dir: open, Clients: "10.9.9.9"},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	base := NFSProbeOptions{Server: "127.0.0.1", WriteTest: true, Timeout: 10 * time.Second}

	cases := []struct {
		name   string
		mod    func(*NFSProbeOptions)
		want   NFSVerdict
		detail string
	}{
		{"ok via portmapper", func(o *NFSProbeOptions) { o.Path = "/export/k8s" }, NFSOK, "writable as root"},
		{"ok with fixed ports", func(o *NFSProbeOptions) {
			o.Path, o.MountPort, o.NFSPort, o.PortmapperPort = "/export/k8s", srv.MountPort, srv.NFSPort, 1
		}, NFSOK, "writable as root"},
		{"wrong path", func(o *NFSProbeOptions) { o.Path = "/export/k9s" }, NFSNotExported, "does not export /export/k9s to this host (exports it lists for this host: /export/k8s, /export/squashed)"},
		{"root squashed", func(o *NFSProbeOptions) { o.Path = "/export/squashed" }, NFSWriteRefused, "root squashing"},
		{"squashed but write test off", func(o *NFSProbeOptions) { o.Path, o.WriteTest = "/export/squashed", false }, NFSOK, "write test off"},
		// ganesha hides exports this host may not mount from its list and
		// refuses the mount: to this host the path is not exported.
		{"exported to another host only", func(o *NFSProbeOptions) { o.Path = "/export/elsewhere" }, NFSNotExported, "does not export /export/elsewhere to this host"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			tc.mod(&o)
			r := ProbeNFS(ctx, o)
			if r.Verdict != tc.want || !strings.Contains(r.Detail, tc.detail) {
				t.Fatalf("got %s %q, want %s containing %q\nganesha log:\n%s", r.Verdict, r.Detail, tc.want, tc.detail, srv.Log())
			}
		})
	}
	leftovers, _ := filepath.Glob(filepath.Join(open, ".bootstrap-probe-*"))
	if len(leftovers) != 0 {
		t.Fatalf("write test left files: %v", leftovers)
	}
}

func listen(t *testing.T) (net.Listener, int) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, l.Addr().(*net.TCPAddr).Port
}

// TestProbeNFSUnreachableIsBounded: a server that accepts connections and
// never answers must not hold the probe past its deadline.
func TestProbeNFSUnreachableIsBounded(t *testing.T) {
	l, port := listen(t)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close() // hold it open, say nothing
		}
	}()
	start := time.Now()
	r := ProbeNFS(context.Background(), NFSProbeOptions{Server: "127.0.0.1", Path: "/x", PortmapperPort: port, Timeout: 700 * time.Millisecond})
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("probe took %s, deadline was 700ms", d)
	}
	if r.Verdict != NFSError && r.Verdict != NFSUnreachable {
		t.Fatalf("silent server: %s %s", r.Verdict, r.Detail)
	}

	// Nothing listening at all.
	_, closed := listen(t)
	l2, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := l2.Addr().(*net.TCPAddr).Port
	l2.Close()
	r = ProbeNFS(context.Background(), NFSProbeOptions{Server: "127.0.0.1", Path: "/x", PortmapperPort: dead, NFSPort: dead, Timeout: time.Second})
	if r.Verdict != NFSUnreachable || !strings.Contains(r.Detail, "127.0.0.1:"+strconv.Itoa(dead)) {
		t.Fatalf("closed port: %s %s", r.Verdict, r.Detail)
	}
	_ = closed
}

// TestProbeNFSv4Only: no portmapper, but something answers on the NFS port.
func TestProbeNFSv4Only(t *testing.T) {
	l, nfsPort := listen(t)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	l2, _ := net.Listen("tcp", "127.0.0.1:0")
	noPM := l2.Addr().(*net.TCPAddr).Port
	l2.Close()
	r := ProbeNFS(context.Background(), NFSProbeOptions{Server: "127.0.0.1", Path: "/export", PortmapperPort: noPM, NFSPort: nfsPort, Timeout: 2 * time.Second})
	if r.Verdict != NFSv4Only {
		t.Fatalf("got %s %s", r.Verdict, r.Detail)
	}
	st, reason := NFSCheck(NFSProbeOptions{Server: "127.0.0.1", Path: "/export", PortmapperPort: noPM, NFSPort: nfsPort, Timeout: 2 * time.Second}).Run(context.Background())
	if st != check.Warn || !strings.Contains(reason, "NFSv4-only") {
		t.Fatalf("check: %s %s", st, reason)
	}
}

// TestProbeNFSAgainstLabServer: the lab's go-nfs server has no portmapper
// and no export listing; with fixed ports the probe still mounts, writes
// and removes its test file, and a wrong path is refused.
func TestProbeNFSAgainstLabServer(t *testing.T) {
	srv, err := labnfs.Start(labnfs.Options{ExportPath: "/export/k8s"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	o := NFSProbeOptions{Server: srv.Host(), Path: "/export/k8s", MountPort: srv.Port(), NFSPort: srv.Port(), WriteTest: true, Timeout: 5 * time.Second}
	if r := ProbeNFS(context.Background(), o); r.Verdict != NFSOK || !strings.Contains(r.Detail, "writable as root") {
		t.Fatalf("lab server: %s %s", r.Verdict, r.Detail)
	}
	entries, _ := os.ReadDir(srv.Dir())
	if len(entries) != 0 {
		t.Fatalf("probe left files: %v", entries)
	}
	o.Path = "/export/other"
	if r := ProbeNFS(context.Background(), o); r.Verdict != NFSNotExported || !strings.Contains(r.Detail, "does not list its exports") {
		t.Fatalf("wrong path: %s %s", r.Verdict, r.Detail)
	}
}
