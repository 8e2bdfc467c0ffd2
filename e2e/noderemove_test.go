package e2e_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/lab/talossim"
	"github.com/homelab/bootstrap/state"
)

// greenLab starts a lab, runs the whole pipeline on it and returns the
// state it left.
func greenLab(t *testing.T, ctx context.Context, o e2e.Options) (*e2e.Harness, *state.State) {
	t.Helper()
	h := startHarness(t, o)
	if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
		t.Fatalf("pipeline:\n%s", r.Tail(40))
	}
	st, err := h.State()
	if err != nil {
		t.Fatal(err)
	}
	return h, st
}

// dropNode deletes a node's entry from the lab config.
func dropNode(t *testing.T, h *e2e.Harness, name string) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^  - \{name: ` + regexp.QuoteMeta(name) + `,.*\}\n`)
	if err := h.EditConfig(func(s string) (string, error) {
		if !re.MatchString(s) {
			t.Fatalf("no node %s in the lab config", name)
		}
		return re.ReplaceAllString(s, ""), nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestNodeRemove: nodes deleted from the config are left alone by a run,
// which names `bootstrap node remove` for each (the postcheck fails on
// them until then). Removing a control plane while another is powered off
// is refused before anything changes (etcd's strict reconfiguration check
// would refuse the member removal: 1 of the 2 members left would run).
// Then the worker and the control plane are removed: drained, the control
// plane out of etcd, reset and powered off by Talos, their Nodes and VMs
// deleted, the state forgotten; etcd has one member per control plane
// left and the postcheck is green. Each removal is killed once half way
// and resumed.
func TestNodeRemove(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 6*time.Minute)
	h, st := greenLab(t, ctx, e2e.Options{ControlPlanes: 3, Workers: 2})
	nodes := st.Outputs.Nodes
	kc, err := h.Lab.Kube.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	// The worker that runs the NFS provisioner goes: its drain must move
	// the pod, or the postcheck's PVC stays Pending.
	pods, err := kc.Client().CoreV1().Pods("nfs-provisioner").List(ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("provisioner pods: %v", err)
	}
	wk := pods.Items[0].Spec.NodeName
	dropNode(t, h, "cp-3")
	dropNode(t, h, wk)

	again := run(t, ctx, h, "run", "--stage", "all")
	out := again.Stdout + again.Stderr
	for _, n := range []string{"cp-3", wk} {
		if !strings.Contains(out, "run `bootstrap node remove "+n+"` to take it out") {
			t.Errorf("the run does not say how to take %s out:\n%s", n, again.Tail(40))
		}
	}
	if again.ExitCode == 0 || !strings.Contains(out, "bootstrap node remove cp-3") {
		t.Errorf("a cluster with nodes outside the config passed the postcheck (exit %d):\n%s", again.ExitCode, again.Tail(30))
	}
	if _, ok := h.Lab.Talos.Node(nodes[wk].IP); !ok {
		t.Fatalf("the run touched %s", wk)
	}

	// cp-2 powered off: removing cp-3 would leave 1 of 2 members running.
	if err := h.Lab.PVE.GuestPowerOff(nodes["cp-2"].VMID); err != nil {
		t.Fatal(err)
	}
	refused := run(t, ctx, h, "node", "remove", "cp-3", "--yes")
	if out := refused.Stdout + refused.Stderr; refused.ExitCode == 0 || !strings.Contains(out, "etcd would refuse to remove its member: 1 of the 2 members left would run") ||
		!strings.Contains(out, "nothing was changed") {
		t.Fatalf("removing cp-3 with cp-2 down (exit %d):\n%s", refused.ExitCode, refused.Tail(20))
	}
	if n, ok := h.Lab.Talos.Node(nodes["cp-3"].IP); !ok || n.Counters().Resets != 0 || n.Phase() != talossim.PhaseRunning {
		t.Fatal("the refused removal touched cp-3")
	}
	if r := run(t, ctx, h, "run", "--stage", "provision"); r.ExitCode != 0 {
		t.Fatalf("provision starting cp-2 again:\n%s", r.Tail(20))
	}
	if r := run(t, ctx, h, "run", "--stage", "talos"); r.ExitCode != 0 {
		t.Fatalf("talos stage waiting for cp-2:\n%s", r.Tail(20))
	}

	dry := run(t, ctx, h, "node", "remove", wk, "--dry-run")
	if dry.ExitCode != 0 || !strings.Contains(dry.Stdout, "cordon and drain Kubernetes node "+wk) || !strings.Contains(dry.Stdout, fmt.Sprintf("stop and delete VM %d", nodes[wk].VMID)) {
		t.Fatalf("dry run:\n%s\n%s", dry.Stdout, dry.Tail(10))
	}
	if _, ok := h.Lab.Talos.Node(nodes[wk].IP); !ok {
		t.Fatalf("the dry run touched %s", wk)
	}

	// Each removal is killed once half way (the worker once its VM is
	// off, the control plane as its reset is asked for, after it left
	// etcd) and resumed by running it again.
	killAt := map[string]string{wk: "delete Kubernetes node " + wk, "cp-3": "reset cp-3"}
	for _, name := range []string{wk, "cp-3"} {
		killed, err := h.RunWith(ctx, e2e.RunOptions{KillWhen: func(ev e2e.Event) bool { return strings.HasPrefix(ev.Message, killAt[name]) }},
			"node", "remove", name, "--yes")
		if err != nil || !killed.Killed {
			t.Fatalf("node remove %s was not killed at %q: %v\n%s", name, killAt[name], err, killed.Tail(20))
		}
		r := run(t, ctx, h, "node", "remove", name, "--yes")
		if r.ExitCode != 0 || !strings.Contains(r.Stdout, name+": remove done") {
			t.Fatalf("node remove %s (exit %d):\n%s\n%s", name, r.ExitCode, r.Stdout, r.Tail(30))
		}
		if evicted := regexp.MustCompile(`evicted \d+ pod\(s\) from ` + wk + `: [^"]*nfs-provisioner/`); name == wk && !evicted.MatchString(killed.Stderr) {
			t.Errorf("the drain of %s did not evict the provisioner:\n%s", wk, killed.Tail(20))
		}
		if _, ok := h.Lab.PVE.VM(nodes[name].VMID); ok {
			t.Errorf("%s's VM is still there", name)
		}
		if _, err := kc.Client().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err == nil {
			t.Errorf("%s's Kubernetes Node is still there", name)
		}
		st, _ := h.State()
		if _, ok := st.Outputs.Nodes[name]; ok {
			t.Errorf("the state still records %s", name)
		}
		// A second removal finds nothing to do and says so.
		if r := run(t, ctx, h, "node", "remove", name, "--yes"); r.ExitCode != 2 || !strings.Contains(r.Stdout+r.Stderr, "no node "+name) {
			t.Errorf("removing %s again (exit %d):\n%s", name, r.ExitCode, r.Tail(10))
		}
	}
	// The other worker is replaced in place, killed once while its VM is
	// created again: same VMID, IP and MAC, a freshly installed node.
	other := map[string]string{"wk-1": "wk-2", "wk-2": "wk-1"}[wk]
	installs := h.Lab.Talos.InstalledVersion(nodes[other].IP)
	killed, err := h.RunWith(ctx, e2e.RunOptions{Kill: &e2e.KillPoint{Stage: "provision", Event: 3}}, "node", "replace", other, "--yes")
	if err != nil || !killed.Killed {
		t.Fatalf("node replace %s was not killed in provision: %v\n%s", other, err, killed.Tail(20))
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	r := run(t, rctx, h, "node", "replace", other, "--yes")
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, other+": replace done") || !strings.Contains(r.Stdout, "taken out by an earlier replace") {
		t.Fatalf("node replace %s resumed (exit %d):\n%s\n%s", other, r.ExitCode, r.Stdout, r.Stderr)
	}
	st, _ = h.State()
	if n := st.Outputs.Nodes[other]; n.VMID != nodes[other].VMID || n.IP != nodes[other].IP || n.MAC != nodes[other].MAC || st.Outputs.Replacing != "" {
		t.Errorf("replaced %s: %+v (was %+v), replacing %q", other, n, nodes[other], st.Outputs.Replacing)
	}
	if n, ok := h.Lab.Talos.Node(nodes[other].IP); !ok || n.Counters().Installs != 1 || installs == "" {
		t.Errorf("the replaced %s was not installed afresh", other)
	}

	if got := h.Lab.Talos.EtcdMembers(nodes["cp-1"].IP); len(got) != 2 {
		t.Errorf("etcd members after removing cp-3: %v, want cp-1 and cp-2", got)
	}
	// A control plane replaced: it leaves etcd, is installed afresh and
	// joins again as a new member; etcd keeps two members, cp-2 among them.
	r = run(t, rctx, h, "node", "replace", "cp-2", "--yes")
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, "cp-2: replace done") {
		t.Fatalf("node replace cp-2 (exit %d):\n%s\n%s", r.ExitCode, r.Stdout, r.Tail(30))
	}
	if got := h.Lab.Talos.EtcdMembers(nodes["cp-1"].IP); !slices.Equal(got, []string{"cp-1", "cp-2"}) {
		t.Errorf("etcd members after replacing cp-2: %v, want cp-1 and cp-2", got)
	}
	if n, ok := h.Lab.Talos.Node(nodes["cp-2"].IP); !ok || n.Counters().Installs != 1 {
		t.Error("the replaced cp-2 was not installed afresh")
	}
	if r := run(t, ctx, h, "run", "--stage", "postcheck"); r.ExitCode != 0 {
		t.Fatalf("postcheck after the removals:\n%s\n%s", r.Stdout, r.Tail(30))
	}
}

// TestNodeAdd: a control plane and a worker added to the config's nodes
// are provisioned, configured and joined by `run --stage all` (the control
// plane joins the running etcd as a new member), the postcheck is green,
// and the nodes that were there are left alone: no apply, no reboot.
func TestNodeAdd(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	h, st := greenLab(t, ctx, e2e.Options{ControlPlanes: 1, Workers: 1})
	before := map[string]talossim.Counters{}
	for _, name := range []string{"cp-1", "wk-1"} {
		n, ok := h.Lab.Talos.Node(st.Outputs.Nodes[name].IP)
		if !ok {
			t.Fatalf("no %s", name)
		}
		before[name] = n.Counters()
	}
	prefix := strings.TrimSuffix(st.Outputs.Nodes["cp-1"].IP, ".11")
	if err := h.EditConfig(func(s string) (string, error) {
		entry := "  - {name: wk-1,"
		i := strings.Index(s, entry)
		if i < 0 {
			t.Fatal("no wk-1 entry in the lab config")
		}
		add := fmt.Sprintf("  - {name: cp-2, role: controlplane, vmid: 702, ip: %s.12, cores: 2, memoryMiB: 2048, diskGiB: 20}\n", prefix) +
			fmt.Sprintf("  - {name: wk-2, role: worker, vmid: 712, ip: %s.22, cores: 2, memoryMiB: 2048, diskGiB: 20}\n", prefix)
		return s[:i] + add + s[i:], nil
	}); err != nil {
		t.Fatal(err)
	}
	r := run(t, ctx, h, "run", "--stage", "all")
	if r.ExitCode != 0 {
		t.Fatalf("run with two nodes added:\n%s", r.Tail(40))
	}
	if err := h.PostcheckGreen(); err != nil {
		t.Fatal(err)
	}
	if got := h.Lab.Talos.EtcdMembers(st.Outputs.Nodes["cp-1"].IP); !slices.Equal(got, []string{"cp-1", "cp-2"}) {
		t.Errorf("etcd members %v, want cp-1 and cp-2", got)
	}
	for name, was := range before {
		n, _ := h.Lab.Talos.Node(st.Outputs.Nodes[name].IP)
		if c := n.Counters(); c.Applies != was.Applies || c.Reboots != was.Reboots || c.Upgrades != was.Upgrades {
			t.Errorf("%s was touched by the run that added nodes: %+v, was %+v", name, c, was)
		}
	}
	for _, vm := range []string{"create VM 702 cp-2", "create VM 712 wk-2"} {
		if !strings.Contains(r.Stderr, vm) {
			t.Errorf("the run does not say %q", vm)
		}
	}
}
