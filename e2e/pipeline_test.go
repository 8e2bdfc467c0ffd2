package e2e_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
	"github.com/homelab/bootstrap/stages"
	"github.com/homelab/bootstrap/state"
)

// TestPipeline runs `bootstrap run --stage all` as a user would against a
// fresh lab, for one control plane, for one control plane with Cilium
// (the real chart: its operator must fit on the single node), and for
// three control planes and two workers behind a VIP: it must end with
// postcheck green. A second run on
// the converged cluster must exit 0 and change nothing: no Proxmox POST,
// PUT or DELETE, no Talos apply or bootstrap, no new Helm revision, and no
// API server write by the runner except the postcheck's test PVC.
func TestPipeline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name               string
		controlPlanes, wks int
		vip                bool
		cni                string
	}{
		{"1cp", 1, 0, false, ""},
		{"1cp-cilium", 1, 0, false, "cilium"},
		{"3cp+2w-vip", 3, 2, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t, 5*time.Minute)
			// The service account key a user gets by default (the other
			// tests take ECDSA: startHarness).
			h := startHarness(t, e2e.Options{ControlPlanes: tc.controlPlanes, Workers: tc.wks, VIP: tc.vip, CNI: tc.cni, ServiceAccountKey: config.ServiceAccountKeyRSA})
			nodes := tc.controlPlanes + tc.wks
			checkSecureBoot := func(*e2e.Result) {}
			if tc.wks >= 2 {
				// One node's VM set apart from proxmox.vm (nodes[].vm).
				setNodeVM(t, h, "wk-2", `{scsihw: virtio-scsi-single, ballooning: "on", rng: "on"}`)
				withDataDiskAndStorageNIC(t, h)
				// One control plane with Secure Boot, a TPM and encrypted volumes.
				checkSecureBoot = secureBootNode(t, ctx, h, "cp-2")
			}
			checkPCI := func() {}
			if tc.wks >= 1 {
				checkPCI = passIGPU(t, h, "wk-1")
			}

			first := run(t, ctx, h, "run", "--stage", "all")
			if first.ExitCode != 0 {
				t.Fatalf("first run failed:\n%s", first.Tail(40))
			}
			checkVMHardware(t, h, "wk-2")
			checkPCI()
			checkSecureBoot(first)
			if err := h.PostcheckGreen(); err != nil {
				t.Fatalf("after the first run: %v\n%s", err, first.Tail(20))
			}
			checkPostcheckTable(t, first)
			after1 := counters(t, ctx, h)
			t.Logf("first run: %s; %d Proxmox calls (%d mutating), %d Talos calls, %d runner writes to the API server",
				first.Wall.Round(100*time.Millisecond), after1.ProxmoxCalls, after1.ProxmoxMutating, after1.TalosCalls, len(after1.RunnerWrites))
			// The counters must see the first run at all, or a zero below proves nothing.
			if after1.ProxmoxMutating < 2*nodes || after1.TalosApplies != nodes || after1.TalosBootstraps != 1 || after1.EtcdBootstraps != 1 {
				t.Fatalf("first run: %d Proxmox mutations (want ≥ %d), %d Talos applies (want %d), %d bootstraps (want 1), %d etcd clusters (want 1)",
					after1.ProxmoxMutating, 2*nodes, after1.TalosApplies, nodes, after1.TalosBootstraps, after1.EtcdBootstraps)
			}
			if len(after1.RunnerWrites) < 20 {
				t.Fatalf("the audit log shows only %d writes by the runner in the first run: %v", len(after1.RunnerWrites), after1.RunnerWrites)
			}
			if r := after1.HelmReleases["nfs-provisioner/nfs-provisioner"]; r.Revision != 1 || r.Status != "deployed" {
				t.Fatalf("Helm release after the first run: %+v (all: %v)", r, after1.HelmReleases)
			}
			if r, ok := after1.HelmReleases["kube-system/cilium"]; (tc.cni == "cilium") != ok || (ok && (r.Revision != 1 || r.Status != "deployed")) {
				t.Fatalf("Cilium release after the first run with cni %q: %+v (all: %v)", tc.cni, r, after1.HelmReleases)
			}

			again := run(t, ctx, h, "run", "--stage", "all")
			if again.ExitCode != 0 {
				t.Fatalf("re-run failed:\n%s", again.Tail(40))
			}
			if err := h.PostcheckGreen(); err != nil {
				t.Fatalf("after the re-run: %v", err)
			}
			after2 := counters(t, ctx, h)
			t.Logf("converged re-run: %s, peak RSS %d MiB", again.Wall.Round(100*time.Millisecond), again.MaxRSSKiB>>10)
			if n := after2.ProxmoxMutating - after1.ProxmoxMutating; n != 0 {
				t.Errorf("re-run made %d mutating Proxmox calls: %v", n, after2.ProxmoxList)
			}
			if after2.ProxmoxCalls == after1.ProxmoxCalls {
				t.Errorf("re-run made no Proxmox call at all: the counters do not see the run")
			}
			if n := after2.TalosApplies - after1.TalosApplies; n != 0 {
				t.Errorf("re-run applied Talos configs %d times", n)
			}
			if n := after2.TalosBootstraps - after1.TalosBootstraps; n != 0 || after2.EtcdBootstraps != 1 {
				t.Errorf("re-run bootstrapped %d times (%d etcd clusters)", n, after2.EtcdBootstraps)
			}
			if !maps.EqualFunc(after1.HelmReleases, after2.HelmReleases, func(a, b e2e.HelmRelease) bool { return reflect.DeepEqual(a, b) }) {
				t.Errorf("Helm releases changed: %v → %v", after1.HelmReleases, after2.HelmReleases)
			}
			var pvc, other []string
			for _, e := range after2.NewWrites(after1) {
				if e2e.IsPostcheckPVC(e) {
					pvc = append(pvc, e.Verb)
				} else {
					other = append(other, e.String())
				}
			}
			if len(other) > 0 {
				t.Errorf("re-run wrote to the API server beyond the postcheck PVC:\n  %s", strings.Join(other, "\n  "))
			}
			if strings.Join(pvc, ",") != "create,delete" {
				t.Errorf("postcheck PVC writes in the re-run = %v, want create then delete (the audit log must see the runner)", pvc)
			}
			checkNoChanges(t, again)
			left, err := h.PVCs(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range left {
				if strings.HasPrefix(p.Name, "postcheck-") {
					t.Errorf("postcheck's test PVC left behind: %s (%s)", p.Name, p.Status.Phase)
				}
			}
		})
	}
}

// checkPostcheckTable wants every postcheck row to pass.
func checkPostcheckTable(t *testing.T, r *e2e.Result) {
	t.Helper()
	for _, name := range []string{"kubeconfig", "nodes-ready", "default-storageclass", "flux-ready", "flux-objects", "nfs-provisioning", "talos-etcd", "talos-api", "proxmox-vms", "etcd-backup"} {
		found := false
		for _, line := range strings.Split(r.Stdout, "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == name {
				found = true
				if f[1] != "PASS" {
					t.Errorf("postcheck %s: %s", name, line)
				}
			}
		}
		if !found {
			t.Errorf("postcheck table has no %s row:\n%s", name, r.Stdout)
		}
	}
}

// checkNoChanges wants every stage of the run to report no changes.
func checkNoChanges(t *testing.T, r *e2e.Result) {
	t.Helper()
	done := map[string]bool{}
	for _, line := range strings.Split(r.Stderr, "\n") {
		var ev struct {
			UI, Stage, Message string
			Changes            int `json:"changes"`
		}
		if json.Unmarshal([]byte(line), &ev) != nil || ev.UI == "" {
			continue
		}
		switch ev.UI {
		case "change":
			t.Errorf("re-run changed something in %s: %s", ev.Stage, ev.Message)
		case "ok":
			if strings.HasPrefix(ev.Message, ev.Stage+" done in ") {
				done[ev.Stage] = true
				if ev.Changes != 0 {
					t.Errorf("re-run: %s", ev.Message)
				}
			}
		}
	}
	for _, s := range stages.Order {
		if !done[s] {
			t.Errorf("re-run: no completion line for stage %s", s)
		}
	}
}

// TestBringYourOwnCNI: with cni.name none Talos deploys no CNI, so the
// nodes stay NotReady (the lab's kubelets report "container runtime
// network not ready" as real ones do). The talos stage still ends green
// (talosctl health skips Ready nodes and CoreDNS then), the infra stage
// stops with what to do instead of waiting for a provisioner that cannot
// be scheduled, and once the user's CNI runs a resumed run ends green.
func TestBringYourOwnCNI(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 4*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1, Workers: 1, CNI: "none"})
	first := run(t, ctx, h, "run", "--stage", "all")
	if first.ExitCode == 0 || !strings.Contains(first.Stderr, "cni.name is none and the cluster has no pod network yet") ||
		!strings.Contains(first.Stderr, "container runtime network not ready") || !strings.Contains(first.Stderr, "--stage infra") {
		t.Fatalf("first run: exit %d, want the infra stage to stop and say why\n%s", first.ExitCode, first.Tail(40))
	}
	st, err := h.State()
	if err != nil {
		t.Fatal(err)
	}
	if tl, in := st.Stages[stages.Talos].EffectiveStatus(), st.Stages[stages.Infra].EffectiveStatus(); tl != state.OK || in != state.Failed {
		t.Fatalf("after the first run the talos stage is %s and infra %s; want ok and failed", tl, in)
	}

	// The user's CNI, as upstream flannel installs itself: its own
	// namespace, a DaemonSet that tolerates the not-ready taint. Its agents
	// cannot start at first (a CPU request no node meets, as an image
	// still pulling): the resume that follows the install must wait for
	// them, not stop.
	cs, _, err := kube.Clientset(h.Paths().Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	// CoreDNS gone, as before Talos' manifest controller has created it
	// (the talos stage can run first, right after the bootstrap): the
	// next run's manifest sync creates it, and must not wait for pods
	// that cannot run before the pod network does.
	// (The lab's stand-in for that controller creates it as its API
	// server comes up, which can be after the first run ended.)
	for {
		err := cs.AppsV1().Deployments("kube-system").Delete(ctx, "coredns", metav1.DeleteOptions{})
		if err == nil {
			break
		}
		if !apierrors.IsNotFound(err) || ctx.Err() != nil {
			t.Fatalf("deleting CoreDNS: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-flannel"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ds := kubetest.FlannelDaemonSet("kube-flannel", "kube-flannel-ds")
	ds.Spec.Template.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2k")}
	if _, err := cs.AppsV1().DaemonSets("kube-flannel").Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	var once sync.Once
	done := make(chan *e2e.Result, 1)
	go func() {
		r, err := h.RunWith(ctx, e2e.RunOptions{OnEvent: func(ev e2e.Event) {
			if strings.Contains(ev.Message, "your CNI is starting (DaemonSet kube-flannel/kube-flannel-ds: 0/2 ready)") {
				once.Do(func() { close(waiting) })
			}
		}}, "run", "--stage", "all")
		if err != nil {
			t.Error(err)
		}
		done <- r
	}()
	select {
	case <-waiting:
	case r := <-done:
		if r == nil {
			t.FailNow()
		}
		t.Fatalf("the run after the CNI's install did not wait for its agents:\n%s", r.Tail(40))
	}
	patch := []byte(`[{"op":"remove","path":"/spec/template/spec/containers/0/resources/requests"}]`)
	if _, err := cs.AppsV1().DaemonSets("kube-flannel").Patch(ctx, "kube-flannel-ds", types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	second := <-done
	if second == nil {
		t.FailNow()
	}
	if second.ExitCode != 0 {
		t.Fatalf("run once the CNI runs:\n%s", second.Tail(40))
	}
	if err := h.PostcheckGreen(); err != nil {
		t.Fatal(err)
	}
}

// setNodeVM gives the lab config's node name the nodes[].vm value vm (a
// YAML flow mapping); a node that has a vm already gets vm's fields added
// to it, so that several tests' hardware can meet on one node.
func setNodeVM(t *testing.T, h *e2e.Harness, name, vm string) {
	t.Helper()
	if err := h.EditConfig(func(s string) (string, error) {
		re := regexp.MustCompile(`(?m)^(  - \{name: ` + regexp.QuoteMeta(name) + `, .*)\}$`)
		line := re.FindString(s)
		if line == "" {
			return "", fmt.Errorf("no node %s in the lab config:\n%s", name, s)
		}
		if strings.Contains(line, ", vm: {") && strings.HasSuffix(line, "}}") {
			fields := strings.TrimSuffix(strings.TrimPrefix(vm, "{"), "}")
			return strings.Replace(s, line, strings.TrimSuffix(line, "}}")+", "+fields+"}}", 1), nil
		}
		return re.ReplaceAllString(s, "${1}, vm: "+vm+"}"), nil
	}); err != nil {
		t.Fatal(err)
	}
}

// checkVMHardware wants every VM created as Talos' Proxmox guide's
// baseline (proxmox.vm's defaults), except the node named apart, whose
// VM takes VirtIO SCSI single (with its IO thread), ballooning and the RNG.
func checkVMHardware(t *testing.T, h *e2e.Harness, apart string) {
	t.Helper()
	for _, n := range h.Config().Nodes {
		vm, ok := h.Lab.PVE.VM(n.VMID)
		if !ok {
			t.Fatalf("VM %d %s missing", n.VMID, n.Name)
		}
		c := vm.Config
		baseline := c["bios"] == "ovmf" && c["machine"] == "q35" && strings.Contains(c["efidisk0"], ",efitype=4m,pre-enrolled-keys=0,") &&
			strings.Contains(c["scsi0"], ",cache=writethrough,")
		switch {
		case !baseline:
			t.Errorf("VM %s is not on the baseline (OVMF, EFI disk without keys, q35, write-through): %v", n.Name, c)
		case n.Name == apart && (c["scsihw"] != "virtio-scsi-single" || !strings.Contains(c["scsi0"], "iothread=1") || c["balloon"] != "" || c["rng0"] != "source=/dev/urandom"):
			t.Errorf("VM %s does not take its nodes[].vm: %v", n.Name, c)
		case n.Name != apart && (c["scsihw"] != "virtio-scsi-pci" || strings.Contains(c["scsi0"], "iothread") || c["balloon"] != "0" || c["rng0"] != ""):
			t.Errorf("VM %s is not proxmox.vm's default: %v", n.Name, c)
		}
	}
}
