package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/cli-utils/pkg/object"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/lab/talossim"
)

var kubernetesVersionLine = regexp.MustCompile(`(?m)^  kubernetesVersion: \S+\n`)

// setKubernetesVersion sets cluster.kubernetesVersion in the lab's config.
func setKubernetesVersion(t *testing.T, h *e2e.Harness, version string) {
	t.Helper()
	if err := h.EditConfig(func(s string) (string, error) {
		line := "  kubernetesVersion: " + version + "\n"
		if kubernetesVersionLine.MatchString(s) {
			return kubernetesVersionLine.ReplaceAllString(s, line), nil
		}
		i := strings.Index(s, "  talosVersion: ")
		if i < 0 {
			return "", fmt.Errorf("the config has no cluster.talosVersion to put kubernetesVersion after")
		}
		return s[:i] + line + s[i:], nil
	}); err != nil {
		t.Fatal(err)
	}
}

// kubeState is what the lab's control plane and nodes run: the real API
// server's own version, and each Node's kubelet version.
func kubeState(t *testing.T, ctx context.Context, h *e2e.Harness) (apiserver string, kubelets map[string]string) {
	t.Helper()
	kc, err := h.Lab.Kube.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	v, err := kc.Client().Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := kc.Client().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubelets = map[string]string{}
	for _, n := range nodes.Items {
		kubelets[n.Name] = n.Status.NodeInfo.KubeletVersion
	}
	return v.GitVersion, kubelets
}

// nodeNamed is the lab's Talos node with hostname name.
func nodeNamed(t *testing.T, h *e2e.Harness, name string) *talossim.Node {
	t.Helper()
	for _, n := range h.Lab.Talos.Nodes() {
		if n.Hostname() == name {
			return n
		}
	}
	t.Fatalf("no node %s in the lab", name)
	return nil
}

// addWorker adds a worker to the lab's config at the lab address ending in
// last (the control planes' subnet) and returns that address.
func addWorker(t *testing.T, h *e2e.Harness, name string, vmid int, last byte) string {
	t.Helper()
	var ip string
	if err := h.EditConfig(func(s string) (string, error) {
		m := regexp.MustCompile(`(?m)^  - \{name: cp-1, .*ip: (\d+\.\d+\.\d+)\.\d+,.*\}\n`).FindStringSubmatch(s)
		if m == nil {
			return "", fmt.Errorf("no cp-1 line in the config")
		}
		ip = fmt.Sprintf("%s.%d", m[1], last)
		line := fmt.Sprintf("  - {name: %s, role: worker, vmid: %d, ip: %s, cores: 2, memoryMiB: 2048, diskGiB: 20}\n", name, vmid, ip)
		i := strings.LastIndex(s, "\n  - {name: ")
		j := strings.Index(s[i+1:], "\n") + i + 2
		return s[:j] + line + s[j:], nil
	}); err != nil {
		t.Fatal(err)
	}
	return ip
}

// kubeProxyImage is the image the kube-proxy DaemonSet runs, once every
// node runs its current template.
func kubeProxyImage(t *testing.T, ctx context.Context, h *e2e.Harness) string {
	t.Helper()
	kc, err := h.Lab.Kube.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	ds, err := kc.Client().AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("kube-proxy: %v", err)
	}
	if ds.Status.UpdatedNumberScheduled != ds.Status.DesiredNumberScheduled || ds.Status.NumberReady != ds.Status.DesiredNumberScheduled || ds.Status.DesiredNumberScheduled == 0 {
		t.Fatalf("kube-proxy not rolled out: %+v", ds.Status)
	}
	return ds.Spec.Template.Spec.Containers[0].Image
}

// bootstrapInventory reads Talos' bootstrap manifests inventory (the
// ConfigMap kube-system/talos-bootstrap-manifests-inventory, keyed by
// cli-utils object references) and checks that every object it records
// exists with the inventory's owning-inventory annotation; CoreDNS must be
// among them.
func bootstrapInventory(t *testing.T, ctx context.Context, h *e2e.Harness) map[string]bool {
	t.Helper()
	kc, err := h.Lab.Kube.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	cm, err := kc.Client().CoreV1().ConfigMaps("kube-system").Get(ctx, "talos-bootstrap-manifests-inventory", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the bootstrap manifests' inventory: %v", err)
	}
	dyn, err := dynamic.NewForConfig(kc.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(kc.Client().Discovery()))
	out := map[string]bool{}
	for key := range cm.Data {
		ref, err := object.ParseObjMetadata(key)
		if err != nil {
			t.Fatalf("inventory key %q: %v", key, err)
		}
		m, err := mapper.RESTMapping(ref.GroupKind)
		if err != nil {
			t.Fatalf("inventory key %q: %v", key, err)
		}
		var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if ref.Namespace != "" {
			r = dyn.Resource(m.Resource).Namespace(ref.Namespace)
		}
		obj, err := r.Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the inventory records %s: %v", key, err)
		}
		if a := obj.GetAnnotations()["config.k8s.io/owning-inventory"]; a != "talos-bootstrap-manifests-inventory" {
			t.Fatalf("%s has owning-inventory %q, want talos-bootstrap-manifests-inventory", key, a)
		}
		out[key] = true
	}
	if !out["kube-system_coredns_apps_Deployment"] {
		t.Fatalf("the inventory does not record CoreDNS: %v", out)
	}
	return out
}

// disableKubeProxy patches the control planes' configs with
// cluster.proxy.disabled: their manifests no longer render kube-proxy.
func disableKubeProxy(t *testing.T, h *e2e.Harness) {
	t.Helper()
	patchControlPlanes(t, h, "no-kube-proxy.yaml", "cluster:\n  proxy:\n    disabled: true\n")
}

// patchControlPlanes writes a Talos config patch next to the lab's config
// and lists it in cluster.patches.controlplane (the lab's config has no
// patches of its own).
func patchControlPlanes(t *testing.T, h *e2e.Harness, name, patch string) {
	t.Helper()
	dir := filepath.Dir(h.ConfigPath())
	if err := os.MkdirAll(filepath.Join(dir, "patches"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "patches", name), []byte(patch), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.EditConfig(func(s string) (string, error) {
		i := strings.Index(s, "  talosVersion: ")
		if i < 0 || strings.Contains(s, "\n  patches:") {
			return "", fmt.Errorf("no cluster.talosVersion to put the patches after, or patches already")
		}
		return s[:i] + "  patches:\n    controlplane: [patches/" + name + "]\n" + s[i:], nil
	}); err != nil {
		t.Fatal(err)
	}
}

// applies counts the configs each node accepted, by IP.
func applies(h *e2e.Harness) map[string]int {
	out := map[string]int{}
	for _, n := range h.Lab.Talos.Nodes() {
		out[n.IP()] = n.Counters().Applies
	}
	return out
}

// TestKubernetesUpgrade: a cluster installed at Talos v1.13.2 and
// Kubernetes 1.35.4 (the lab's real servers of the previous minor) is
// moved to v1.13.3 and 1.36.1 by editing both versions at once. The dry
// run shows the Talos rollout and the Kubernetes plan and applies nothing;
// the run upgrades every node's Talos once, then restarts the real API
// server, controller manager and scheduler at 1.36.1 on the same etcd (a
// ConfigMap written before is read after), moves every kubelet, applies
// each Kubernetes component exactly once per node, and ends with postcheck
// green; a second run changes nothing; going back is refused with exit 2
// from what the state records, before any call.
func TestKubernetesUpgrade(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name               string
		controlPlanes, wks int
		vip                bool
	}{
		{"1cp", 1, 0, false},
		{"3cp+2w-vip", 3, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t, 6*time.Minute)
			h := startHarness(t, e2e.Options{ControlPlanes: tc.controlPlanes, Workers: tc.wks, VIP: tc.vip, TalosVersion: "v1.13.2"})
			setKubernetesVersion(t, h, "1.35.4")
			if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
				t.Fatalf("install at v1.13.2 and 1.35.4:\n%s", r.Tail(40))
			}
			api, kubelets := kubeState(t, ctx, h)
			if api != "v1.35.4" {
				t.Fatalf("the lab's API server runs %s, want v1.35.4", api)
			}
			for n, v := range kubelets {
				if v != "v1.35.4" {
					t.Fatalf("node %s reports kubelet %s, want v1.35.4", n, v)
				}
			}
			createConfigMap(t, ctx, h, "default", "before-upgrade", map[string]string{"k": "v"})
			if img := kubeProxyImage(t, ctx, h); img != "registry.k8s.io/kube-proxy:v1.35.4" {
				t.Fatalf("kube-proxy created at bootstrap runs %s", img)
			}
			if tc.controlPlanes == 1 {
				// The control plane stops rendering kube-proxy. Talos only
				// creates bootstrap objects; the run that applies the patch
				// syncs what the control planes render, without a version
				// change, and prunes kube-proxy from the cluster and the
				// inventory at once, as talosctl upgrade-k8s at the running
				// version does.
				disableKubeProxy(t, h)
				if r := run(t, ctx, h, "run", "--stage", "talos"); r.ExitCode != 0 {
					t.Fatalf("applying cluster.proxy.disabled:\n%s", r.Tail(30))
				}
				kc, err := h.Lab.Kube.Cluster()
				if err != nil {
					t.Fatal(err)
				}
				if _, err := kc.Client().AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					t.Fatalf("kube-proxy still runs after the run that disabled it: %v", err)
				}
				if inv := bootstrapInventory(t, ctx, h); inv["kube-system_kube-proxy_apps_DaemonSet"] {
					t.Fatalf("the inventory still records kube-proxy: %v", inv)
				}
			}

			setKubernetesVersion(t, h, "1.36.1")
			setTalosVersion(t, h, "v1.13.2", "v1.13.3")
			if tc.controlPlanes == 1 {
				// The nightly postcheck tells the config and the cluster apart.
				pc := run(t, ctx, h, "run", "--stage", "postcheck")
				if !strings.Contains(pc.Stdout, "the config says 1.36.1 but the API server runs 1.35.4, cp-1's kubelet runs 1.35.4") {
					t.Fatalf("postcheck before the upgrade: exit %d\n%s", pc.ExitCode, pc.Tail(30))
				}
			}
			before := applies(h)
			dry := run(t, ctx, h, "run", "--stage", "talos", "--dry-run")
			summary := fmt.Sprintf("upgrade Kubernetes 1.35.4 → 1.36.1: kube-apiserver, kube-controller-manager, kube-scheduler on %d node(s), kubelet on %d", tc.controlPlanes, tc.controlPlanes+tc.wks)
			steps := 3*tc.controlPlanes + tc.controlPlanes + tc.wks
			if dry.ExitCode != 0 || !strings.Contains(dry.Stdout, summary) || !strings.Contains(dry.Stdout, fmt.Sprintf("upgrade kube-apiserver on cp-1 1.35.4 → 1.36.1 (1/%d)", steps)) ||
				!strings.Contains(dry.Stdout, "upgrade Talos on cp-1 v1.13.2 → v1.13.3 (1/") {
				t.Fatalf("dry run:\n%s", dry.Tail(60))
			}
			if prune := regexp.MustCompile(`and prune what they no longer render: .*DaemonSet/kube-system/kube-proxy`); prune.MatchString(dry.Stdout) {
				t.Fatalf("the upgrade's dry run prunes kube-proxy, pruned by the run that disabled it:\n%s", dry.Tail(30))
			}
			t.Logf("dry-run plan:\n%s", kubePlanLines(dry.Stdout))
			if after := applies(h); fmt.Sprint(after) != fmt.Sprint(before) {
				t.Fatalf("the dry run applied configs: %v → %v", before, after)
			}
			if _, up := nodeVersions(h); sum(up) != 0 {
				t.Fatalf("the dry run upgraded %d nodes", sum(up))
			}

			// A worker joins in the same run: it must install at the
			// Kubernetes the API server runs (a kubelet newer than
			// kube-apiserver breaks the version skew policy) and move
			// with the others.
			newWorker, earlier := "", ""
			if tc.controlPlanes == 1 {
				newWorker = addWorker(t, h, "wk-9", 719, 29)
				// An image no registry serves stops the upgrade at the
				// pre-pull, before any Kubernetes component moved.
				cp := nodeNamed(t, h, "cp-1")
				cp.SetFaults(talossim.Faults{MissingImages: []string{"registry.k8s.io/kube-apiserver:v1.36.1"}})
				failed := run(t, ctx, h, "run", "--stage", "all")
				if failed.ExitCode == 0 || !strings.Contains(failed.Stdout+failed.Stderr, "pre-pulling registry.k8s.io/kube-apiserver:v1.36.1 on cp-1") {
					t.Fatalf("upgrade with an image no registry serves: exit %d\n%s", failed.ExitCode, failed.Tail(30))
				}
				earlier = failed.Stdout + failed.Stderr
				if api, _ := kubeState(t, ctx, h); api != "v1.35.4" {
					t.Fatalf("the API server moved to %s although an image could not be pulled", api)
				}
				cp.SetFaults(talossim.Faults{})
			}
			r := run(t, ctx, h, "run", "--stage", "all")
			if r.ExitCode != 0 {
				t.Fatalf("upgrade run:\n%s", r.Tail(60))
			}
			if newWorker != "" && !strings.Contains(earlier+r.Stdout+r.Stderr, "wk-9 installs at Kubernetes 1.35.4") {
				t.Errorf("the new worker was not installed at the API server's Kubernetes:\n%s", r.Tail(40))
			}
			if err := h.PostcheckGreen(); err != nil {
				t.Fatalf("after the upgrade: %v", err)
			}
			api, kubelets = kubeState(t, ctx, h)
			if api != "v1.36.1" {
				t.Fatalf("the lab's API server runs %s after the upgrade, want v1.36.1", api)
			}
			for n, v := range kubelets {
				if v != "v1.36.1" {
					t.Fatalf("node %s reports kubelet %s after the upgrade", n, v)
				}
			}
			kc, err := h.Lab.Kube.Cluster()
			if err != nil {
				t.Fatal(err)
			}
			if cm, err := kc.Client().CoreV1().ConfigMaps("default").Get(ctx, "before-upgrade", metav1.GetOptions{}); err != nil || cm.Data["k"] != "v" {
				t.Fatalf("the ConfigMap written before the upgrade: %v %v", cm, err)
			}
			// The bootstrap manifests were synced: Talos only creates them.
			// They keep Talos' inventory annotation and the inventory
			// records them; kube-proxy, no longer rendered in 1cp, is gone
			// from both.
			inv := bootstrapInventory(t, ctx, h)
			if tc.controlPlanes == 1 {
				if inv["kube-system_kube-proxy_apps_DaemonSet"] || inv["kube-system_kube-proxy__ServiceAccount"] {
					t.Fatalf("the inventory still records kube-proxy: %v", inv)
				}
				if _, err := kc.Client().AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					t.Fatalf("kube-proxy was not pruned: %v", err)
				}
			} else if img := kubeProxyImage(t, ctx, h); img != "registry.k8s.io/kube-proxy:v1.36.1" || !inv["kube-system_kube-proxy_apps_DaemonSet"] {
				t.Fatalf("after the upgrade kube-proxy runs %s, want the 1.36.1 image (inventory %v)", img, inv)
			}
			if st, err := h.State(); err != nil || st.Outputs.Talos.ManifestSync != "" {
				t.Fatalf("a manifest sync is still pending: %v %v", st.Outputs.Talos.ManifestSync, err)
			}
			after := applies(h)
			versions, up := nodeVersions(h)
			for _, n := range h.Lab.Talos.Nodes() {
				// The new install image, then one per Kubernetes component:
				// the kubelet, and on a control plane the three static pods.
				want := 2
				if strings.HasPrefix(n.Hostname(), "cp-") {
					want = 5
				}
				if got := after[n.IP()] - before[n.IP()]; got != want {
					t.Errorf("%s accepted %d config(s) during the upgrade, want %d (the install image, one per Kubernetes component)", n.Hostname(), got, want)
				}
				wantUp := 1
				if n.IP() == newWorker {
					wantUp = 0 // installed at v1.13.3
				}
				if versions[n.IP()] != "v1.13.3" || up[n.IP()] != wantUp {
					t.Errorf("%s runs Talos %s after %d upgrades", n.Hostname(), versions[n.IP()], up[n.IP()])
				}
			}
			t.Logf("Talos and Kubernetes upgrade of %d node(s): %s", tc.controlPlanes+tc.wks, r.Wall.Round(100*time.Millisecond))

			again := run(t, ctx, h, "run", "--stage", "talos")
			if again.ExitCode != 0 || fmt.Sprint(applies(h)) != fmt.Sprint(after) {
				t.Fatalf("a second run: exit %d, applies %v → %v\n%s", again.ExitCode, after, applies(h), again.Tail(20))
			}

			setKubernetesVersion(t, h, "1.35.4")
			calls := h.Lab.Talos.Nodes()[0].Counters().Calls
			down := run(t, ctx, h, "run", "--stage", "talos")
			if down.ExitCode != 2 || !strings.Contains(down.Stdout+down.Stderr, "downgrade is refused") {
				t.Fatalf("downgrade: exit %d\n%s", down.ExitCode, down.Tail(20))
			}
			if got := h.Lab.Talos.Nodes()[0].Counters().Calls; got != calls {
				t.Fatalf("a refused downgrade made %d Talos call(s)", got-calls)
			}
		})
	}
}

// TestKubernetesUpgradeKilled: ten Kubernetes upgrades of a one-node
// cluster in a row (patch releases of 1.35, then 1.36.1), each run killed
// -9 at a seeded point inside its talos stage and resumed until it
// succeeds: every component ends at each target having been applied
// exactly once per target, and the cluster is green.
func TestKubernetesUpgradeKilled(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 8*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1})
	setKubernetesVersion(t, h, "1.35.0")
	if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
		t.Fatalf("install:\n%s", r.Tail(40))
	}
	rng := rand.New(rand.NewPCG(23, 23))
	var log []string
	targets := []string{"1.35.1", "1.35.2", "1.35.3", "1.35.4", "1.35.5", "1.35.6", "1.35.7", "1.35.8", "1.35.9", "1.36.1"}
	for i, to := range targets {
		setKubernetesVersion(t, h, to)
		before := applies(h)
		kill := e2e.KillPoint{Stage: "talos", Event: rng.IntN(kubeUpgradeEvents)}
		r, err := h.RunKill(ctx, &kill, "run", "--stage", "talos")
		if err != nil {
			t.Fatal(err)
		}
		entry := fmt.Sprintf("%s: finished in %s", to, r.Wall.Round(time.Millisecond))
		if r.Killed {
			entry = fmt.Sprintf("%s: killed after event %d %q", to, r.KilledAt, r.KilledEvent)
			if r := run(t, ctx, h, "run", "--stage", "talos"); r.ExitCode != 0 {
				t.Fatalf("resuming the upgrade to %s:\n%s", to, r.Tail(40))
			}
		} else if r.ExitCode != 0 {
			t.Fatalf("upgrade to %s:\n%s", to, r.Tail(40))
		}
		log = append(log, entry)
		after := applies(h)
		for ip, n := range after {
			if n-before[ip] != 4 {
				t.Fatalf("upgrade %d to %s: node %s accepted %d configs, want 4 (one per component) (%s)", i+1, to, ip, n-before[ip], strings.Join(log, "; "))
			}
		}
		if _, kubelets := kubeState(t, ctx, h); kubelets["cp-1"] != "v"+to {
			t.Fatalf("after %s: kubelet %s", to, kubelets["cp-1"])
		}
	}
	t.Logf("upgrades: %s", strings.Join(log, "; "))
	if api, _ := kubeState(t, ctx, h); api != "v1.36.1" {
		t.Fatalf("API server %s at the end", api)
	}
	if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
		t.Fatalf("final run:\n%s", r.Tail(40))
	}
	if err := h.PostcheckGreen(); err != nil {
		t.Fatal(err)
	}
}

// kubeUpgradeEvents is about how many progress events (at debug level) the
// talos stage of a one-node Kubernetes patch upgrade logs: 31 (header,
// configs, etcd snapshot, a config apply and its wait per component…). A
// kill point past a run's last event lands on that last event.
const kubeUpgradeEvents = 31

func kubePlanLines(out string) string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "upgrade Kubernetes") || strings.Contains(l, "upgrade kube") || strings.Contains(l, "upgrade Talos") || strings.Contains(l, "etcd snapshot before upgrading") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return strings.Join(lines, "\n")
}

// dryRunThenUpgrade runs the talos stage as a dry run, hands it to check,
// requires that no node took a config from it, then runs the stage and
// requires it to succeed; it returns that run.
func dryRunThenUpgrade(t *testing.T, ctx context.Context, h *e2e.Harness, check func(dry *e2e.Result)) *e2e.Result {
	t.Helper()
	before := applies(h)
	check(run(t, ctx, h, "run", "--stage", "talos", "--dry-run"))
	if after := applies(h); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("the dry run applied configs: %v → %v", before, after)
	}
	real := run(t, ctx, h, "run", "--stage", "talos")
	if real.ExitCode != 0 {
		t.Fatalf("the upgrade failed:\n%s", real.Tail(40))
	}
	return real
}

// TestKubernetesUpgradeAfterATalosMinor: a cluster at Talos v1.12.6 and
// Kubernetes 1.35.4 is moved to Talos v1.13.3 and Kubernetes 1.36.1 in one
// edit. Talos v1.12 does not run Kubernetes 1.36 (machinery compatibility),
// but the talos stage upgrades Talos first: the dry run must plan the
// Kubernetes upgrade against the Talos the nodes will run by then (it
// refused it, judging the nodes' current v1.12.6), and the real run must
// then do both.
//
// First, the upgrade's sequence fails once: a v1.12 node has no
// LifecycleService, so it takes the legacy MachineService.Upgrade, whose
// failed sequence machined answers by reverting the bootloader and
// rebooting the node into its old Talos by itself (runEntrypoint, handle in
// internal/app/machined/main.go at v1.13.9). The run quotes the failure,
// waits for the node back on v1.12.6 and says so, asking nobody to reboot.
func TestKubernetesUpgradeAfterATalosMinor(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 6*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1, TalosVersion: "v1.12.6", KubernetesVersion: "1.35.4"})
	if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
		t.Fatalf("install at v1.12.6 and 1.35.4:\n%s", r.Tail(40))
	}
	// Talos first: each edit must leave a valid config.
	setTalosVersion(t, h, "v1.12.6", "v1.13.3")
	cp := h.Lab.Talos.Nodes()[0]
	cp.SetFaults(talossim.Faults{UpgradeSequenceFails: 1})
	before := cp.Counters()
	failed := run(t, ctx, h, "run", "--stage", "talos")
	if out := failed.Stdout + failed.Stderr; failed.ExitCode != 1 || !strings.Contains(out, "its upgrade sequence failed after the Upgrade call was accepted") ||
		!strings.Contains(out, "Talos reverted its bootloader and rebooted it, and it runs Talos v1.12.6 again") || strings.Contains(out, "talosctl -n") {
		t.Fatalf("the failed upgrade (exit %d):\n%s", failed.ExitCode, failed.Tail(20))
	}
	if c := cp.Counters(); cp.Version() != "v1.12.6" || c.Reboots != before.Reboots+1 || c.RebootCalls != before.RebootCalls || c.LifecycleUpgrades != 0 {
		t.Fatalf("cp-1 after its failed upgrade: Talos %s, %+v", cp.Version(), c)
	}
	setKubernetesVersion(t, h, "1.36.1")
	dryRunThenUpgrade(t, ctx, h, func(dry *e2e.Result) {
		if dry.ExitCode != 0 || !strings.Contains(dry.Stdout, "upgrade Talos on cp-1 v1.12.6 → v1.13.3") ||
			!strings.Contains(dry.Stdout, "upgrade kube-apiserver on cp-1 1.35.4 → 1.36.1") {
			t.Fatalf("dry run of Talos v1.13.3 with Kubernetes 1.36.1 (exit %d):\n%s", dry.ExitCode, dry.Tail(40))
		}
	})
	api, kubelets := kubeState(t, ctx, h)
	if api != "v1.36.1" || kubelets["cp-1"] != "v1.36.1" {
		t.Fatalf("after the upgrade the API server runs %s and the kubelet %s", api, kubelets["cp-1"])
	}
	if pc := run(t, ctx, h, "run", "--stage", "postcheck"); pc.ExitCode != 0 {
		t.Fatalf("postcheck after the upgrade:\n%s", pc.Tail(30))
	}
}

// TestPipelineAndKubernetesUpgradeOnTalos114: the pipeline on Talos
// v1.14.1, whose configs keep Kubernetes in typed documents (KubeletConfig,
// KubeAPIServerConfig…) and refuse the v1alpha1 fields beside them, then a
// Kubernetes upgrade 1.36.1 → 1.37.2 on it: the newest pair Talos v1.14
// runs (talos114: Kubernetes up to 1.37), on the lab's real 1.37.2 servers. The upgrade pins each
// component's image in the config it applies; pinned in .machine.kubelet
// or .cluster.apiServer, the node refuses it (talossim validates as
// machined does: V1Alpha1ConflictValidate at machinery v1.14.1).
func TestPipelineAndKubernetesUpgradeOnTalos114(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 6*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1, Workers: 1, TalosVersion: "v1.14.1", KubernetesVersion: "1.36.1"})
	if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
		t.Fatalf("install at v1.14.1 and 1.36.1:\n%s", r.Tail(40))
	}
	if v := nodeNamed(t, h, "cp-1").Version(); v != "v1.14.1" {
		t.Fatalf("cp-1 runs Talos %s, want v1.14.1", v)
	}
	setKubernetesVersion(t, h, "1.37.2")
	dryRunThenUpgrade(t, ctx, h, func(dry *e2e.Result) {
		if dry.ExitCode != 0 || !strings.Contains(dry.Stdout, "upgrade kube-apiserver on cp-1 1.36.1 → 1.37.2") {
			t.Fatalf("dry run of Kubernetes 1.37.2 on Talos v1.14.1 (exit %d):\n%s", dry.ExitCode, dry.Tail(40))
		}
	})
	api, kubelets := kubeState(t, ctx, h)
	if api != "v1.37.2" || kubelets["cp-1"] != "v1.37.2" || kubelets["wk-1"] != "v1.37.2" {
		t.Fatalf("after the upgrade the API server runs %s and the kubelets %v", api, kubelets)
	}
	if pc := run(t, ctx, h, "run", "--stage", "postcheck"); pc.ExitCode != 0 {
		t.Fatalf("postcheck after the upgrade:\n%s", pc.Tail(30))
	}
}

// TestKubernetesFirstUpgrade: a cluster at Talos v1.12.6 and Kubernetes
// 1.30.14 (the lab's real 1.30 servers) is moved to Talos v1.13.3 and
// Kubernetes 1.31.0 in one edit. Talos v1.13 does not run Kubernetes 1.30
// (machinery compatibility talos113: minimum 1.31): upgrading Talos first
// would leave the node on v1.13.3 with 1.30 images, where Talos refuses
// every config that still names one, so no component could move after.
// The dry run must plan Kubernetes first and apply nothing; the run moves
// the real servers and the kubelet to 1.31.0 on v1.12.6, then Talos, syncs
// kube-proxy to the new version and ends healthy.
//
// The lab runs only Flux v2.9.5, which needs Kubernetes 1.33 (config
// validate refuses it with 1.30), so the config names Flux v2.5.1 and the
// cluster runs every stage but flux: "healthy" is the talos stage's own
// health wait after the upgrade and the infra stage converged on 1.31.
func TestKubernetesFirstUpgrade(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 6*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1, TalosVersion: "v1.12.6", KubernetesVersion: "1.30.14", FluxVersion: "v2.5.1"})
	for _, stage := range []string{"provision", "talos", "infra"} {
		if r := run(t, ctx, h, "run", "--stage", stage); r.ExitCode != 0 {
			t.Fatalf("%s at v1.12.6 and 1.30.14:\n%s", stage, r.Tail(40))
		}
	}
	if api, _ := kubeState(t, ctx, h); api != "v1.30.14" {
		t.Fatalf("the lab's API server runs %s, want v1.30.14", api)
	}
	// Each edit must leave a valid config: Kubernetes first here too.
	setKubernetesVersion(t, h, "1.31.0")
	setTalosVersion(t, h, "v1.12.6", "v1.13.3")
	real := dryRunThenUpgrade(t, ctx, h, func(dry *e2e.Result) {
		kube := strings.Index(dry.Stdout, "upgrade kube-apiserver on cp-1 1.30.14 → 1.31.0")
		talos := strings.Index(dry.Stdout, "upgrade Talos on cp-1 v1.12.6 → v1.13.3")
		if dry.ExitCode != 0 || !strings.Contains(dry.Stdout, "Kubernetes first, then Talos") || kube < 0 || talos < kube {
			t.Fatalf("dry run of Talos v1.13.3 with Kubernetes 1.31.0 must plan Kubernetes, then Talos (exit %d):\n%s", dry.ExitCode, dry.Tail(40))
		}
	})
	// The UI's lines are in the log (stderr) when stdout is no terminal.
	if k, tl := strings.Index(real.Stderr, "upgrade kube-apiserver on cp-1 1.30.14 → 1.31.0"), strings.Index(real.Stderr, "upgrade Talos on cp-1 v1.12.6 → v1.13.3"); k < 0 || tl < k {
		t.Fatalf("the run did not move Kubernetes before Talos:\n%s", real.Stderr)
	}
	// The stage's summary reads the API server after the rollout, not
	// what the converge saw before it.
	if !strings.Contains(real.Stderr, "Kubernetes API v1.31.0 answers") {
		t.Fatalf("the talos stage's summary does not name the upgraded API server:\n%s", real.Stderr)
	}
	api, kubelets := kubeState(t, ctx, h)
	if api != "v1.31.0" || kubelets["cp-1"] != "v1.31.0" {
		t.Fatalf("after the upgrade the API server runs %s and the kubelet %s", api, kubelets["cp-1"])
	}
	if v := nodeNamed(t, h, "cp-1").Version(); v != "v1.13.3" {
		t.Fatalf("cp-1 runs Talos %s after the upgrade, want v1.13.3", v)
	}
	if img := kubeProxyImage(t, ctx, h); !strings.HasSuffix(img, ":v1.31.0") {
		t.Fatalf("kube-proxy runs %s after the upgrade to 1.31.0", img)
	}
	if r := run(t, ctx, h, "run", "--stage", "infra"); r.ExitCode != 0 {
		t.Fatalf("infra after the upgrade:\n%s", r.Tail(30))
	}
}
