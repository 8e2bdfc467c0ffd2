package talos

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/lab/talossim"
)

// Which path a node's Talos takes: talosctl's talosUpgradeAPIVersionRange
// (">1.13.0-alpha.2 <2.0.0", upgrade.go at v1.14.0-rc.1).
func TestUpgradesThroughLifecycle(t *testing.T) {
	for v, want := range map[string]bool{
		"v1.12.6": false, "v1.13.0-alpha.2": false, "v1.13.0-beta.0": true, "v1.13.0": true,
		"v1.13.3": true, "v1.14.1": true, "v2.0.0": false, "": false, "nonsense": false,
	} {
		if got := UpgradesThroughLifecycle(v); got != want {
			t.Errorf("UpgradesThroughLifecycle(%q) = %v, want %v", v, got, want)
		}
	}
}

// lifecycleNode is a converged one-node v1.13 cluster and the step that
// upgrades its node to v1.13.11.
func lifecycleNode(t *testing.T) (*harness, context.Context, *talossim.Node, UpgradeStep) {
	t.Helper()
	h := newHarness(t, harnessOptions{controlPlanes: 1})
	ctx := testCtx(t)
	if _, err := h.converge(ctx, Execute); err != nil {
		t.Fatal(err)
	}
	cp := h.node("cp-1")
	return h, ctx, cp, UpgradeStep{Target: h.targets()[0], From: cp.Version(), To: "v1.13.11", Pos: 1, Of: 1}
}

// A v1.13 node is upgraded as talosctl v1.13+ does it: the installer
// pulled into its system containerd, LifecycleService.Upgrade running it
// beside the running node, then a Reboot this tool asks. The legacy
// MachineService.Upgrade is not called.
func TestLifecycleUpgrade(t *testing.T) {
	t.Parallel()
	h, ctx, cp, step := lifecycleNode(t)
	before := cp.Counters()
	if err := h.ops.upgradeOne(ctx, RollOutOptions{Steps: []UpgradeStep{step}, Image: "ghcr.io/siderolabs/installer:v1.13.11", Mutate: Execute, Health: h.health()}, step); err != nil {
		t.Fatal(err)
	}
	c := cp.Counters()
	if cp.Version() != "v1.13.11" || c.LifecycleUpgrades-before.LifecycleUpgrades != 1 || c.UpgradeCalls-before.UpgradeCalls != 1 ||
		c.ImagePulls-before.ImagePulls != 1 || c.RebootCalls-before.RebootCalls != 1 || c.Reboots-before.Reboots != 1 || c.Upgrades-before.Upgrades != 1 {
		t.Fatalf("cp-1 after its upgrade: %s, %+v (before %+v)", cp.Version(), c, before)
	}
	// Done: a second ask changes nothing.
	if err := h.ops.upgradeOne(ctx, RollOutOptions{Steps: []UpgradeStep{step}, Image: "ghcr.io/siderolabs/installer:v1.13.11", Mutate: Execute, Health: h.health()}, step); err != nil {
		t.Fatal(err)
	}
	if again := cp.Counters(); again.UpgradeCalls != c.UpgradeCalls || again.Reboots != c.Reboots {
		t.Fatalf("a done upgrade was asked again: %+v", again)
	}
}

// An installer that fails under the LifecycleService changes nothing: the
// call streams its exit code, the node keeps running its Talos and is
// neither drained nor rebooted; the error quotes the installer and says
// so, without asking the user for a reboot. The pull failing is the same.
// The next run, the cause gone, upgrades it.
func TestLifecycleInstallerFails(t *testing.T) {
	t.Parallel()
	h, ctx, cp, step := lifecycleNode(t)
	before := cp.Counters()
	opts := RollOutOptions{Steps: []UpgradeStep{step}, Image: "ghcr.io/siderolabs/installer:v1.13.11", Mutate: Execute, Health: h.health()}

	cp.SetFaults(talossim.Faults{UpgradeSequenceFails: 1})
	start := time.Now()
	err := h.ops.upgradeOne(ctx, opts, step)
	var ie *InstallerFailedError
	if !errors.As(err, &ie) || ie.ExitCode != 1 || time.Since(start) > 15*time.Second {
		t.Fatalf("after %s: %v", time.Since(start).Round(time.Millisecond), err)
	}
	for _, w := range []string{"upgrading cp-1", "to Talos v1.13.11: its installer exited with code 1", "(injected) failed to install bootloader",
		"neither drained nor rebooted and runs Talos " + step.From + " as before", "A re-run asks the same upgrade again", "the rollout stopped at cp-1 (1/1)"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("the error does not say %q: %v", w, err)
		}
	}
	if strings.Contains(err.Error(), "talosctl") || strings.Contains(err.Error(), "reboot it") {
		t.Errorf("the error asks the user for a command: %v", err)
	}
	c := cp.Counters()
	if cp.Version() != step.From || c.Reboots != before.Reboots || c.RebootCalls != before.RebootCalls || c.FailedUpgrades != before.FailedUpgrades+1 ||
		h.sim.InstalledVersion(cp.IP()) != step.From {
		t.Fatalf("cp-1 after its failed installer: %s (disk %s), %+v", cp.Version(), h.sim.InstalledVersion(cp.IP()), c)
	}

	cp.SetFaults(talossim.Faults{UpgradePullFails: 1})
	err = h.ops.upgradeOne(ctx, opts, step)
	if err == nil || !strings.Contains(err.Error(), "pulling the installer ghcr.io/siderolabs/installer:v1.13.11 on cp-1") || !strings.Contains(err.Error(), "NotFound") {
		t.Fatalf("pull failure: %v", err)
	}
	if c2 := cp.Counters(); c2.UpgradeCalls != c.UpgradeCalls || c2.Reboots != c.Reboots {
		t.Fatalf("a failed pull went on: %+v", c2)
	}

	if err := h.ops.upgradeOne(ctx, opts, step); err != nil {
		t.Fatal(err)
	}
	if cp.Version() != "v1.13.11" {
		t.Fatalf("after the cause was gone: %s", cp.Version())
	}
}

// The cordon is marked, so only what this tool cordoned is uncordoned: a
// Node the user cordoned stays so, as Talos's own cordons do
// (NodeApplyController.ApplyCordoned).
func TestCordonOnlyWhatWeCordoned(t *testing.T) {
	ctx := context.Background()
	kc := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "wk-1"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "wk-2"}, Spec: corev1.NodeSpec{Unschedulable: true}},
	)
	o := &Ops{opts: OpsOptions{Log: zerolog.Nop()}}
	get := func(name string) *corev1.Node {
		n, err := kc.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, name := range []string{"wk-1", "wk-2"} {
		if err := cordon(ctx, kc, get(name)); err != nil {
			t.Fatal(err)
		}
	}
	if n := get("wk-1"); !n.Spec.Unschedulable || n.Annotations[AnnotationCordoned] == "" {
		t.Fatalf("wk-1 after the cordon: %v %v", n.Spec.Unschedulable, n.Annotations)
	}
	if n := get("wk-2"); !n.Spec.Unschedulable || n.Annotations[AnnotationCordoned] != "" {
		t.Fatalf("wk-2, cordoned by its user, was marked: %v", n.Annotations)
	}
	// A second cordon (a killed run's re-run) keeps the mark.
	if err := cordon(ctx, kc, get("wk-1")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"wk-1", "wk-2", "gone"} {
		if err := o.uncordon(ctx, kc, name); err != nil {
			t.Fatal(err)
		}
	}
	if n := get("wk-1"); n.Spec.Unschedulable || n.Annotations[AnnotationCordoned] != "" {
		t.Fatalf("wk-1 after the uncordon: %v %v", n.Spec.Unschedulable, n.Annotations)
	}
	if n := get("wk-2"); !n.Spec.Unschedulable {
		t.Fatal("wk-2, cordoned by its user, was uncordoned")
	}
}

// A drain that runs out of time names the pods it left and their state:
// kubectl's drain library says only that its timeout was reached.
func TestFailedDrainNamesThePodsLeft(t *testing.T) {
	ctx := context.Background()
	running := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "apps"},
			Spec: corev1.PodSpec{NodeName: "wk-1"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}
	}
	kc := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "wk-1"}}, running("stuck"))
	// The core group without the eviction subresource: pods are deleted,
	// and a kubelet that never finishes the deletion keeps them.
	kc.Resources = []*metav1.APIResourceList{{GroupVersion: "v1", APIResources: []metav1.APIResource{{Name: "pods", Namespaced: true, Kind: "Pod"}}}}
	kc.PrependReactor("delete", "pods", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, nil })
	o := &Ops{opts: OpsOptions{Log: zerolog.Nop(), DrainTimeout: 2 * time.Second}}
	err := o.cordonAndDrain(ctx, kc, "wk-1")
	if err == nil || !strings.Contains(err.Error(), "draining the Kubernetes node wk-1 (at most 2s)") ||
		!strings.Contains(err.Error(), "still there: apps/stuck (Running)") {
		t.Fatalf("a drain that timed out: %v", err)
	}
}

// A rollback is a node on its old Talos under a new boot; a version read
// across a reboot says nothing. The interleaving a loaded host produced:
// the wait read the old version just before the node rebooted into the
// new one, then the new boot time; read again between two boot times, the
// node runs the new version.
func TestRolledBackSinceNeedsOneBoot(t *testing.T) {
	const before, after = 100, 200
	for _, tc := range []struct {
		name     string
		bt1      uint64
		version  string
		bt2      uint64
		rolledBk bool
	}{
		{"old Talos under a new boot", after, "v1.13.3", after, true},
		{"new Talos under a new boot", after, "v1.13.4", after, false},
		{"old Talos, not rebooted yet", before, "v1.13.3", before, false},
		{"read across the reboot", before, "v1.13.3", after, false},
		{"no boot time", 0, "v1.13.3", 0, false},
	} {
		got, err := rolledBackSince("v1.13.3", before, func() (uint64, string, uint64, error) { return tc.bt1, tc.version, tc.bt2, nil })
		if err != nil || got != tc.rolledBk {
			t.Errorf("%s: rolled back %v (%v), want %v", tc.name, got, err, tc.rolledBk)
		}
	}
}
