package talos

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"

	"github.com/homelab/bootstrap/lab/talossim"
	"github.com/homelab/bootstrap/talos/talostest"
)

// These tests pin the behaviours of real Talos (v1.13.3 source, see
// docs/fidelity.md) that the talos stage must handle.

// profile is the instant profile with some steps changed.
func profile(change func(*talossim.Profile)) talossim.Profile {
	p := talossim.ProfileInstant
	p.Name = "test"
	change(&p)
	return p
}

// A node answers in configured mode while the installer runs (apid restarts
// with mutual TLS before the install sequence); its install can still fail
// and reboot it into maintenance mode. Installed means running the
// installed system, and a node back in maintenance gets its config again.
func TestConfiguredWhileInstallingIsNotInstalled(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1,
		profile: profile(func(p *talossim.Profile) { p.Install = 400 * time.Millisecond }),
		faults:  map[string]talossim.Faults{"cp-1": {InstallerPullFails: 1}}})
	ctx := testCtx(t)
	if _, err := h.converge(ctx, nil); err != nil {
		t.Fatal(err)
	}
	c := h.node("cp-1").Counters()
	if c.MaintenanceApplies != 2 || c.Installs != 1 || c.InstallCrashes != 1 {
		t.Errorf("counters %+v: want the config applied again after the failed install, and one install", c)
	}
	if h.node("cp-1").Phase() != talossim.PhaseRunning || h.sim.Installed(h.node("cp-1").IP()) == nil {
		t.Errorf("cp-1 is %s, installed %v", h.node("cp-1").Phase(), h.sim.Installed(h.node("cp-1").IP()) != nil)
	}
}

// A control plane never bootstrapped gives up joining after
// EtcdJoinTimeout and its etcd stays Failed: that is not "bootstrapped".
// The resumed run bootstraps and reboots the control planes whose etcd
// failed, so they join.
func TestFailedEtcdIsNotBootstrappedAndIsRecovered(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 3,
		profile: profile(func(p *talossim.Profile) { p.EtcdJoinTimeout = 200 * time.Millisecond }),
		ops:     OpsOptions{HealthTimeout: 8 * time.Second}})
	ctx := testCtx(t)
	kctx, kill := context.WithCancel(ctx)
	if _, err := h.converge(kctx, killAt("bootstrap etcd", false, kill)); !errors.Is(err, context.Canceled) {
		t.Fatalf("killed run: %v", err)
	}
	// Long after the join timeout every control plane's etcd has failed.
	deadline := time.Now().Add(5 * time.Second)
	for {
		svcs, err := h.ops.Services(ctx, h.node("cp-2").IP())
		if s, ok := findService(svcs, "etcd"); err == nil && ok && s.State == "Failed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd on cp-2 never failed: %v %v", svcs, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, err := h.converge(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	total, byNode := h.counters()
	if total.Bootstraps != 1 || !res.Bootstrapped {
		t.Errorf("bootstraps %d (this run: %v), want exactly one", total.Bootstraps, res.Bootstrapped)
	}
	if byNode["cp-2"].Reboots == 0 || byNode["cp-3"].Reboots == 0 {
		t.Errorf("the control planes whose etcd failed were not rebooted: %+v", byNode)
	}
	members, err := h.ops.EtcdMembers(ctx, h.node("cp-1").IP())
	if err != nil || len(members) != 3 {
		t.Errorf("members %v %v", members, err)
	}
}

// A worker gets its API certificate from a control plane's trustd, which
// it finds through the cluster endpoint: a VIP that only comes up with
// etcd. With discovery unreachable, waiting for the workers before the
// bootstrap deadlocks; the control planes are bootstrapped first.
func TestWorkersBehindTheVIPComeUpAfterTheBootstrap(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 3, workers: 2, noDiscovery: true,
		ops: OpsOptions{InstallTimeout: 8 * time.Second}})
	if h.opts.VIP == "" {
		t.Fatal("the harness gives 3 control planes a VIP endpoint")
	}
	res, err := h.converge(testCtx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"wk-1", "wk-2"} {
		if res.Nodes[n].Action != ActionInstalled {
			t.Errorf("%s: %+v", n, res.Nodes[n])
		}
	}
}

// Once a reboot-mode apply was accepted, apid refuses every apply (dry runs
// too) with FailedPrecondition until the node is down: a resumed run that
// meets it waits.
func TestApplyWhileRebootingIsWaitedOut(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1,
		profile: profile(func(p *talossim.Profile) { p.RebootStart = 800 * time.Millisecond })})
	ctx := testCtx(t)
	if _, err := h.converge(ctx, nil); err != nil {
		t.Fatal(err)
	}
	cp1, _ := h.res.Node("cp-1")
	changed := []byte(strings.Replace(string(cp1.Config), "diskQuotaSupport: true", "diskQuotaSupport: false", 1))
	target := Target{Name: "cp-1", IP: cp1.IP, Role: cp1.Role, Config: changed, InstallDisk: cp1.InstallDisk}
	// A run applied it and was killed at once.
	if reboot, err := h.ops.applyConfigured(ctx, target); err != nil || !reboot {
		t.Fatalf("apply: reboot=%v %v", reboot, err)
	}
	err := h.ops.call(ctx, cp1.IP, true, time.Second, func(ctx context.Context, c *client.Client) error {
		_, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: changed, DryRun: true})
		return err
	})
	if !strings.Contains(err.Error(), "node is rebooting") {
		t.Fatalf("the node must refuse applies while it reboots: %v", err)
	}
	res, err := h.ops.EnsureConfig(ctx, target, EnsureOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Action != ActionUnchanged || string(h.node("cp-1").Config()) != string(changed) {
		t.Errorf("%+v: the node must come back with the applied config", res)
	}
}

// .machine.install (and .machine.ca) apply without a reboot: a new install
// image does not reinstall, and the node keeps the Talos it runs.
func TestInstallImageChangeDoesNotUpgrade(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1})
	ctx := testCtx(t)
	if _, err := h.converge(ctx, nil); err != nil {
		t.Fatal(err)
	}
	h.opts.InstallImage = "ghcr.io/siderolabs/installer:v1.13.9"
	var err error
	if h.res, err = Generate(h.opts); err != nil {
		t.Fatal(err)
	}
	res, err := h.ops.Converge(ctx, ConvergeOptions{Nodes: h.targets(), KubeconfigPath: filepath.Join(h.dir, KubeconfigFile)})
	if err != nil {
		t.Fatal(err)
	}
	r := res.Nodes["cp-1"]
	if r.Action != ActionUpdated || r.Reboot || r.Version != "v1.13.3" {
		t.Errorf("cp-1: %+v, want updated without a reboot, still running v1.13.3", r)
	}
}

// Healthy means what `talosctl health` means: a control plane still joining
// is an etcd learner, which the member list names like any member; the
// cluster is not healthy until it is promoted.
// talosctl health's pre-boot checks also want Talos' minimum memory and
// EPHEMERAL size on every node, and no active diagnostics.
func TestHealthWantsTalosMinimumsAndNoDiagnostics(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1, workers: 1, ops: OpsOptions{HealthTimeout: 5 * time.Second},
		memory: map[string]uint64{"wk-1": 768 << 20}, diskSize: map[string]uint64{"wk-1": 5 << 30}})
	ctx := testCtx(t)
	if _, err := h.converge(ctx, nil); err == nil {
		t.Fatal("a cluster with a worker below Talos' minimums converged as healthy")
	}
	var nodes []HealthTarget
	for _, n := range h.res.Nodes {
		nodes = append(nodes, HealthTarget{Name: n.Name, IP: n.IP, Role: n.Role})
	}
	h.node("cp-1").SetDiagnostic("address-binding", "host and Kubernetes pod/service CIDR addresses overlap")
	want := map[string]string{
		HealthMemorySizes:   "node wk-1 does not meet memory requirements: expected at least 874 MiB, actual 640 MiB",
		HealthDiskSizes:     "the EPHEMERAL partition of wk-1 is too small",
		HealthNoDiagnostics: "cp-1: host and Kubernetes pod/service CIDR addresses overlap",
	}
	// One poll judges; a loaded machine may cut a poll's calls, so a few.
	var r HealthReport
	for try := 0; try < 20; try++ {
		r = h.ops.Health(ctx, HealthInput{Nodes: nodes})
		ok := true
		for name, w := range want {
			if c, _ := r.Get(name); c.OK || !strings.Contains(c.Detail, w) {
				ok = false
			}
		}
		if ok {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	for name, w := range want {
		if c, _ := r.Get(name); c.OK || !strings.Contains(c.Detail, w) {
			t.Errorf("%s: %+v, want a failure naming %q", name, c, w)
		}
	}
}

// bootstrappedWhileJoining is a cluster of two control planes whose run
// was killed once etcd was bootstrapped on cp-1: cp-2 joins for join.
func bootstrappedWhileJoining(t *testing.T, join time.Duration) (*harness, context.Context, []HealthTarget) {
	h := newHarness(t, harnessOptions{controlPlanes: 2,
		profile: profile(func(p *talossim.Profile) { p.EtcdJoin = join })})
	ctx := testCtx(t)
	kctx, kill := context.WithCancel(ctx)
	if _, err := h.converge(kctx, killAt("bootstrap etcd", true, kill)); !errors.Is(err, context.Canceled) {
		t.Fatalf("killed run: %v", err)
	}
	var nodes []HealthTarget
	for _, n := range h.res.Nodes {
		nodes = append(nodes, HealthTarget{Name: n.Name, IP: n.IP, Role: n.Role})
	}
	return h, ctx, nodes
}

func TestHealthCountsALearnerAsNotYetAMember(t *testing.T) {
	t.Parallel()
	h, ctx, nodes := bootstrappedWhileJoining(t, 3*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for {
		members, err := h.ops.EtcdMembers(ctx, h.node("cp-1").IP())
		if err == nil && len(members) == 2 && (members[0].Learner || members[1].Learner) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cp-2 never showed as a learner: %v %v", members, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	r := h.ops.Health(ctx, HealthInput{Nodes: nodes})
	c, _ := r.Get(HealthEtcdControlPlanes)
	if c.OK || !strings.Contains(c.Detail, "cp-2 is still a learner") {
		t.Errorf("%s: %+v, want a failure naming the learner", HealthEtcdControlPlanes, c)
	}
	if r.OK() {
		t.Error("the cluster counts as healthy with a learner")
	}
}

// TestHealthWaitWakesOnServiceEvents: a health wait polls again when a
// node publishes a service state event (etcd joining and turning healthy)
// instead of waiting out its interval. With an interval of an hour, the
// wait can end within the test only through those events.
func TestHealthWaitWakesOnServiceEvents(t *testing.T) {
	t.Parallel()
	h, ctx, nodes := bootstrappedWhileJoining(t, 2*time.Second)
	if h.ops.Health(ctx, HealthInput{Nodes: nodes}).OK() {
		t.Fatal("healthy while cp-2's etcd joins: the wait below would prove nothing")
	}
	slow := hourlyPolls(t, h)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := slow.WaitHealthy(wctx, "the cluster healthy", HealthInput{Nodes: nodes}); err != nil {
		t.Fatalf("the wait did not wake on the nodes' service events: %v", err)
	}
}

// TestUnexpectedNodeFailsHealthButNotTheWait: a registered Node no config
// entry accounts for fails "all k8s nodes to report" as talosctl health's
// NodesMatch does, but the talos stage's wait tolerates it (waiting cannot
// remove it): converge ends, and the postcheck's judgement names it.
func TestUnexpectedNodeFailsHealthButNotTheWait(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1, workers: 1})
	ctx := testCtx(t)
	var registered []talostest.Node
	var nodes []HealthTarget
	for _, n := range h.res.Nodes {
		registered = append(registered, talostest.Node{Name: n.Name, IP: n.IP, ControlPlane: n.Role == RoleControlPlane})
		nodes = append(nodes, HealthTarget{Name: n.Name, IP: n.IP, Role: n.Role})
	}
	h.api.SetNodes(append(registered, talostest.Node{Name: "stray", IP: "127.0.0.99"})...)
	res, err := h.converge(ctx, nil)
	if err != nil {
		t.Fatalf("converge with a stray Node: %v", err)
	}
	cs, err := kubeClient(res.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	r := h.ops.Health(ctx, HealthInput{Nodes: nodes, Kube: cs})
	if c, _ := r.Get(HealthK8sNodesReported); c.OK || !strings.Contains(c.Detail, "unexpected nodes, registered but not in the config: stray (127.0.0.99)") {
		t.Errorf("%s: %+v", HealthK8sNodesReported, c)
	}
	r = h.ops.Health(ctx, HealthInput{Nodes: nodes, Kube: cs, TolerateUnexpected: true})
	if c, _ := r.Get(HealthK8sNodesReported); !c.OK {
		t.Errorf("tolerated: %+v", c)
	}
}

// TestKubeSideHealthAsksOnlyTheKubernetesSide: the converge's last wait
// follows the Talos side's, as talosctl health's checks follow one another
// without asking a passed one again (pkg/cluster/check/check.go Wait at
// v1.13.3): it asks the workers nothing and the control planes only for
// their static pods, and reports only the Kubernetes assertions. A worker
// diagnostic, which fails the whole health, is not in it.
func TestKubeSideHealthAsksOnlyTheKubernetesSide(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1, workers: 1})
	ctx := testCtx(t)
	res, err := h.converge(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubeClient(res.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []HealthTarget
	for _, n := range h.res.Nodes {
		nodes = append(nodes, HealthTarget{Name: n.Name, IP: n.IP, Role: n.Role})
	}
	h.node("wk-1").SetDiagnostic("address-binding", "host and Kubernetes pod/service CIDR addresses overlap")
	if c, _ := h.ops.Health(ctx, HealthInput{Nodes: nodes, Kube: cs}).Get(HealthNoDiagnostics); c.OK {
		t.Fatalf("%s passed with a diagnostic on wk-1: the check below would prove nothing", HealthNoDiagnostics)
	}
	before := h.node("wk-1").Counters().Calls
	r := h.ops.Health(ctx, HealthInput{Nodes: nodes, Kube: cs, KubeSideOnly: true})
	if !r.OK() {
		t.Errorf("the Kubernetes side failed: %s", r.Summary())
	}
	var names []string
	for _, c := range r {
		names = append(names, c.Name)
	}
	want := []string{HealthK8sNodesReported, HealthStaticPods, HealthControlPlaneReady, HealthK8sNodesReady, HealthKubeProxyReady, HealthCoreDNSReady, HealthK8sNodesSchedulable}
	if !slices.Equal(names, want) {
		t.Errorf("assertions %q, want the Kubernetes side's %q", names, want)
	}
	if n := h.node("wk-1").Counters().Calls - before; n != 0 {
		t.Errorf("the worker was asked %d question(s)", n)
	}
}

// hourlyPolls is the harness's Ops polling once an hour: a wait on it ends
// within a test only when something wakes it.
func hourlyPolls(t *testing.T, h *harness) *Ops {
	t.Helper()
	oo := h.ops.opts
	oo.PollInterval = time.Hour
	slow, err := NewOps(oo)
	if err != nil {
		t.Fatal(err)
	}
	return slow
}

// TestConfigRunWaitWakesOnCRI: a node up from its install whose cri does
// not run yet is woken for by cri's service event (Talos health-checks
// cri: internal/app/machined/pkg/system/services/cri.go HealthFunc at
// v1.13.3), not found by the next poll: with an hour between polls the
// wait ends within the test only through the event.
func TestConfigRunWaitWakesOnCRI(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1, timeScale: 1,
		profile: profile(func(p *talossim.Profile) { p.BootstrapReady = 2 * time.Second })})
	ctx := testCtx(t)
	kctx, kill := context.WithCancel(ctx)
	if _, err := h.converge(kctx, killAt("apply config", true, kill)); !errors.Is(err, context.Canceled) {
		t.Fatalf("killed run: %v", err)
	}
	target := h.targets()[0]
	deadline := time.Now().Add(10 * time.Second)
	for {
		up, err := h.ops.InstalledSystemUp(ctx, target.IP)
		if err == nil && up.Detail == notBootedYet {
			break
		}
		if err == nil && up.Installed || time.Now().After(deadline) {
			t.Fatalf("never found up from its install without cri: %+v %v", up, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	slow := hourlyPolls(t, h)
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if res, err := slow.EnsureConfig(wctx, target, EnsureOptions{}); err != nil || res.Action != ActionUnchanged {
		t.Fatalf("the wait did not wake on the node's cri event: %+v %v", res, err)
	}
}
