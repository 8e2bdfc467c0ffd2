package talos

import (
	"bytes"
	"context"
	stdx509 "crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/siderolabs/crypto/x509"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/lab/talossim"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestConvergeFirstRunThenNoChanges(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 3, workers: 2})
	ctx := testCtx(t)

	res, err := h.converge(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range h.res.Nodes {
		if got := res.Nodes[n.Name]; got.Action != ActionInstalled || got.Found != ModeMaintenance {
			t.Errorf("%s: %+v, want installed from maintenance", n.Name, got)
		}
	}
	if res.BootstrapNode != "cp-1" || !res.Bootstrapped {
		t.Errorf("bootstrap node %s, bootstrapped %v", res.BootstrapNode, res.Bootstrapped)
	}
	total, byNode := h.counters()
	if total.Applies != 5 || total.MaintenanceApplies != 5 {
		t.Errorf("applies %d (maintenance %d), want 5", total.Applies, total.MaintenanceApplies)
	}
	if total.Bootstraps != 1 || byNode["cp-1"].Bootstraps != 1 {
		t.Errorf("bootstraps %d (cp-1: %d), want exactly one on cp-1", total.Bootstraps, byNode["cp-1"].Bootstraps)
	}
	if len(h.sim.SplitBrains()) != 0 {
		t.Errorf("split brain on %v", h.sim.SplitBrains())
	}
	// The simulated control plane got the bootstrap node's own config.
	if cp1, _ := h.res.Node("cp-1"); string(h.cluster.BootstrapConfig()) != string(cp1.Config) {
		t.Error("control plane bootstrapped with another config than cp-1's")
	}
	if got := len(h.cluster.Nodes()); got != 5 {
		t.Errorf("%d nodes registered with the control plane, want 5", got)
	}
	// Every node runs exactly the config rendered for it.
	for _, n := range h.res.Nodes {
		if string(h.node(n.Name).Config()) != string(n.Config) {
			t.Errorf("%s runs another config", n.Name)
		}
	}
	// The kubeconfig is stored 0600 and reached the API server with the
	// bundle's Kubernetes CA.
	fi, err := os.Stat(res.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 || !res.KubeconfigWrote {
		t.Errorf("kubeconfig mode %v, wrote %v", fi.Mode().Perm(), res.KubeconfigWrote)
	}
	if res.APIServerVersion != "v1.36.1" || h.api.Authorized() == 0 {
		t.Errorf("API server version %q, authorized requests %d", res.APIServerVersion, h.api.Authorized())
	}

	// Second run: nothing to do.
	past := time.Now().Add(-time.Hour).Truncate(time.Second)
	os.Chtimes(res.KubeconfigPath, past, past)
	var log changeLog
	record := log.record
	res2, err := h.converge(ctx, record)
	if err != nil {
		t.Fatal(err)
	}
	total2, _ := h.counters()
	if d := total2.Applies - total.Applies; d != 0 {
		t.Errorf("re-run made %d applies", d)
	}
	if d := total2.Bootstraps - total.Bootstraps; d != 0 || res2.Bootstrapped {
		t.Errorf("re-run made %d bootstraps", d)
	}
	if changes := log.take(); len(changes) != 0 {
		t.Errorf("re-run recorded changes: %v", changes)
	}
	for name, r := range res2.Nodes {
		if r.Action != ActionUnchanged || r.Found != ModeConfigured {
			t.Errorf("%s: %+v on re-run", name, r)
		}
	}
	if fi, _ := os.Stat(res.KubeconfigPath); !fi.ModTime().Equal(past) || res2.KubeconfigWrote {
		t.Error("re-run rewrote the kubeconfig")
	}
}

// changeLog records the changes a converge reports, from any goroutine.
type changeLog struct {
	mu   sync.Mutex
	list []string
}

// record is a Mutator that notes each change before running it.
func (l *changeLog) record(what string, fn func() error) error {
	l.mu.Lock()
	l.list = append(l.list, what)
	l.mu.Unlock()
	return fn()
}

// take returns the changes recorded so far and forgets them.
func (l *changeLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.list
	l.list = nil
	return out
}

// killAt returns a Mutator that behaves like a process killed at the first
// change whose description starts with prefix: before it runs, or right
// after it ran.
func killAt(prefix string, after bool, cancel context.CancelFunc) Mutator {
	return func(what string, fn func() error) error {
		if !strings.HasPrefix(what, prefix) {
			return fn()
		}
		if after {
			if err := fn(); err != nil {
				return err
			}
		}
		cancel()
		return context.Canceled
	}
}

func TestConvergeResumesAfterKillBeforeBootstrap(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 3, workers: 1})
	ctx := testCtx(t)
	kctx, kill := context.WithCancel(ctx)
	if _, err := h.converge(kctx, killAt("bootstrap etcd", false, kill)); !errors.Is(err, context.Canceled) {
		t.Fatalf("killed run: %v", err)
	}
	first, _ := h.counters()
	if first.Applies != 4 || first.BootstrapCalls != 0 {
		t.Fatalf("killed run: %d applies, %d bootstrap calls", first.Applies, first.BootstrapCalls)
	}
	res, err := h.converge(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	total, byNode := h.counters()
	if total.Applies != first.Applies {
		t.Errorf("resume re-applied: %d applies after %d", total.Applies, first.Applies)
	}
	if total.Bootstraps != 1 || byNode["cp-1"].Bootstraps != 1 || !res.Bootstrapped {
		t.Errorf("bootstraps %d (cp-1 %d), want exactly one on cp-1", total.Bootstraps, byNode["cp-1"].Bootstraps)
	}
}

func TestConvergeResumesAfterKillRightAfterBootstrap(t *testing.T) {
	t.Parallel()
	// etcd takes a while to come up, so the resumed run finds it not yet
	// answering and must still not start a second cluster.
	h := newHarness(t, harnessOptions{controlPlanes: 3, profile: talossim.Profile{
		Name: "slow-etcd", Install: 10 * time.Millisecond, Reboot: 10 * time.Millisecond,
		EtcdStart: 400 * time.Millisecond, EtcdJoin: 100 * time.Millisecond, KubeletReady: 10 * time.Millisecond,
	}})
	ctx := testCtx(t)
	kctx, kill := context.WithCancel(ctx)
	if _, err := h.converge(kctx, killAt("bootstrap etcd", true, kill)); !errors.Is(err, context.Canceled) {
		t.Fatalf("killed run: %v", err)
	}
	res, err := h.converge(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	total, byNode := h.counters()
	if total.Bootstraps != 1 || byNode["cp-1"].Bootstraps != 1 || res.Bootstrapped {
		t.Errorf("bootstraps %d (cp-1 %d), resumed run bootstrapped=%v; want one, from the killed run", total.Bootstraps, byNode["cp-1"].Bootstraps, res.Bootstrapped)
	}
	if byNode["cp-2"].BootstrapCalls+byNode["cp-3"].BootstrapCalls != 0 {
		t.Error("Bootstrap was called on another control plane")
	}
	if len(h.sim.SplitBrains()) != 0 {
		t.Errorf("split brain: %v", h.sim.SplitBrains())
	}
}

func TestForeignNodeRefused(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1, workers: 1})
	ctx := testCtx(t)
	wk, _ := h.res.Node("wk-1")

	// Another cluster (another bundle) has already installed its control
	// plane on the machine at wk-1's address.
	otherOpts := h.opts
	otherOpts.Dir = clusterDir(t, "other-secrets.yaml")
	otherOpts.ClusterName = "other"
	otherOpts.VIP = ""
	otherOpts.Nodes = []Node{{Name: "other-cp", Role: RoleControlPlane, IP: wk.IP, DiskBus: "virtio"}}
	other, err := Generate(otherOpts)
	if err != nil {
		t.Fatal(err)
	}
	otherOps, err := NewOps(OpsOptions{Talosconfig: other.Talosconfig, PollInterval: 10 * time.Millisecond, InstallTimeout: 10 * time.Second, Log: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	on := other.Nodes[0]
	if _, err := otherOps.EnsureConfig(ctx, Target{Name: on.Name, IP: on.IP, Role: on.Role, Config: on.Config, InstallDisk: on.InstallDisk}, EnsureOptions{}); err != nil {
		t.Fatalf("installing the other cluster's node: %v", err)
	}

	_, err = h.converge(ctx, nil)
	var foreign *ForeignNodeError
	if !errors.As(err, &foreign) {
		t.Fatalf("err = %v, want ForeignNodeError", err)
	}
	if foreign.Name != "wk-1" || !strings.Contains(err.Error(), "talosctl reset") || !strings.Contains(err.Error(), h.res.SecretsPath) {
		t.Errorf("error does not name the node and how to reset it: %v", err)
	}
	_, byNode := h.counters()
	if byNode["wk-1"].Applies != 1 {
		t.Errorf("wk-1 got %d applies, want only the other cluster's", byNode["wk-1"].Applies)
	}
	// The control planes were fine: etcd is bootstrapped without waiting
	// for the workers (a worker only gets its API once etcd runs when the
	// endpoint is a VIP), and the foreign worker is still refused.
	if string(h.node("wk-1").Config()) != string(on.Config) {
		t.Error("the foreign node's config was changed")
	}
}

func TestLongRebootIsWaitedOut(t *testing.T) {
	t.Parallel()
	slow := talossim.Faults{ExtraRebootDelay: 1500 * time.Millisecond}
	h := newHarness(t, harnessOptions{controlPlanes: 1, workers: 1,
		faults: map[string]talossim.Faults{"cp-1": slow, "wk-1": slow},
		ops:    OpsOptions{InstallTimeout: 10 * time.Second}})
	start := time.Now()
	res, err := h.converge(testCtx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) < 1500*time.Millisecond {
		t.Errorf("converged in %s, faster than the reboot", time.Since(start))
	}
	if res.Nodes["cp-1"].Action != ActionInstalled || res.Nodes["wk-1"].Action != ActionInstalled {
		t.Errorf("results %+v", res.Nodes)
	}
	total, _ := h.counters()
	if total.Applies != 2 {
		t.Errorf("%d applies: the long reboot must not trigger re-applies", total.Applies)
	}
}

func TestRebootLongerThanTheWaitFails(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1,
		faults: map[string]talossim.Faults{"cp-1": {ExtraRebootDelay: 5 * time.Second}},
		ops:    OpsOptions{InstallTimeout: 500 * time.Millisecond}})
	start := time.Now()
	_, err := h.converge(testCtx(t), nil)
	if !errors.Is(err, wait.ErrTimeout) || !strings.Contains(err.Error(), "cp-1") {
		t.Fatalf("err = %v, want a timeout naming cp-1", err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("wait not bounded: %s", el)
	}
}

func TestBootstrapFailedPreconditionIsRetried(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 3,
		faults: map[string]talossim.Faults{"cp-1": {BootstrapNotReady: 3}}})
	res, err := h.converge(testCtx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, byNode := h.counters()
	if c := byNode["cp-1"]; c.BootstrapCalls != 4 || c.Bootstraps != 1 || !res.Bootstrapped {
		t.Errorf("cp-1 bootstrap calls %d, accepted %d; want 3 refused then 1 accepted", c.BootstrapCalls, c.Bootstraps)
	}
	if byNode["cp-2"].BootstrapCalls+byNode["cp-3"].BootstrapCalls != 0 {
		t.Error("Bootstrap was called on another control plane")
	}
}

func TestInstallCrashIsReapplied(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1, workers: 1,
		faults: map[string]talossim.Faults{"wk-1": {CrashDuringInstall: 1}}})
	res, err := h.converge(testCtx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, byNode := h.counters()
	if byNode["wk-1"].Applies != 2 || byNode["wk-1"].InstallCrashes != 1 || res.Nodes["wk-1"].Attempts != 2 {
		t.Errorf("wk-1: %+v, result %+v; want one crash and one re-apply", byNode["wk-1"], res.Nodes["wk-1"])
	}
	if byNode["cp-1"].Applies != 1 {
		t.Errorf("cp-1 applies %d", byNode["cp-1"].Applies)
	}
}

func TestSlowApplyIsNotRepeated(t *testing.T) {
	t.Parallel()
	// The apply outlives the call's timeout, but the node goes ahead with it.
	h := newHarness(t, harnessOptions{controlPlanes: 1,
		faults: map[string]talossim.Faults{"cp-1": {ApplyDelay: 600 * time.Millisecond}},
		ops:    OpsOptions{ApplyTimeout: 200 * time.Millisecond}})
	if _, err := h.converge(testCtx(t), nil); err != nil {
		t.Fatal(err)
	}
	if c := h.node("cp-1").Counters(); c.Applies != 1 {
		t.Errorf("cp-1 applies %d, want 1", c.Applies)
	}
}

func TestMissingInstallDiskStopsBeforeApply(t *testing.T) {
	t.Parallel()
	// Workers get virtio disks (/dev/vda) but the config says /dev/sda.
	h := newHarness(t, harnessOptions{controlPlanes: 1, workers: 1})
	targets := h.targets()
	for i := range targets {
		if targets[i].Name == "wk-1" {
			targets[i].InstallDisk = "/dev/sda"
		}
	}
	_, err := h.ops.EnsureConfig(testCtx(t), targets[1], EnsureOptions{})
	if err == nil || !strings.Contains(err.Error(), "no writable install disk /dev/sda") || !strings.Contains(err.Error(), "/dev/vda") {
		t.Fatalf("err = %v", err)
	}
	if c := h.node("wk-1").Counters(); c.Applies != 0 {
		t.Errorf("applied despite the missing disk")
	}
}

// Nodes booted from the factory's disk image converge with no install and
// no reboot, each apply reported as configuring the node where it runs; a
// second converge changes nothing.
func TestConvergeNodesBootedFromTheImage(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1, workers: 1, workerBus: "scsi", image: &talossim.DiskImage{Version: "v1.13.3"}})
	ctx := testCtx(t)
	var log changeLog
	record := log.record
	res, err := h.converge(ctx, record)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cp-1", "wk-1"} {
		if c := h.node(name).Counters(); c.Installs != 0 || c.Reboots != 0 || c.ImageBoots != 1 || c.MaintenanceApplies != 1 {
			t.Errorf("%s: counters %+v", name, c)
		}
		if r := res.Nodes[name]; r.Action != ActionInstalled || !r.FromImage {
			t.Errorf("%s: %+v", name, r)
		}
	}
	if changes := log.take(); strings.Count(strings.Join(changes, "\n"), "runs Talos from the disk image on /dev/sda: no install, no reboot") != 2 {
		t.Errorf("not 2 changes say a node was configured in place: %v", changes)
	}
	again, err := h.converge(ctx, record)
	if changes := log.take(); err != nil || len(changes) != 0 || again.Bootstrapped {
		t.Errorf("second converge: %v %v", changes, err)
	}
}

// A node booted from the image whose config installs to another disk than
// the one the image is on is refused before the apply: Talos would put
// STATE and EPHEMERAL on the image's disk and upgrades would install to it.
func TestImageOnAnotherDiskThanTheInstallDisk(t *testing.T) {
	t.Parallel()
	// wk-1's image is on its first disk, /dev/sda; its config installs to
	// its second, /dev/vda.
	h := newHarness(t, harnessOptions{controlPlanes: 1, workers: 1, workerBus: "scsi", image: &talossim.DiskImage{Version: "v1.13.3"},
		extraDisk: map[string]talossim.Disk{"wk-1": {Bus: "virtio", Size: 64 << 30}}})
	targets := h.targets()
	for i := range targets {
		if targets[i].Name == "wk-1" {
			targets[i].InstallDisk = "/dev/vda"
		}
	}
	_, err := h.ops.EnsureConfig(testCtx(t), targets[1], EnsureOptions{})
	if err == nil || !strings.Contains(err.Error(), "runs Talos from a disk image on /dev/sda, but its config installs to /dev/vda") {
		t.Fatalf("err = %v", err)
	}
	if c := h.node("wk-1").Counters(); c.Applies != 0 {
		t.Errorf("applied despite the image on another disk")
	}
}

func TestConfigChangeAppliesOnlyWhereItDiffers(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1, workers: 1})
	ctx := testCtx(t)
	if _, err := h.converge(ctx, nil); err != nil {
		t.Fatal(err)
	}
	before, _ := h.counters()

	// A worker-only patch changes wk-1 alone (no reboot needed); a feature
	// outside what CanApplyImmediate takes at once needs a reboot on cp-1.
	patch := writePatch(t, t.TempDir(), "wk.yaml", "machine:\n  sysctls:\n    vm.max_map_count: \"262144\"\n")
	h.opts.Patches.Worker = []string{patch}
	var err error
	if h.res, err = Generate(h.opts); err != nil {
		t.Fatal(err)
	}
	targets := h.targets()
	cp1, _ := h.res.Node("cp-1")
	targets[0].Config = []byte(strings.Replace(string(cp1.Config), "diskQuotaSupport: true", "diskQuotaSupport: false", 1))
	if bytes.Equal(targets[0].Config, cp1.Config) {
		t.Fatal("cp-1's config has no diskQuotaSupport to change")
	}

	// Dry run first: the node's own diff, nothing applied.
	var planned []string
	dry := func(what string, fn func() error) error { planned = append(planned, what); return nil }
	res, err := h.ops.Converge(ctx, ConvergeOptions{Nodes: targets, KubeconfigPath: filepath.Join(h.dir, KubeconfigFile), Mutate: dry, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Planned || !strings.Contains(res.Nodes["wk-1"].Diff, "vm.max_map_count") || res.Nodes["cp-1"].Diff == "" {
		t.Errorf("dry run: planned=%v, results %+v", res.Planned, res.Nodes)
	}
	if after, _ := h.counters(); after.Applies != before.Applies {
		t.Error("dry run applied")
	}
	slices.Sort(planned)
	if len(planned) != 2 || !strings.HasPrefix(planned[0], "apply changed config to cp-1") || !strings.HasPrefix(planned[1], "apply changed config to wk-1") {
		t.Errorf("planned %q (etcd runs and the kubeconfig works: nothing else to do)", planned)
	}

	res, err = h.ops.Converge(ctx, ConvergeOptions{Nodes: targets, KubeconfigPath: filepath.Join(h.dir, KubeconfigFile)})
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Nodes["wk-1"]; r.Action != ActionUpdated || r.Reboot {
		t.Errorf("wk-1: %+v, want updated without reboot", r)
	}
	if r := res.Nodes["cp-1"]; r.Action != ActionUpdated || !r.Reboot {
		t.Errorf("cp-1: %+v, want updated with a reboot", r)
	}
	after, byNode := h.counters()
	if after.Applies-before.Applies != 2 || byNode["cp-1"].Reboots != 2 {
		t.Errorf("applies +%d, cp-1 reboots %d", after.Applies-before.Applies, byNode["cp-1"].Reboots)
	}
	if after.Bootstraps != 1 {
		t.Errorf("bootstraps %d", after.Bootstraps)
	}
}

func TestDryRunOnFreshNodesTouchesNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1, workers: 1})
	var planned []string
	var mu sync.Mutex
	dry := func(what string, fn func() error) error {
		mu.Lock()
		planned = append(planned, what)
		mu.Unlock()
		return nil
	}
	// wk-1's VM is not up yet: a dry run does not wait for it.
	if err := h.sim.StopNode(h.node("wk-1").IP()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := h.ops.Converge(testCtx(t), ConvergeOptions{Nodes: h.targets(), KubeconfigPath: filepath.Join(h.dir, KubeconfigFile), Mutate: dry, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("dry run waited %s", time.Since(start))
	}
	if !res.Planned || res.Nodes["cp-1"].Action != ActionPlanned || res.Nodes["wk-1"].Found != ModeDown {
		t.Errorf("%+v", res)
	}
	slices.Sort(planned)
	want := []string{"apply config to cp-1", "apply config to wk-1", "bootstrap etcd on cp-1", "fetch the kubeconfig"}
	for i, w := range want {
		if i >= len(planned) || !strings.HasPrefix(planned[i], w) {
			t.Fatalf("planned %q, want prefixes %q", planned, want)
		}
	}
	if !strings.Contains(planned[0], "maintenance mode") || !strings.Contains(planned[1], "unreachable") {
		t.Errorf("planned %q", planned)
	}
	total, _ := h.counters()
	if total.Applies != 0 || total.BootstrapCalls != 0 {
		t.Errorf("dry run touched the nodes: %+v", total)
	}
	if _, err := os.Stat(res.KubeconfigPath); err == nil {
		t.Error("dry run wrote a kubeconfig")
	}
}

func TestKubeconfigThatDoesNotReachTheAPIServerFails(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1})
	// The simulated control plane hands out a kubeconfig whose client
	// certificate comes from another cluster's Kubernetes CA.
	otherBundle, err := LoadSecrets("testdata/other-secrets.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	good := h.api.Kubeconfig("lab", h.res.Bundle.Certs.K8s.Crt, h.res.Bundle.Certs.K8s.Key)
	bad := h.api.Kubeconfig("lab", otherBundle.Certs.K8s.Crt, otherBundle.Certs.K8s.Key)
	// Keep the server CA of our bundle so only the client certificate is wrong.
	h.cluster.SetKubeconfig(spliceClientCert(t, good, bad))
	_, err = h.converge(testCtx(t), nil)
	if err == nil || !strings.Contains(err.Error(), "does not work") {
		t.Fatalf("err = %v, want the kubeconfig rejected", err)
	}
	if h.api.Authorized() != 0 {
		t.Error("the API server accepted a foreign client certificate")
	}
}

// spliceClientCert returns good with the user credentials of bad.
func spliceClientCert(t *testing.T, good, bad []byte) []byte {
	t.Helper()
	field := func(b []byte, key string) string {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, key+":") {
				return line
			}
		}
		t.Fatalf("no %s", key)
		return ""
	}
	out := string(good)
	for _, k := range []string{"client-certificate-data", "client-key-data"} {
		out = strings.Replace(out, field(good, k), field(bad, k), 1)
	}
	return []byte(out)
}

func TestNeverBootstrapsASecondNode(t *testing.T) {
	t.Parallel()
	// etcd is bootstrapped on cp-1 by a run that dies right after; the state
	// that recorded it is lost and the config now lists cp-2 first. The other
	// control planes take long to join, so cp-2's etcd is not up yet.
	h := newHarness(t, harnessOptions{controlPlanes: 3, profile: talossim.Profile{
		Name: "slow-join", Install: 10 * time.Millisecond, Reboot: 10 * time.Millisecond,
		EtcdStart: 300 * time.Millisecond, EtcdJoin: 1500 * time.Millisecond, KubeletReady: 10 * time.Millisecond,
	}})
	ctx := testCtx(t)
	kctx, kill := context.WithCancel(ctx)
	if _, err := h.converge(kctx, killAt("bootstrap etcd", true, kill)); !errors.Is(err, context.Canceled) {
		t.Fatalf("killed run: %v", err)
	}
	targets := h.targets()
	targets[0], targets[1] = targets[1], targets[0]
	res, err := h.ops.Converge(ctx, ConvergeOptions{Nodes: targets, KubeconfigPath: filepath.Join(h.dir, KubeconfigFile)})
	if err != nil {
		t.Fatal(err)
	}
	_, byNode := h.counters()
	if byNode["cp-2"].BootstrapCalls != 0 || len(h.sim.SplitBrains()) != 0 {
		t.Errorf("cp-2 got %d bootstrap calls; split brains %v", byNode["cp-2"].BootstrapCalls, h.sim.SplitBrains())
	}
	if res.BootstrapNode != "cp-1" || res.Bootstrapped {
		t.Errorf("bootstrap node %s, bootstrapped %v; want the existing etcd on cp-1", res.BootstrapNode, res.Bootstrapped)
	}
	if total, _ := h.counters(); total.Bootstraps != 1 {
		t.Errorf("%d bootstraps", total.Bootstraps)
	}
}

// TestConvergeParallelism takes one node after another with Parallelism 1
// (in configuration order, each applied only once the one before runs its
// config), and all at once by default.
func TestConvergeParallelism(t *testing.T) {
	t.Parallel()
	for _, par := range []int{1, 0} {
		h := newHarness(t, harnessOptions{controlPlanes: 2, workers: 2,
			profile: talossim.Profile{Name: "slow-install", Install: 150 * time.Millisecond, Reboot: 50 * time.Millisecond, KubeletReady: 10 * time.Millisecond, EtcdStart: 10 * time.Millisecond, EtcdJoin: 10 * time.Millisecond}})
		var (
			mu     sync.Mutex
			events []string
		)
		record := func(e string) {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		}
		_, err := h.ops.Converge(testCtx(t), ConvergeOptions{
			Nodes: h.targets(), KubeconfigPath: filepath.Join(h.dir, KubeconfigFile), Parallelism: par,
			Mutate: func(what string, fn func() error) error {
				if strings.Contains(what, "in maintenance mode") {
					record("apply " + strings.Fields(what)[3])
				}
				return fn()
			},
			OnNodeConverged: func(tg Target, _ EnsureResult) { record("done " + tg.Name) },
		})
		if err != nil {
			t.Fatal(err)
		}
		got := strings.Join(events, ", ")
		if par == 1 {
			want := "apply cp-1, done cp-1, apply cp-2, done cp-2, apply wk-1, done wk-1, apply wk-2, done wk-2"
			if got != want {
				t.Errorf("parallelism 1: %s\nwant %s", got, want)
			}
		} else if !strings.HasPrefix(got, "apply") || strings.Index(got, "done") < strings.LastIndex(got, "apply") {
			t.Errorf("parallelism 0: nodes were not configured at once: %s", got)
		}
	}
}

// TestMaintenanceApplyRefusedIsRetried drops the node's connections just
// as the maintenance apply is sent: the config never reached the node, so
// it must be applied again once the node answers, not waited on forever.
func TestMaintenanceApplyRefusedIsRetried(t *testing.T) {
	t.Parallel()
	// Polls slower than the drop: the next probe finds the node in
	// maintenance mode again, as if nothing had happened.
	h := newHarness(t, harnessOptions{controlPlanes: 1, workers: 1, ops: OpsOptions{PollInterval: 400 * time.Millisecond, InstallTimeout: 8 * time.Second}})
	var (
		once     sync.Once
		recorded atomic.Int32
	)
	ctx := testCtx(t)
	_, err := h.ops.Converge(ctx, ConvergeOptions{
		Nodes: h.targets(), KubeconfigPath: filepath.Join(h.dir, KubeconfigFile),
		Mutate: func(what string, fn func() error) error {
			if !strings.Contains(what, "wk-1") || !strings.Contains(what, "maintenance mode") {
				return fn()
			}
			once.Do(func() {
				n := h.node("wk-1")
				n.SetFaults(talossim.Faults{RefuseConnections: true})
				time.AfterFunc(100*time.Millisecond, func() { n.SetFaults(talossim.Faults{}) })
			})
			err := fn()
			if err == nil {
				recorded.Add(1)
			}
			return err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := recorded.Load(); n != 1 {
		t.Errorf("the maintenance apply of wk-1 was recorded as done %d times, want once", n)
	}
	if c := h.node("wk-1").Counters(); c.MaintenanceApplies != 1 || c.Installs != 1 {
		t.Errorf("wk-1: %d maintenance applies, %d installs; want 1 each", c.MaintenanceApplies, c.Installs)
	}
}

// A node whose API refuses connections for a moment (its apid restarting,
// a flaky link) does not fail a read of its extensions: TestFaults met one
// between the install and the schematic check.
func TestExtensionsReadThroughAConnectionDrop(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1})
	ctx := testCtx(t)
	if _, err := h.converge(ctx, nil); err != nil {
		t.Fatal(err)
	}
	n := h.node("cp-1")
	f := n.Faults()
	f.RefuseConnections = true
	n.SetFaults(f)
	go func() {
		time.Sleep(400 * time.Millisecond)
		f := n.Faults()
		f.RefuseConnections = false
		n.SetFaults(f)
	}()
	ip := h.targets()[0].IP
	if _, err := h.ops.Extensions(ctx, ip); err != nil {
		t.Fatalf("a 400ms connection drop failed the read: %v", err)
	}
}

// TestKubeconfigRenewedInItsLast30Days: a kept kubeconfig that still
// reaches the API server but whose client certificate expires within 30
// days is replaced by a freshly fetched one (the talosconfig's rule), not
// kept until it expired; one with a year left is kept.
func TestKubeconfigRenewedInItsLast30Days(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1})
	ctx := testCtx(t)
	res, err := h.converge(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The same kubeconfig with a client certificate of the cluster's CA
	// that expires in ten days: it still works.
	ca, err := x509.NewCertificateAuthorityFromCertificateAndKey(h.res.Bundle.Certs.K8s)
	if err != nil {
		t.Fatal(err)
	}
	soon, err := x509.NewKeyPair(ca, x509.CommonName("admin"), x509.Organization("system:masters"),
		x509.NotAfter(time.Now().Add(10*24*time.Hour)), x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageClientAuth}))
	if err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.LoadFromFile(res.KubeconfigPath)
	if err != nil {
		t.Fatal(err)
	}
	ai := kc.AuthInfos[kc.Contexts[kc.CurrentContext].AuthInfo]
	ai.ClientCertificateData, ai.ClientKeyData = soon.CrtPEM, soon.KeyPEM
	if err := clientcmd.WriteToFile(*kc, res.KubeconfigPath); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(res.KubeconfigPath)
	if _, err := CheckAPIServer(ctx, data, time.Second); err != nil {
		t.Fatalf("the ten-day kubeconfig does not work: %v", err)
	}
	var log changeLog
	record := log.record
	res, err = h.converge(ctx, record)
	if err != nil {
		t.Fatal(err)
	}
	data, _ = os.ReadFile(res.KubeconfigPath)
	exp, err := KubeconfigCertExpiry(data)
	if err != nil || time.Until(exp) < 300*24*time.Hour || !res.KubeconfigWrote {
		t.Fatalf("after a run the kubeconfig expires %s (%v), wrote %v: want it renewed", exp, err, res.KubeconfigWrote)
	}
	if changes := log.take(); len(changes) != 1 || !strings.HasPrefix(changes[0], "renew kubeconfig ") {
		t.Fatalf("changes %q, want the renewal", changes)
	}
	// A year left: kept.
	res, err = h.converge(ctx, record)
	if changes := log.take(); err != nil || res.KubeconfigWrote || len(changes) != 0 {
		t.Fatalf("a run with a year left: %v, wrote %v, changes %q", err, res.KubeconfigWrote, changes)
	}
}
