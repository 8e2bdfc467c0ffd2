package stages

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/homelab/bootstrap/backup"
	"github.com/homelab/bootstrap/backup/backuptest"
	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/lab/talossim"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/talos"
	"github.com/homelab/bootstrap/talos/talostest"
	"github.com/homelab/bootstrap/ui"
)

// talosLab is a config for a 1 CP + 1 worker cluster on a random loopback
// /24, its VMs booted in talossim, and a stand-in API server whose CA is the
// bundle's Kubernetes CA.
type talosLab struct {
	cfg *config.Config
	st  *state.State
	sim *talossim.Sim
	ips map[string]string
	out bytes.Buffer
	api *talostest.APIServer
}

func newTalosLab(t *testing.T) *talosLab {
	t.Helper()
	prefix, err := talossim.RandomLoopbackPrefix(50000)
	if err != nil {
		t.Fatal(err)
	}
	ip := func(last byte) string { return talossim.HostAddr(prefix, last) }
	l := &talosLab{ips: map[string]string{"cp-1": ip(11), "wk-1": ip(21)}}
	dir := t.TempDir()
	yaml := fmt.Sprintf(`cluster:
  name: lab
  endpoint: https://%[1]s:6443
  # The stock installer: these tests are not about Image Factory images.
  installImage: ghcr.io/siderolabs/installer:v1.13.3
  timeouts: {call: 3s, install: 15s, bootstrap: 15s, health: 15s}
  network: {cidr: %[3]s, gateway: %[4]s, nameservers: [%[4]s]}
  patches:
    worker: [patches/worker.yaml]
nodes:
  - {name: cp-1, role: controlplane, vmid: 701, ip: %[1]s, cores: 2, memoryMiB: 4096, diskGiB: 32}
  - {name: wk-1, role: worker, vmid: 711, ip: %[2]s, cores: 2, memoryMiB: 4096, diskGiB: 32}
`, l.ips["cp-1"], l.ips["wk-1"], prefix, ip(1))
	path := filepath.Join(dir, "bootstrap.yaml")
	os.MkdirAll(filepath.Join(dir, "patches"), 0o755)
	os.WriteFile(filepath.Join(dir, "patches", "worker.yaml"), []byte("machine:\n  sysctls:\n    fs.inotify.max_user_watches: \"524288\"\n"), 0o644)
	l.cfg, err = config.Parse(path, []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	paths := l.cfg.Paths()
	// The bundle fixture stands for one generated earlier, so the API
	// server below can use its Kubernetes CA.
	os.MkdirAll(paths.TalosDir, 0o700)
	bundle, err := os.ReadFile(filepath.Join("..", "talos", "testdata", "secrets.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(paths.Secrets, bundle, 0o600)

	// What provision recorded: wk-1's disk is virtio; cp-1 has no record.
	l.st = state.New("lab")
	l.st.Outputs.Nodes = map[string]state.Node{"wk-1": {Name: "wk-1", Role: "worker", VMID: 711, IP: l.ips["wk-1"], DiskBus: "virtio"}}

	b, err := talos.LoadSecrets(paths.Secrets, nil)
	if err != nil {
		t.Fatal(err)
	}
	api := talostest.NewAPIServer(t, b.Certs.K8s.Crt, b.Certs.K8s.Key,
		talostest.Node{Name: "cp-1", IP: l.ips["cp-1"], ControlPlane: true}, talostest.Node{Name: "wk-1", IP: l.ips["wk-1"]})
	l.api = api
	cluster := talossim.NewMemoryCluster(api.Kubeconfig("lab", b.Certs.K8s.Crt, b.Certs.K8s.Key))
	cluster.SetSnapshot(backuptest.Snapshot(t, 7))
	l.sim = talossim.New(talossim.Options{Cluster: cluster, Log: zerolog.New(zerolog.NewTestWriter(t))})
	t.Cleanup(func() { l.sim.Close() })
	for name, bus := range map[string]string{"cp-1": "scsi", "wk-1": "virtio"} {
		n, err := l.sim.BootNode(context.Background(), talossim.NodeSpec{IP: l.ips[name], Hostname: name, Disks: []talossim.Disk{{Bus: bus, Size: 32 << 30}}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = n.WaitPhase(ctx, talossim.PhaseMaintenance)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	return l
}

func (l *talosLab) env(t *testing.T, dryRun, merge bool) *Env {
	log := zerolog.New(zerolog.NewTestWriter(t))
	l.out.Reset()
	return &Env{Config: l.cfg, Paths: l.cfg.Paths(), State: l.st, Log: log, UI: ui.NewReporter(log), Out: &l.out,
		DryRun: dryRun, Options: Options{MergeConfigs: merge}, Now: time.Now}
}

func (l *talosLab) applies() (applies, bootstraps int) {
	for _, n := range l.sim.Nodes() {
		c := n.Counters()
		applies += c.Applies
		bootstraps += c.Bootstraps
	}
	return applies, bootstraps
}

func actions(env *Env) string {
	var out []string
	for _, c := range env.Changes() {
		out = append(out, c.Action)
	}
	return strings.Join(out, "\n")
}

func TestTalosStage(t *testing.T) {
	l := newTalosLab(t)
	home := t.TempDir()
	t.Setenv("HOME", home)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	paths := l.cfg.Paths()

	// Dry run on fresh VMs: a plan, nothing touched.
	env := l.env(t, true, true)
	if err := (TalosStage{}).Run(ctx, env); err != nil {
		t.Fatal(err)
	}
	plan := actions(env)
	for _, want := range []string{"write Talos configs in " + paths.TalosDir, "apply config to cp-1", "apply config to wk-1", "(installs Talos to /dev/vda", "bootstrap etcd on cp-1", "fetch the kubeconfig", "merge this cluster's context into " + filepath.Join(home, ".talos", "config"), "merge the kubeconfig into"} {
		if !strings.Contains(plan, want) {
			t.Errorf("dry-run plan lacks %q:\n%s", want, plan)
		}
	}
	if !strings.Contains(l.out.String(), "node wk-1") {
		t.Errorf("dry run printed no per-node plan:\n%s", l.out.String())
	}
	if a, b := l.applies(); a+b != 0 {
		t.Fatalf("dry run applied %d / bootstrapped %d", a, b)
	}
	if _, err := os.Stat(paths.Talosconfig); err == nil {
		t.Fatal("dry run wrote the talosconfig")
	}

	// First real run converges and records what it did.
	env = l.env(t, false, true)
	if err := (TalosStage{}).Run(ctx, env); err != nil {
		t.Fatal(err)
	}
	if a, b := l.applies(); a != 2 || b != 1 {
		t.Errorf("first run: %d applies, %d bootstraps", a, b)
	}
	wk := l.st.Outputs.Nodes["wk-1"]
	if wk.InstallDisk != "/dev/vda" || wk.ConfigSHA256 == "" || wk.AppliedAt.IsZero() || wk.VMID != 711 {
		t.Errorf("wk-1 state %+v", wk)
	}
	if cp := l.st.Outputs.Nodes["cp-1"]; cp.InstallDisk != "/dev/sda" || cp.IP != l.ips["cp-1"] {
		t.Errorf("cp-1 state %+v", cp)
	}
	if l.st.Outputs.Talos.BootstrapNode != "cp-1" || l.st.Outputs.Talos.KubeconfigPath != paths.Kubeconfig {
		t.Errorf("talos outputs %+v", l.st.Outputs.Talos)
	}
	saved, err := state.Load(paths.StateDir, "lab")
	if err != nil || saved.Outputs.Talos.BootstrapNode != "cp-1" || saved.Outputs.Nodes["wk-1"].ConfigSHA256 == "" {
		t.Errorf("state not saved mid-stage: %+v %v", saved, err)
	}
	if fi, err := os.Stat(paths.Kubeconfig); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("kubeconfig: %v", err)
	}
	kc, err := clientcmd.LoadFromFile(filepath.Join(home, ".kube", "config"))
	if err != nil || kc.CurrentContext != "admin@lab" {
		t.Errorf("merged kubeconfig: %v", err)
	}
	if _, err := os.Stat(filepath.Join(home, ".talos", "config")); err != nil {
		t.Errorf("merged talosconfig: %v", err)
	}

	// Second run: nothing to do, nothing recorded.
	env = l.env(t, false, true)
	if err := (TalosStage{}).Run(ctx, env); err != nil {
		t.Fatal(err)
	}
	if got := actions(env); got != "" {
		t.Errorf("second run changed:\n%s", got)
	}
	if a, b := l.applies(); a != 2 || b != 1 {
		t.Errorf("second run: %d applies, %d bootstraps in total", a, b)
	}

	// A changed worker patch: the dry run shows the node's own diff.
	os.WriteFile(filepath.Join(paths.Base, "patches", "worker.yaml"), []byte("machine:\n  sysctls:\n    fs.inotify.max_user_watches: \"1048576\"\n"), 0o644)
	// An extra SAN changes cp-1's machine.certSANs, right below its CA key:
	// the diff's context must not show the key.
	l.cfg.Cluster.SANs = []string{"lab.example"}
	env = l.env(t, true, false)
	env.Secrets = &redact.Set{}
	if err := (TalosStage{}).Run(ctx, env); err != nil {
		t.Fatal(err)
	}
	t.Logf("dry-run output:\n%s", l.out.String())
	if !strings.Contains(l.out.String(), "node wk-1") || !strings.Contains(l.out.String(), `+        fs.inotify.max_user_watches: "1048576"`) {
		t.Errorf("dry run output:\n%s", l.out.String())
	}
	b, _ := talos.LoadSecrets(paths.Secrets, nil)
	osKey := base64.StdEncoding.EncodeToString(b.Certs.OS.Key)
	if !strings.Contains(l.out.String(), "node cp-1 (") || !strings.Contains(l.out.String(), "+        - lab.example") {
		t.Errorf("cp-1's diff missing:\n%s", l.out.String())
	}
	if strings.Contains(l.out.String(), osKey) || !strings.Contains(l.out.String(), redact.Mask) {
		t.Error("the dry-run diff shows the OS CA key")
	}
	if !strings.Contains(actions(env), "apply changed config to wk-1") || !strings.Contains(actions(env), "apply changed config to cp-1") || strings.Contains(actions(env), "bootstrap") {
		t.Errorf("plan:\n%s", actions(env))
	}
	if a, _ := l.applies(); a != 2 {
		t.Error("dry run applied")
	}
}

// TestTalosVersionBumpUpgradesTheNodes: a bumped cluster.talosVersion is
// planned as upgrades (dry run: nothing called), then carried out with the
// Upgrade RPC, control planes first; the nodes then run the new version, a
// re-run changes nothing, a downgrade is refused as a user error without
// any Upgrade call, and an installer that cannot be pulled stops the
// rollout with the node on its old version.
func TestTalosVersionBumpUpgradesTheNodes(t *testing.T) {
	l := newTalosLab(t)
	t.Setenv("HOME", t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := (TalosStage{}).Run(ctx, l.env(t, false, false)); err != nil {
		t.Fatal(err)
	}
	upgradeCalls := func() (calls, accepted int) {
		for _, n := range l.sim.Nodes() {
			c := n.Counters()
			calls += c.UpgradeCalls
			accepted += c.Upgrades
		}
		return calls, accepted
	}
	// An explicit installer is the user's to move with the version.
	l.cfg.Cluster.TalosVersion, l.cfg.Cluster.InstallImage = "v1.13.9", "ghcr.io/siderolabs/installer:v1.13.9"
	dry := l.env(t, true, false)
	if err := (TalosStage{}).Run(ctx, dry); err != nil {
		t.Fatal(err)
	}
	plan := actions(dry)
	for _, want := range []string{"take an etcd snapshot before upgrading Talos", "upgrade Talos on cp-1 v1.13.3 → v1.13.9 (1/2, control planes first)", "upgrade Talos on wk-1 v1.13.3 → v1.13.9 (2/2, workers after the control planes)"} {
		if !strings.Contains(plan, want) {
			t.Fatalf("dry-run plan lacks %q:\n%s", want, plan)
		}
	}
	if calls, _ := upgradeCalls(); calls != 0 {
		t.Fatalf("a dry run made %d Upgrade calls", calls)
	}

	env := l.env(t, false, false)
	if err := (TalosStage{}).Run(ctx, env); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(actions(env), "apply changed config to cp-1") || strings.Index(actions(env), "upgrade Talos on cp-1") > strings.Index(actions(env), "upgrade Talos on wk-1") {
		t.Fatalf("apply then upgrade, control plane first:\n%s", actions(env))
	}
	for _, n := range l.sim.Nodes() {
		if n.Version() != "v1.13.9" || n.Counters().Upgrades != 1 {
			t.Errorf("node %s runs %s after %d upgrades", n.IP(), n.Version(), n.Counters().Upgrades)
		}
	}
	// v1.13 nodes went through the LifecycleService: each was cordoned
	// and drained before its reboot, and uncordoned after it.
	if p := l.api.NodePatches(); p != 4 || l.api.Unschedulable("cp-1") || l.api.Unschedulable("wk-1") {
		t.Fatalf("%d Node patches (want a cordon and an uncordon per node); cordoned: cp-1 %v, wk-1 %v", p, l.api.Unschedulable("cp-1"), l.api.Unschedulable("wk-1"))
	}
	if !strings.Contains(actions(env), "take an etcd snapshot before upgrading Talos") || strings.Index(actions(env), "take an etcd snapshot") > strings.Index(actions(env), "upgrade Talos on cp-1") {
		t.Fatalf("no etcd snapshot before the first node:\n%s", actions(env))
	}
	if kept, _ := backup.List(BackupDir(env)); len(kept) != 1 {
		t.Fatalf("etcd snapshots kept: %v", kept)
	}
	if v := l.st.Outputs.Nodes["cp-1"].TalosVersion; v != "v1.13.9" {
		t.Errorf("recorded version %q", v)
	}
	again := l.env(t, false, false)
	if err := (TalosStage{}).Run(ctx, again); err != nil || actions(again) != "" {
		t.Fatalf("re-run: %v\n%s", err, actions(again))
	}

	// Back to v1.13.3: a downgrade, refused before any call.
	l.cfg.Cluster.TalosVersion, l.cfg.Cluster.InstallImage = "v1.13.3", "ghcr.io/siderolabs/installer:v1.13.3"
	before, _ := upgradeCalls()
	err := (TalosStage{}).Run(ctx, l.env(t, false, false))
	if err == nil || !config.IsUserError(err) || !strings.Contains(err.Error(), "downgrade is refused") {
		t.Fatalf("downgrade: %v", err)
	}
	if after, _ := upgradeCalls(); after != before {
		t.Fatalf("a refused downgrade made %d Upgrade calls", after-before)
	}

	// v1.13.10 with an installer the control plane cannot pull.
	l.cfg.Cluster.TalosVersion, l.cfg.Cluster.InstallImage = "v1.13.10", "ghcr.io/siderolabs/installer:v1.13.10"
	cp, _ := l.sim.Node(l.ips["cp-1"])
	cp.SetFaults(talossim.Faults{UpgradePullFails: 1})
	err = (TalosStage{}).Run(ctx, l.env(t, false, false))
	if err == nil || !strings.Contains(err.Error(), "pulling the installer ghcr.io/siderolabs/installer:v1.13.10 on cp-1") || !strings.Contains(err.Error(), "rollout stopped at cp-1 (1/2)") {
		t.Fatalf("pull failure: %v", err)
	}
	wk, _ := l.sim.Node(l.ips["wk-1"])
	if cp.Version() != "v1.13.9" || wk.Version() != "v1.13.9" {
		t.Fatalf("after a failed pull: cp-1 %s, wk-1 %s; want both untouched", cp.Version(), wk.Version())
	}
	// The next run (the registry reachable again) finishes the job.
	if err := (TalosStage{}).Run(ctx, l.env(t, false, false)); err != nil {
		t.Fatal(err)
	}
	if cp.Version() != "v1.13.10" || wk.Version() != "v1.13.10" {
		t.Fatalf("after resuming: cp-1 %s, wk-1 %s", cp.Version(), wk.Version())
	}

	// v1.13.11, and wk-1's installer fails: on v1.13 it runs through the
	// LifecycleService beside the running node, which streams its exit
	// code (internal/app/lifecycle/lifecycle.go at v1.14.0-rc.1). Nothing
	// changed on wk-1: no drain, no reboot, still v1.13.10; the run says
	// so and asks nobody to reboot anything. (A v1.12 node's legacy
	// sequence that fails and reboots itself: talos.TestUpgradeRolledBack,
	// e2e TestKubernetesUpgradeAfterATalosMinor.)
	l.cfg.Cluster.TalosVersion, l.cfg.Cluster.InstallImage = "v1.13.11", "ghcr.io/siderolabs/installer:v1.13.11"
	wk.SetFaults(talossim.Faults{UpgradeSequenceFails: 1})
	rebootsBefore, rebootCallsBefore := wk.Counters().Reboots, wk.Counters().RebootCalls
	err = (TalosStage{}).Run(ctx, l.env(t, false, false))
	var ie *talos.InstallerFailedError
	if !errors.As(err, &ie) || !strings.Contains(err.Error(), "its installer exited with code 1") ||
		!strings.Contains(err.Error(), "neither drained nor rebooted and runs Talos v1.13.10 as before") ||
		!strings.Contains(err.Error(), "rollout stopped at wk-1 (2/2)") || strings.Contains(err.Error(), "talosctl") {
		t.Fatalf("failed installer: %v", err)
	}
	c := wk.Counters()
	if cp.Version() != "v1.13.11" || wk.Version() != "v1.13.10" || c.FailedUpgrades != 1 || c.Reboots != rebootsBefore || c.RebootCalls != rebootCallsBefore {
		t.Fatalf("after the failed installer: cp-1 %s, wk-1 %s (%+v)", cp.Version(), wk.Version(), c)
	}
	if s := wk.ServiceStates(); s["cri"] != "Running" || s["kubelet"] != "Running" {
		t.Fatalf("wk-1 after its failed installer, services %v", s)
	}
	// The next run (the installer fixed) upgrades it.
	env = l.env(t, false, false)
	if err := (TalosStage{}).Run(ctx, env); err != nil {
		t.Fatal(err)
	}
	if wk.Version() != "v1.13.11" {
		t.Fatalf("after the run that follows: wk-1 runs %s (%+v)\n%s", wk.Version(), wk.Counters(), actions(env))
	}
}
