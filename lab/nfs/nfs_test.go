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
