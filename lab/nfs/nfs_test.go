package nfs_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/lab/nfs"
)

func startServer(t *testing.T, opts nfs.Options) *nfs.Server {
	t.Helper()
	s, err := nfs.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func TestWriteReadRoundTrip(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	s := startServer(t, nfs.Options{Dir: dir})

	m, err := nfs.Dial(ctx, s.Host(), s.Port(), nfs.DefaultExportPath)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	if err := m.MkdirAll(ctx, "default-data-pvc-1234/sub", 0o777); err != nil {
		t.Fatal(err)
	}
	payload := bytes.Repeat([]byte("homelab nfs round trip\n"), 5000) // > one NFS write
	if err := m.WriteFile(ctx, "default-data-pvc-1234/sub/probe.txt", payload, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := m.ReadFile(ctx, "default-data-pvc-1234/sub/probe.txt")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("read back %d bytes, wrote %d", len(got), len(payload))
	}
	onDisk, err := os.ReadFile(filepath.Join(dir, "default-data-pvc-1234", "sub", "probe.txt"))
	if err != nil || !bytes.Equal(onDisk, payload) {
		t.Fatalf("file on the exported disk: %d bytes, err %v", len(onDisk), err)
	}
	fi, err := os.Stat(filepath.Join(dir, "default-data-pvc-1234", "sub"))
	if err != nil || fi.Mode().Perm() != 0o777 {
		t.Errorf("directory mode %v (err %v), want 0777 set over SETATTR", fi.Mode().Perm(), err)
	}

	if err := m.Rename(ctx, "default-data-pvc-1234", "archived-default-data-pvc-1234"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := m.Exists(ctx, "archived-default-data-pvc-1234/sub/probe.txt"); !ok {
		t.Error("renamed directory not found")
	}
	if err := m.RemoveAll(ctx, "archived-default-data-pvc-1234"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "archived-default-data-pvc-1234")); !os.IsNotExist(err) {
		t.Errorf("directory still on disk after RemoveAll: %v", err)
	}
	if err := m.RemoveAll(ctx, "never-existed"); err != nil {
		t.Errorf("RemoveAll of a missing path: %v", err)
	}
	if s.Mounts() != 1 {
		t.Errorf("server counted %d mounts, want 1", s.Mounts())
	}
}

func TestMountRules(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "pv-dir"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pv-dir", "hello"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, nfs.Options{Dir: dir, ExportPath: "/srv/nfs"})

	// A PV's path below the export mounts, as kubelet mounts it.
	sub, err := nfs.Dial(ctx, s.Host(), s.Port(), "/srv/nfs/pv-dir")
	if err != nil {
		t.Fatal(err)
	}
	got, err := sub.ReadFile(ctx, "hello")
	sub.Close()
	if err != nil || string(got) != "hi" {
		t.Fatalf("reading through a subdirectory mount: %q, %v", got, err)
	}

	for path, want := range map[string]string{
		"/export/k8s":        "MNT3ERR_ACCES", // not exported
		"/srv/nfs/missing":   "MNT3ERR_NOENT",
		"/srv/nfs/pv-dir/hi": "MNT3ERR_NOENT",
		"/srv/nfsother":      "MNT3ERR_ACCES",
	} {
		m, err := nfs.Dial(ctx, s.Host(), s.Port(), path)
		if err == nil {
			m.Close()
			t.Errorf("mount %s succeeded, want %s", path, want)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("mount %s: %v, want %s", path, err, want)
		}
	}
}

func TestUnreachableServerFailsFast(t *testing.T) {
	s := startServer(t, nfs.Options{})
	host, port := s.Host(), s.Port()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := nfs.Dial(context.Background(), host, port, nfs.DefaultExportPath)
	if err == nil {
		t.Fatal("dialing a closed server succeeded")
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("took %s to fail", time.Since(start))
	}
}

func TestHostPort(t *testing.T) {
	for in, want := range map[string]string{"10.0.0.5": "10.0.0.5:2049", "nas.lan": "nas.lan:2049", "127.0.0.1:3049": "127.0.0.1:3049"} {
		h, p, err := nfs.HostPort(in)
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if got := h + ":" + strconv.Itoa(p); got != want {
			t.Errorf("HostPort(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestClientLeavesReservedPortsAlone: the lab's client connects from a port
// the kernel picks, never from one below 1024. As root, an NFS client that
// binds a random port from 1-1023 (as github.com/willscott/go-nfs-client
// does) takes 111 now and then while no portmapper listens yet; rpcbind
// started afterwards then runs without its TCP listener (lab/ganesha).
func TestClientLeavesReservedPortsAlone(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the client binds reserved ports only as root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s := startServer(t, nfs.Options{Dir: t.TempDir()})
	var mounts []*nfs.Mount
	defer func() {
		for _, m := range mounts {
			m.Close()
		}
	}()
	for range 64 {
		m, err := nfs.Dial(ctx, s.Host(), s.Port(), nfs.DefaultExportPath)
		if err != nil {
			t.Fatal(err)
		}
		mounts = append(mounts, m)
	}
	// Read the source ports from the kernel's table, not from the client.
	ports := sourcePortsTo(t, s.Port())
	if len(ports) < len(mounts) {
		t.Fatalf("found %d connections to port %d in /proc/net/tcp, want %d", len(ports), s.Port(), len(mounts))
	}
	for _, p := range ports {
		if p < 1024 {
			t.Errorf("a client connection comes from port %d", p)
		}
	}
}

// sourcePortsTo lists the local ports of the TCP connections to port.
func sourcePortsTo(t *testing.T, port int) []int {
	t.Helper()
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Skipf("no /proc/net/tcp: %v", err)
	}
	var out []int
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		rp, err1 := strconv.ParseUint(f[2][strings.LastIndexByte(f[2], ':')+1:], 16, 16)
		lp, err2 := strconv.ParseUint(f[1][strings.LastIndexByte(f[1], ':')+1:], 16, 16)
		if err1 == nil && err2 == nil && int(rp) == port && f[3] == "01" {
			out = append(out, int(lp))
		}
	}
	return out
}

// Root squash: root's mount acts as the anonymous user, who may not create
// in a root-owned 0755 export, may in a 0777 one (and owns what it made);
// a withdrawn export refuses the mount. Both undo cleanly.
func TestRootSquashAndWithdrawnExport(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("root squash is about what root may do: run as root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "export")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, nfs.Options{Dir: dir})
	mkdir := func(name string) error {
		m, err := nfs.Dial(ctx, s.Host(), s.Port(), nfs.DefaultExportPath)
		if err != nil {
			return err
		}
		defer m.Close()
		return m.MkdirAll(ctx, name, 0o777)
	}
	s.SetRootSquash(true)
	if err := mkdir("pv-1"); err == nil || !strings.Contains(err.Error(), "permission denied (NFS3ERR_ACCES)") {
		t.Errorf("root squashed into a 0755 root-owned export: %v", err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := mkdir("pv-2/data"); err != nil {
		t.Fatalf("squashed into a 0777 export: %v", err)
	}
	for _, p := range []string{"pv-2", "pv-2/data"} {
		st, err := os.Stat(filepath.Join(dir, p))
		if err != nil || !strings.HasSuffix(ownerOf(st), strconv.Itoa(nfs.Anonymous)) {
			t.Errorf("%s: %v, owner %s", p, err, ownerOf(st))
		}
	}
	os.Chmod(dir, 0o755)
	s.SetRootSquash(false)
	if err := mkdir("pv-3"); err != nil {
		t.Errorf("no squash: %v", err)
	}
	s.SetExported(false)
	if err := mkdir("pv-4"); err == nil || !strings.Contains(err.Error(), "MNT3ERR_ACCES") {
		t.Errorf("withdrawn export: %v", err)
	}
	s.SetExported(true)
	if err := mkdir("pv-4"); err != nil {
		t.Errorf("exported again: %v", err)
	}
}
