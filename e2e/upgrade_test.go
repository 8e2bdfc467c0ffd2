package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/lab/talossim"
	"github.com/homelab/bootstrap/talos"
)

// setTalosVersion rewrites cluster.talosVersion in the lab's config.
func setTalosVersion(t *testing.T, h *e2e.Harness, from, to string) {
	t.Helper()
	if err := h.EditConfig(func(s string) (string, error) {
		if !strings.Contains(s, "talosVersion: "+from+"\n") {
			return "", fmt.Errorf("the config has no talosVersion %s", from)
		}
		return strings.Replace(s, "talosVersion: "+from+"\n", "talosVersion: "+to+"\n", 1), nil
	}); err != nil {
		t.Fatal(err)
	}
}

func nodeVersions(h *e2e.Harness) (versions map[string]string, upgrades map[string]int) {
	versions, upgrades = map[string]string{}, map[string]int{}
	for _, n := range h.Lab.Talos.Nodes() {
		versions[n.IP()] = n.Version()
		upgrades[n.IP()] = n.Counters().Upgrades
	}
	return versions, upgrades
}

// TestTalosUpgrade: a cluster installed at v1.13.2 is moved to v1.13.3
// (and the one-node cluster across the minor, to v1.14.1) by editing
// cluster.talosVersion. The dry run shows the rollout (control planes
// first) and calls no Upgrade; the run upgrades every node exactly once
// with the Upgrade RPC and ends with postcheck green; going back is refused
// with exit 2 before any Talos call changes anything.
//
// Across v1.14 the configs keep the v1alpha1 form until the node runs
// v1.14 (a v1.13 node refuses every typed document: "not registered"),
// then take the typed documents, without workload isolation (the cluster
// was made on v1.13, and an upgrade changes nothing on its own).
func TestTalosUpgrade(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name               string
		controlPlanes, wks int
		vip                bool
		to                 string
	}{
		{"1cp-to-v1.14", 1, 0, false, "v1.14.1"},
		{"3cp+2w-vip", 3, 2, true, "v1.13.3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t, 6*time.Minute)
			h := startHarness(t, e2e.Options{ControlPlanes: tc.controlPlanes, Workers: tc.wks, VIP: tc.vip, TalosVersion: "v1.13.2"})
			if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
				t.Fatalf("install at v1.13.2:\n%s", r.Tail(40))
			}
			setTalosVersion(t, h, "v1.13.2", tc.to)
			crosses := strings.HasPrefix(tc.to, "v1.14")
			if tc.wks > 1 {
				// Both workers at once; the control planes still one by one.
				if err := h.EditConfig(func(s string) (string, error) {
					return strings.Replace(s, "  talosVersion: "+tc.to+"\n", "  talosVersion: "+tc.to+"\n  upgradeParallelism: 2\n", 1), nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			dry := run(t, ctx, h, "run", "--stage", "talos", "--dry-run")
			nodes := tc.controlPlanes + tc.wks
			if dry.ExitCode != 0 || !strings.Contains(dry.Stdout, fmt.Sprintf("upgrade Talos on cp-1 v1.13.2 → %s (1/%d, control planes first)", tc.to, nodes)) ||
				crosses != strings.Contains(dry.Stdout+dry.Stderr, "then apply the v1.14.1 form (typed documents) to every node") {
				t.Fatalf("dry run:\n%s", dry.Tail(40))
			}
			t.Logf("dry-run plan:\n%s", planLines(dry.Stdout))
			if _, up := nodeVersions(h); sum(up) != 0 {
				t.Fatalf("the dry run upgraded %d nodes", sum(up))
			}
			reboots := map[string]int{}
			for _, n := range h.Lab.Talos.Nodes() {
				reboots[n.IP()] = n.Counters().Reboots
			}
			kc, err := h.Lab.Kube.Cluster()
			if err != nil {
				t.Fatal(err)
			}
			// A pod no controller owns, on the last node: talosctl's drain
			// (and ours, kubectl's drain library) deletes it before the
			// node's reboot.
			last := fmt.Sprintf("cp-%d", tc.controlPlanes)
			if tc.wks > 0 {
				last = fmt.Sprintf("wk-%d", tc.wks)
			}
			bare := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bare", Namespace: "default"},
				Spec: corev1.PodSpec{NodeName: last, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
			if _, err := kc.Client().CoreV1().Pods("default").Create(ctx, bare, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			r := run(t, ctx, h, "run", "--stage", "all")
			if r.ExitCode != 0 {
				t.Fatalf("upgrade run:\n%s", r.Tail(40))
			}
			// Every node went through the LifecycleService (v1.13.2 has
			// it): drained, rebooted by the run, uncordoned.
			if _, err := kc.Client().CoreV1().Pods("default").Get(ctx, "bare", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("the pod on %s was not drained: %v", last, err)
			}
			nodeList, err := kc.Client().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range nodeList.Items {
				if _, marked := n.Annotations[talos.AnnotationCordoned]; n.Spec.Unschedulable || marked {
					t.Errorf("Node %s after the upgrade: unschedulable %v, annotations %v", n.Name, n.Spec.Unschedulable, n.Annotations)
				}
			}
			for _, n := range h.Lab.Talos.Nodes() {
				if c := n.Counters(); c.LifecycleUpgrades != 1 || c.RebootCalls < 1 {
					t.Errorf("%s was not upgraded through the LifecycleService: %+v", n.Hostname(), c)
				}
			}
			if err := h.PostcheckGreen(); err != nil {
				t.Fatalf("after the upgrade: %v", err)
			}
			versions, up := nodeVersions(h)
			for ip, v := range versions {
				if v != tc.to || up[ip] != 1 {
					t.Errorf("node %s runs %s after %d upgrades", ip, v, up[ip])
				}
			}
			if crosses {
				for _, n := range h.Lab.Talos.Nodes() {
					cfg := string(n.Config())
					if !strings.Contains(cfg, "kind: KubeletConfig") || !strings.Contains(cfg, "kind: UnattendedInstallConfig") ||
						strings.Contains(cfg, "SecurityProfileConfig") || n.Counters().Reboots != reboots[n.IP()]+1 {
						t.Errorf("%s after the upgrade to %s: typed documents %v, workload isolation %v, %d reboot(s) (want 1, the upgrade's)",
							n.Hostname(), tc.to, strings.Contains(cfg, "kind: KubeletConfig"), strings.Contains(cfg, "SecurityProfileConfig"), n.Counters().Reboots-reboots[n.IP()])
					}
				}
				if r := run(t, ctx, h, "run", "--stage", "talos", "--dry-run"); r.ExitCode != 0 || strings.Contains(r.Stdout, "would ") {
					t.Errorf("the dry run after the upgrade across v1.14 plans changes:\n%s", r.Tail(30))
				}
			}
			t.Logf("upgrade of %d node(s): %s", nodes, r.Wall.Round(100*time.Millisecond))

			setTalosVersion(t, h, tc.to, "v1.13.2")
			before := h.Lab.Talos.Nodes()[0].Counters()
			down := run(t, ctx, h, "run", "--stage", "talos")
			if down.ExitCode != 2 || !strings.Contains(down.Stdout+down.Stderr, "downgrade is refused") {
				t.Fatalf("downgrade: exit %d\n%s", down.ExitCode, down.Tail(20))
			}
			after := h.Lab.Talos.Nodes()[0].Counters()
			if after.UpgradeCalls != before.UpgradeCalls || after.Applies != before.Applies {
				t.Fatalf("a refused downgrade called Upgrade %d times and applied %d configs", after.UpgradeCalls-before.UpgradeCalls, after.Applies-before.Applies)
			}
			if tc.controlPlanes == 3 {
				failedUpgrade(t, ctx, h)
			}
		})
	}
}

// failedUpgrade: cp-2's upgrade to v1.13.4 fails in its installer. On
// v1.13 the installer runs through the LifecycleService beside the running
// node and streams its exit code (internal/app/lifecycle/lifecycle.go at
// v1.14.0-rc.1): nothing changed on cp-2, which was neither drained nor
// rebooted. The run quotes the installer, says so and stops the rollout
// there, without asking the user to reboot anything. The next run finishes
// the rollout. (The legacy path's failed sequence, which reboots the node
// by itself: TestKubernetesUpgradeAfterATalosMinor.)
func failedUpgrade(t *testing.T, ctx context.Context, h *e2e.Harness) {
	t.Helper()
	st, err := h.State()
	if err != nil {
		t.Fatal(err)
	}
	ip := st.Outputs.Nodes["cp-2"].IP
	cp2, ok := h.Lab.Talos.Node(ip)
	if !ok {
		t.Fatal("no cp-2")
	}
	cp2.SetFaults(talossim.Faults{UpgradeSequenceFails: 1})
	before, boot := cp2.Counters(), cp2.BootTime()
	setTalosVersion(t, h, "v1.13.2", "v1.13.4") // the config still names v1.13.2: its downgrade was refused
	r := run(t, ctx, h, "run", "--stage", "talos")
	if out := r.Stdout + r.Stderr; r.ExitCode != 1 || !strings.Contains(out, "its installer exited with code 1") ||
		!strings.Contains(out, "neither drained nor rebooted and runs Talos v1.13.3 as before") ||
		!strings.Contains(out, "A re-run asks the same upgrade again") ||
		!strings.Contains(out, "the rollout stopped at cp-2 (2/5)") || strings.Contains(out, "talosctl -n "+ip) {
		t.Fatalf("the failed upgrade of cp-2 (exit %d):\n%s", r.ExitCode, r.Tail(20))
	}
	if s, c := cp2.ServiceStates(), cp2.Counters(); s["etcd"] != "Running" || s["kubelet"] != "Running" || cp2.Version() != "v1.13.3" ||
		c.Reboots != before.Reboots || c.RebootCalls != before.RebootCalls || c.FailedUpgrades != before.FailedUpgrades+1 || cp2.BootTime() != boot {
		t.Fatalf("cp-2 after its failed installer: Talos %s, services %v, %+v, boot time %d (was %d)", cp2.Version(), s, c, cp2.BootTime(), boot)
	}
	if r := run(t, ctx, h, "run", "--stage", "talos"); r.ExitCode != 0 {
		t.Fatalf("the run after cp-2's failed upgrade:\n%s", r.Tail(30))
	}
	versions, _ := nodeVersions(h)
	for n, v := range versions {
		if v != "v1.13.4" {
			t.Errorf("node %s runs %s after the rollout resumed", n, v)
		}
	}
}

// TestTalosUpgradeKilled: ten upgrades of a one-node cluster in a row, each
// run killed -9 at a seeded point inside its talos stage and resumed until
// it succeeds: every node ends at each target having been rebooted into it
// exactly once (one Reboot call per target: the node runs v1.13+, so the
// run reboots it after the LifecycleService's installer), and the cluster
// is green. A run killed between the installer and the reboot runs the
// installer again on resume, as talosctl would: the node still runs the
// old Talos, and which Talos its disk holds is not asked. The sixth crosses into v1.14
// (its run has two passes, the v1.13 form then the typed documents, and
// it is killed in the second), and the last four upgrade a node whose
// config keeps the installer in UnattendedInstallConfig.
func TestTalosUpgradeKilled(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 8*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1, TalosVersion: "v1.13.2"})
	if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
		t.Fatalf("install:\n%s", r.Tail(40))
	}
	rng := rand.New(rand.NewPCG(19, 19))
	from := "v1.13.2"
	var log []string
	installs := 0 // installer runs allowed so far: one per target, one more per kill
	for i := 0; i < 10; i++ {
		to := fmt.Sprintf("v1.13.%d", 3+i)
		if i >= 5 {
			to = fmt.Sprintf("v1.14.%d", i-5)
		}
		setTalosVersion(t, h, from, to)
		kill := e2e.KillPoint{Stage: "talos", Event: rng.IntN(talosUpgradeEvents)}
		if i == 5 {
			kill.Event += talosUpgradeEvents // after the upgrade: in the typed documents' pass
		}
		r, err := h.RunKill(ctx, &kill, "run", "--stage", "talos")
		if err != nil {
			t.Fatal(err)
		}
		entry := fmt.Sprintf("%s: finished", to)
		installs++
		if r.Killed {
			installs++
			entry = fmt.Sprintf("%s: killed after event %d %q", to, r.KilledAt, r.KilledEvent)
			if r := run(t, ctx, h, "run", "--stage", "talos"); r.ExitCode != 0 {
				t.Fatalf("resuming the upgrade to %s:\n%s", to, r.Tail(40))
			}
		} else if r.ExitCode != 0 {
			t.Fatalf("upgrade to %s:\n%s", to, r.Tail(40))
		}
		log = append(log, entry)
		for _, n := range h.Lab.Talos.Nodes() {
			if c := n.Counters(); n.Version() != to || c.RebootCalls != i+1 || c.Upgrades < i+1 || c.Upgrades > installs {
				t.Fatalf("after %s: node %s runs %s after %d reboots asked and %d installers, want %d and %d to %d (%s)",
					to, n.IP(), n.Version(), c.RebootCalls, c.Upgrades, i+1, i+1, installs, strings.Join(log, "; "))
			}
		}
		from = to
	}
	t.Logf("upgrades: %s", strings.Join(log, "; "))
	if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
		t.Fatalf("final run:\n%s", r.Tail(40))
	}
	if err := h.PostcheckGreen(); err != nil {
		t.Fatal(err)
	}
	for _, n := range h.Lab.Talos.Nodes() {
		if n.Phase() != talossim.PhaseRunning {
			t.Errorf("node %s is %s", n.IP(), n.Phase())
		}
		if cfg := string(n.Config()); !strings.Contains(cfg, "kind: UnattendedInstallConfig") || strings.Contains(cfg, "SecurityProfileConfig") {
			t.Errorf("node %s on %s does not run v1.14's form without workload isolation:\n%s", n.IP(), n.Version(), cfg)
		}
	}
}

// talosUpgradeEvents is about how many progress events (at debug level) the
// talos stage of a one-node Talos upgrade logs: 23 (header, configs, the
// applied config, etcd snapshot, the upgrade and its waits). A kill point
// past a run's last event lands on that last event.
const talosUpgradeEvents = 23

func planLines(out string) string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "upgrade Talos") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return strings.Join(lines, "\n")
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
