package e2e_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/backup"
	"github.com/homelab/bootstrap/e2e"
)

// TestEtcdBackupFromTheRealEtcd: after the pipeline, `bootstrap backup`
// streams a snapshot of the lab's real etcd through the Talos API; it is
// kept 0600 and verifies with etcd's format (digest, bbolt, key bucket)
// holding the cluster's objects; the postcheck took one too and pruning
// keeps backup.keep of them. A byte flipped in a kept snapshot is caught.
func TestEtcdBackupFromTheRealEtcd(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 4*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1})
	if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
		t.Fatalf("pipeline:\n%s", r.Tail(40))
	}
	if err := h.EditConfig(func(s string) (string, error) { return s + "backup:\n  keep: 2\n", nil }); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(h.Paths().StateDir, "etcd")
	for i := 0; i < 3; i++ {
		time.Sleep(1100 * time.Millisecond) // snapshots are named by the second
		r := run(t, ctx, h, "backup")
		if r.ExitCode != 0 || !strings.Contains(r.Stdout, "verified") {
			t.Fatalf("bootstrap backup:\n%s", r.Tail(20))
		}
	}
	kept, err := backup.List(dir)
	if err != nil || len(kept) != 2 {
		t.Fatalf("kept %v %v, want the newest 2", kept, err)
	}
	info, err := backup.Verify(kept[0])
	if err != nil {
		t.Fatal(err)
	}
	// A converged cluster's etcd holds hundreds of key revisions (nodes,
	// leases, Flux objects, the NFS release...).
	if info.Revision < 100 || info.Keys < 100 {
		t.Fatalf("snapshot of the real etcd: %+v", info)
	}
	if fi, err := os.Stat(kept[0]); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v", fi, err)
	}
	t.Logf("real etcd snapshot: %s", info)
	b, _ := os.ReadFile(kept[1])
	b[4096+17] ^= 0x01
	os.WriteFile(kept[1], b, 0o600)
	if _, err := backup.Verify(kept[1]); err == nil || !strings.Contains(err.Error(), "corrupted") {
		t.Fatalf("a flipped byte: %v", err)
	}
}
