package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/homelab/bootstrap/backup"
	"github.com/homelab/bootstrap/e2e"
)

// createConfigMap writes one ConfigMap into the lab's running cluster.
func createConfigMap(t *testing.T, ctx context.Context, h *e2e.Harness, namespace, name string, data map[string]string) {
	t.Helper()
	kc, err := h.Lab.Kube.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Data: data}
	if _, err := kc.Client().CoreV1().ConfigMaps(namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// drillObjects writes the objects a restore must bring back: a Namespace
// with three ConfigMaps.
func drillObjects(t *testing.T, ctx context.Context, h *e2e.Harness) {
	t.Helper()
	kc, err := h.Lab.Kube.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kc.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "drill"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		createConfigMap(t, ctx, h, "drill", fmt.Sprintf("cm-%d", i), map[string]string{"n": fmt.Sprint(i)})
	}
}

// checkDrillObjects finds exactly the snapshot's ConfigMaps in the
// restored cluster (a new control plane on the restored etcd).
func checkDrillObjects(t *testing.T, ctx context.Context, h *e2e.Harness) {
	t.Helper()
	kc, err := h.Lab.Kube.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	list, err := kc.Client().CoreV1().ConfigMaps("drill").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, cm := range list.Items {
		if cm.Name == "kube-root-ca.crt" {
			continue
		}
		names = append(names, cm.Name+"="+cm.Data["n"])
	}
	slices.Sort(names)
	if want := []string{"cm-1=1", "cm-2=2", "cm-3=3"}; !slices.Equal(names, want) {
		t.Fatalf("restored ConfigMaps %v, want %v", names, want)
	}
}

// drilledLab is a converged lab of controlPlanes control planes holding
// the drill's objects, and the path of a snapshot taken with them.
func drilledLab(t *testing.T, ctx context.Context, controlPlanes int) (*e2e.Harness, string) {
	t.Helper()
	h := startHarness(t, e2e.Options{ControlPlanes: controlPlanes})
	if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
		t.Fatalf("pipeline:\n%s", r.Tail(40))
	}
	drillObjects(t, ctx, h)
	return h, backupNow(t, ctx, h)
}

// backupNow takes a snapshot with `bootstrap backup` and returns its path.
func backupNow(t *testing.T, ctx context.Context, h *e2e.Harness) string {
	t.Helper()
	if r := run(t, ctx, h, "backup"); r.ExitCode != 0 {
		t.Fatalf("backup:\n%s", r.Tail(20))
	}
	path, _, err := backup.Newest(filepath.Join(h.Paths().StateDir, "etcd"))
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// loseTheCluster deletes every VM with its disks (etcd's data goes with
// the control planes') and creates them again: fresh VMs in maintenance
// mode, as after a lost host disk.
func loseTheCluster(t *testing.T, ctx context.Context, h *e2e.Harness) {
	t.Helper()
	if r := run(t, ctx, h, "destroy", "--yes"); r.ExitCode != 0 {
		t.Fatalf("destroy:\n%s", r.Tail(20))
	}
	if _, err := h.Lab.Kube.Cluster(); err == nil {
		t.Fatal("the control plane still runs after every control plane VM was destroyed with its disk")
	}
	if r := run(t, ctx, h, "run", "--stage", "provision"); r.ExitCode != 0 {
		t.Fatalf("provision again:\n%s", r.Tail(20))
	}
}

// TestRestoreDrill: a converged 3-control-plane lab with a Namespace and
// ConfigMaps is backed up, one more ConfigMap is written, then every VM is
// destroyed with its disks and provisioned again. A talos run refuses to
// bootstrap an empty etcd over the lost one; a corrupted snapshot and a
// restore onto a running etcd are refused with exit 2 before any change;
// the dry run plans the recovery without uploading; `bootstrap restore
// --node cp-2` uploads the snapshot to cp-2 only (--node of no control
// plane exits 2), the real etcd is restored with
// etcdutl and the real control plane started on it, the other control
// planes join, and exactly the snapshot's objects are back; postcheck green.
// Then over the running etcd: refused without --force, and with it the
// control planes' etcd data is wiped and the snapshot restored again.
func TestRestoreDrill(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 6*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 3, VIP: true})
	if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
		t.Fatalf("pipeline:\n%s", r.Tail(40))
	}
	drillObjects(t, ctx, h)
	snap := backupNow(t, ctx, h)
	createConfigMap(t, ctx, h, "drill", "after-backup", nil) // not in the snapshot

	// Refused before anything is touched: a flipped byte, and a cluster
	// whose etcd runs.
	corrupt := filepath.Join(t.TempDir(), "corrupt.snapshot")
	b, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x01
	if err := os.WriteFile(corrupt, b, 0o600); err != nil {
		t.Fatal(err)
	}
	before := counters(t, ctx, h)
	bad := run(t, ctx, h, "restore", "--from", corrupt)
	if bad.ExitCode != 2 || !strings.Contains(bad.Stderr, "corrupted") || !strings.Contains(bad.Stderr, "nothing was touched") {
		t.Fatalf("corrupted snapshot: exit %d\n%s", bad.ExitCode, bad.Tail(10))
	}
	if after := counters(t, ctx, h); after.TalosCalls != before.TalosCalls || after.ProxmoxCalls != before.ProxmoxCalls {
		t.Fatalf("a corrupted snapshot made %d Talos and %d Proxmox calls", after.TalosCalls-before.TalosCalls, after.ProxmoxCalls-before.ProxmoxCalls)
	}
	busy := run(t, ctx, h, "restore", "--from", snap)
	if busy.ExitCode != 2 || !strings.Contains(busy.Stdout+busy.Stderr, "would replace it and lose every change written since then") {
		t.Fatalf("restore onto a running etcd: exit %d\n%s", busy.ExitCode, busy.Tail(10))
	}
	for _, n := range h.Lab.Talos.Nodes() {
		if c := n.Counters(); c.RecoverUploads+c.Recoveries != 0 {
			t.Fatalf("a refused restore uploaded to %s", n.IP())
		}
	}

	loseTheCluster(t, ctx, h)
	bootstraps := h.Lab.Talos.Bootstraps()
	lost := run(t, ctx, h, "run", "--stage", "talos")
	if lost.ExitCode == 0 || !strings.Contains(lost.Stdout+lost.Stderr, "bootstrap restore --from") {
		t.Fatalf("talos over a lost etcd: exit %d\n%s", lost.ExitCode, lost.Tail(20))
	}
	if h.Lab.Talos.Bootstraps() != bootstraps {
		t.Fatal("the talos stage bootstrapped an empty etcd over the lost one")
	}

	dry := run(t, ctx, h, "restore", "--from", snap, "--dry-run")
	if dry.ExitCode != 0 || !strings.Contains(dry.Stdout, "restore etcd on cp-1") {
		t.Fatalf("restore dry run:\n%s", dry.Tail(30))
	}
	if bad := run(t, ctx, h, "restore", "--from", snap, "--node", "cp-9"); bad.ExitCode != 2 || !strings.Contains(bad.Stdout+bad.Stderr, "--node cp-9 is not a control plane") {
		t.Fatalf("restore --node cp-9: exit %d\n%s", bad.ExitCode, bad.Tail(10))
	}
	// Onto another control plane than the one etcd was bootstrapped on.
	r := run(t, ctx, h, "restore", "--from", snap, "--node", "cp-2")
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, "restored etcd from") {
		t.Fatalf("restore:\n%s", r.Tail(40))
	}
	t.Logf("restore to green: %s", r.Wall.Round(100*time.Millisecond))
	for _, n := range h.Lab.Talos.Nodes() {
		c := n.Counters()
		want := 0
		if n.Hostname() == "cp-2" {
			want = 1
		}
		if c.RecoverUploads != want || c.Recoveries != want {
			t.Errorf("%s: %d uploads, %d recover bootstraps; want %d", n.Hostname(), c.RecoverUploads, c.Recoveries, want)
		}
	}
	checkDrillObjects(t, ctx, h)
	if err := h.PostcheckGreen(); err != nil {
		t.Fatal(err)
	}
	st, err := h.State()
	if err != nil || st.Outputs.Talos.Restore == nil || st.Outputs.Talos.Restore.Finished.IsZero() {
		t.Fatalf("state records no finished restore: %+v %v", st.Outputs.Talos.Restore, err)
	}
	// Converged: a full run afterwards changes nothing on the Talos side.
	if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
		t.Fatalf("run after the restore:\n%s", r.Tail(40))
	}
	if h.Lab.Talos.Bootstraps() != bootstraps+1 {
		t.Fatalf("%d bootstraps after the restore, want one (the recovery)", h.Lab.Talos.Bootstraps()-bootstraps)
	}

	// Over a running etcd: refused without --force; with it, every
	// control plane's etcd data is wiped (reset EPHEMERAL), the snapshot
	// restored, and what was written since is gone again.
	createConfigMap(t, ctx, h, "drill", "after-restore", nil)
	if again := run(t, ctx, h, "restore", "--from", snap); again.ExitCode != 2 || !strings.Contains(again.Stdout+again.Stderr, "pass --force") {
		t.Fatalf("restore over the restored etcd: exit %d\n%s", again.ExitCode, again.Tail(10))
	}
	// Without --node the restore goes where etcd last started: cp-2.
	dryForce := run(t, ctx, h, "restore", "--from", snap, "--force", "--dry-run")
	if dryForce.ExitCode != 0 || !strings.Contains(dryForce.Stdout, "would wipe etcd's data on cp-1, cp-2, cp-3") || !strings.Contains(dryForce.Stdout, "restore etcd on cp-2") {
		t.Fatalf("forced dry run:\n%s", dryForce.Tail(30))
	}
	for _, n := range h.Lab.Talos.Nodes() {
		if n.Counters().Resets != 0 {
			t.Fatalf("the dry run reset %s", n.Hostname())
		}
	}
	forced := run(t, ctx, h, "restore", "--from", snap, "--force")
	if forced.ExitCode != 0 {
		t.Fatalf("forced restore:\n%s", forced.Tail(40))
	}
	t.Logf("forced restore to green: %s", forced.Wall.Round(100*time.Millisecond))
	for _, n := range h.Lab.Talos.Nodes() {
		if c := n.Counters(); c.Resets != 1 {
			t.Errorf("%s reset %d times, want 1", n.Hostname(), c.Resets)
		}
	}
	checkDrillObjects(t, ctx, h)
	if err := h.PostcheckGreen(); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreKilled: restores of a one-node cluster killed -9 at seeded
// points of the talos stage resume with the same command until the
// objects are back and the postcheck is green; etcd is restored exactly
// once.
func TestRestoreKilled(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 6*time.Minute)
	h, snap := drilledLab(t, ctx, 1)
	rng := rand.New(rand.NewPCG(20, 20))
	var log []string
	for i := 0; i < 3; i++ {
		loseTheCluster(t, ctx, h)
		// The talos stage of a one-node restore logs about 21 progress
		// events (at debug level): configs and install (0-7), then upload
		// and recover bootstrap (8-12), then health and kubeconfig (13-20).
		// One seeded point in each window.
		window := [][2]int{{0, 8}, {8, 13}, {13, 21}}[i]
		kill := e2e.KillPoint{Stage: "talos", Event: window[0] + rng.IntN(window[1]-window[0])}
		r, err := h.RunKill(ctx, &kill, "restore", "--from", snap)
		if err != nil {
			t.Fatal(err)
		}
		entry := "finished"
		if r.Killed {
			c := h.Lab.Talos.Nodes()[0].Counters()
			entry = fmt.Sprintf("killed after talos event %d %q (%d upload(s), %d recover bootstrap(s) by then)", r.KilledAt, r.KilledEvent, c.RecoverUploads, c.Recoveries)
			if r := run(t, ctx, h, "restore", "--from", snap); r.ExitCode != 0 {
				t.Fatalf("resuming the restore (%s):\n%s", entry, r.Tail(40))
			}
		} else if r.ExitCode != 0 {
			t.Fatalf("restore:\n%s", r.Tail(40))
		}
		log = append(log, entry)
		checkDrillObjects(t, ctx, h)
		if err := h.PostcheckGreen(); err != nil {
			t.Fatalf("%s: %v", entry, err)
		}
		if n := h.Lab.Talos.Nodes()[0].Counters().Recoveries; n != 1 {
			t.Fatalf("%s: %d recover bootstraps, want 1", entry, n)
		}
	}
	t.Logf("restores: %s", strings.Join(log, "; "))
}

// TestRestoreAfterQuorumLoss: a 3-control-plane lab loses two control
// planes with their disks. The survivor's etcd service still runs, but
// etcd elects no leader: the member list (asked WithRequireLeader) fails
// and the control plane stops. Once the VMs are provisioned again,
// `bootstrap restore` refuses without --force, naming the quorum loss and
// what the survivor's data loses; with --force the survivor's etcd data
// is wiped (the re-created control planes hold none and are not reset),
// the snapshot is restored on cp-1, the others join, exactly the
// snapshot's objects are back and the postcheck is green.
func TestRestoreAfterQuorumLoss(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 6*time.Minute)
	h, snap := drilledLab(t, ctx, 3)
	createConfigMap(t, ctx, h, "drill", "after-backup", nil) // not in the snapshot

	st, err := h.State()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cp-2", "cp-3"} {
		if err := h.Lab.PVE.LoseVM(st.Outputs.Nodes[name].VMID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.Lab.Kube.Cluster(); err == nil {
		t.Fatal("the control plane still serves after etcd lost its quorum")
	}
	if r := run(t, ctx, h, "run", "--stage", "provision"); r.ExitCode != 0 {
		t.Fatalf("provision again:\n%s", r.Tail(20))
	}

	refused := run(t, ctx, h, "restore", "--from", snap)
	if out := refused.Stdout + refused.Stderr; refused.ExitCode != 2 || !strings.Contains(out, "etcd runs on cp-1 but has no leader") ||
		!strings.Contains(out, "lost quorum") || !strings.Contains(out, "pass --force") {
		t.Fatalf("restore without --force after a quorum loss: exit %d\n%s", refused.ExitCode, refused.Tail(20))
	}
	for _, n := range h.Lab.Talos.Nodes() {
		if c := n.Counters(); c.RecoverUploads+c.Recoveries+c.Resets != 0 {
			t.Fatalf("a refused restore touched %s: %+v", n.Hostname(), c)
		}
	}

	forced := run(t, ctx, h, "restore", "--from", snap, "--force")
	if forced.ExitCode != 0 || !strings.Contains(forced.Stdout, "restored etcd from") {
		t.Fatalf("forced restore after a quorum loss:\n%s", forced.Tail(40))
	}
	t.Logf("forced restore after a quorum loss to green: %s", forced.Wall.Round(100*time.Millisecond))
	for _, n := range h.Lab.Talos.Nodes() {
		want := 0
		if n.Hostname() == "cp-1" {
			want = 1
		}
		if c := n.Counters(); c.Resets != want || c.Recoveries != want {
			t.Errorf("%s: %d resets, %d recover bootstraps; want %d", n.Hostname(), c.Resets, c.Recoveries, want)
		}
	}
	checkDrillObjects(t, ctx, h)
	if err := h.PostcheckGreen(); err != nil {
		t.Fatal(err)
	}
}
