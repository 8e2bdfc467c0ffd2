package e2e_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/factory"
)

// checkRow is the table line of a check in a run's output.
func checkRow(out, name string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, name+" ") {
			return l
		}
	}
	return ""
}

// TestSchematicDrivesISOAndInstaller: with the default schematic (the
// guest agent) the lab's Image Factory gets the schematic registered, the
// VMs boot its nocloud ISO with agent: 1, the nodes install its installer
// and postcheck sees the extension loaded and the agent answering. Adding
// the N100's extensions is an upgrade in place, one node at a time; a
// misspelt extension then fails `config validate` from the cached list,
// with no call.
func TestSchematicDrivesISOAndInstaller(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 6*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 3, Workers: 1})
	f := h.Lab.Factory
	def := factory.New([]string{factory.GuestAgent}, nil)
	img := factory.Images{Factory: f.URL(), ID: def.MustID(), Version: "v1.13.3"}

	r := run(t, ctx, h, "run", "--stage", "all")
	if r.ExitCode != 0 {
		t.Fatalf("run:\n%s", r.Tail(60))
	}
	if err := h.PostcheckGreen(); err != nil {
		t.Fatal(err)
	}
	if c := f.Counts(); c.SchematicPosts != 1 || c.ISODownloads != 1 {
		t.Errorf("factory: %+v; want the schematic registered once and its ISO downloaded once", c)
	}
	if !strings.Contains(r.Stdout+r.Stderr, "register schematic "+factory.ShortID(img.ID)+" (siderolabs/qemu-guest-agent) with "+f.URL()) {
		t.Errorf("no registration in the output:\n%s", r.Tail(60))
	}
	for _, n := range h.Config().Nodes {
		vm, ok := h.Lab.PVE.VM(n.VMID)
		if !ok {
			t.Fatalf("VM %d missing", n.VMID)
		}
		// The VM booted the ISO, which the talos stage ejected once Talos
		// ran from the disk (a VM holding a local ISO cannot migrate).
		if vm.Config["agent"] != "1" || vm.Config["ide2"] != "none,media=cdrom" ||
			!strings.Contains(r.Stdout+r.Stderr, fmt.Sprintf("eject the Talos ISO from VM %d %s", n.VMID, n.Name)) {
			t.Errorf("VM %d: agent %q, ide2 %q; want agent 1 and the ISO %s ejected by the run:\n%s", n.VMID, vm.Config["agent"], vm.Config["ide2"], img.ISOFile(), r.Tail(40))
		}
	}
	for _, n := range h.Lab.Talos.Nodes() {
		if cfg := string(h.Lab.Talos.Installed(n.IP())); !strings.Contains(cfg, "image: "+img.Installer()) {
			t.Errorf("node %s was not installed with %s", n.IP(), img.Installer())
		}
		if !n.RunsExtension("qemu-guest-agent") {
			t.Errorf("node %s does not run the guest agent", n.IP())
		}
	}
	for _, row := range []string{"talos-extensions", "guest-agent"} {
		if l := checkRow(r.Stdout, row); !strings.Contains(l, "PASS") {
			t.Errorf("postcheck row %s: %q", row, l)
		}
	}

	// The N100's iGPU and microcode: a new schematic, rolled out as an
	// upgrade in place (same Talos), control planes one at a time.
	n100 := factory.New([]string{"siderolabs/i915", "siderolabs/intel-ucode", factory.GuestAgent}, nil)
	if err := h.EditConfig(func(s string) (string, error) {
		return strings.Replace(s, "  talosVersion: v1.13.3\n", "  talosVersion: v1.13.3\n  schematic:\n    extensions: [siderolabs/qemu-guest-agent, siderolabs/i915, siderolabs/intel-ucode]\n", 1), nil
	}); err != nil {
		t.Fatal(err)
	}
	dry := run(t, ctx, h, "run", "--stage", "talos", "--dry-run")
	if dry.ExitCode != 0 || !strings.Contains(dry.Stdout, "upgrade Talos on cp-1 in place, v1.13.3 with schematic "+factory.ShortID(n100.MustID())+" (was "+factory.ShortID(img.ID)+") (1/4, control planes first)") {
		t.Fatalf("dry run:\n%s", dry.Tail(40))
	}
	r = run(t, ctx, h, "run", "--stage", "all")
	if r.ExitCode != 0 {
		t.Fatalf("schematic change:\n%s", r.Tail(60))
	}
	if err := h.PostcheckGreen(); err != nil {
		t.Fatal(err)
	}
	for _, n := range h.Lab.Talos.Nodes() {
		if c := n.Counters(); c.Upgrades != 1 || n.Version() != "v1.13.3" || !n.RunsExtension("i915") || !n.RunsExtension("intel-ucode") {
			t.Errorf("node %s: %d upgrades, %s, i915 %v, intel-ucode %v", n.IP(), c.Upgrades, n.Version(), n.RunsExtension("i915"), n.RunsExtension("intel-ucode"))
		}
	}
	if l := checkRow(r.Stdout, "talos-extensions"); !strings.Contains(l, "PASS") || !strings.Contains(l, "i915, intel-ucode, qemu-guest-agent") {
		t.Errorf("postcheck row: %q", l)
	}
	var rollout []string
	for _, l := range strings.Split(r.Stderr, "\n") {
		if strings.Contains(l, "upgrade Talos on") && strings.Contains(l, `"ui":"change"`) {
			rollout = append(rollout, l)
		}
	}
	if len(rollout) != 4 {
		t.Errorf("%d upgrade steps in the log, want 4:\n%s", len(rollout), strings.Join(rollout, "\n"))
	}

	// The precheck cached the factory's list: a misspelt name fails
	// validation (exit 2, the field named) without asking anyone.
	if _, err := os.Stat(factory.CatalogPath(h.Paths().StateDir, "v1.13.3")); err != nil {
		t.Fatalf("no cached extension list: %v", err)
	}
	// Written directly: the harness's EditConfig reloads (validates) it.
	raw, err := os.ReadFile(h.ConfigPath())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(h.ConfigPath(), []byte(strings.Replace(string(raw), "siderolabs/intel-ucode]", "siderolabs/intel-ucod]", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	before, pve := f.Counts(), h.Lab.PVE.Counts()
	v := run(t, ctx, h, "config", "validate")
	if v.ExitCode != 2 || !strings.Contains(v.Stderr+v.Stdout, "cluster.schematic.extensions[2]") || !strings.Contains(v.Stderr+v.Stdout, "similar: siderolabs/intel-ucode") {
		t.Fatalf("config validate with a misspelt extension: exit %d\n%s%s", v.ExitCode, v.Stdout, v.Stderr)
	}
	if after := f.Counts(); after != before || len(h.Lab.PVE.Counts()) != len(pve) {
		t.Errorf("config validate made calls: factory %+v → %+v", before, after)
	}
}

// TestStockInstallerRunsNoGuestAgent: an explicit stock installer carries
// no system extension, so the nodes run no guest agent after the install
// although the ISO they boot (derived from the default schematic) has it.
// The VMs then get agent: 0, config validate says why, and the postcheck's
// guest-agent row expects no agent. (They got agent: 1 from the schematic
// before, and the row warned that no agent answered.)
func TestStockInstallerRunsNoGuestAgent(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 4*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1})
	const stock = "ghcr.io/siderolabs/installer:v1.13.3"
	if err := h.EditConfig(func(s string) (string, error) {
		return strings.Replace(s, "  talosVersion: v1.13.3\n", "  talosVersion: v1.13.3\n  installImage: "+stock+"\n", 1), nil
	}); err != nil {
		t.Fatal(err)
	}
	v := run(t, ctx, h, "config", "validate")
	if v.ExitCode != 0 || !strings.Contains(v.Stderr, "cluster.installImage") || !strings.Contains(v.Stderr, "agent: 0") {
		t.Fatalf("config validate: exit %d\n%s%s", v.ExitCode, v.Stdout, v.Stderr)
	}
	r := run(t, ctx, h, "run", "--stage", "all")
	if r.ExitCode != 0 {
		t.Fatalf("run:\n%s", r.Tail(60))
	}
	if err := h.PostcheckGreen(); err != nil {
		t.Fatal(err)
	}
	for _, n := range h.Config().Nodes {
		if vm, ok := h.Lab.PVE.VM(n.VMID); !ok || vm.Config["agent"] != "0" {
			t.Errorf("VM %d: agent %q, want 0: the installed image runs no guest agent", n.VMID, vm.Config["agent"])
		}
	}
	for _, n := range h.Lab.Talos.Nodes() {
		if cfg := string(h.Lab.Talos.Installed(n.IP())); !strings.Contains(cfg, "image: "+stock) || n.RunsExtension("qemu-guest-agent") {
			t.Errorf("node %s: installed with %s %v, runs the guest agent %v", n.IP(), stock, strings.Contains(cfg, "image: "+stock), n.RunsExtension("qemu-guest-agent"))
		}
	}
	if l := checkRow(r.Stdout, "guest-agent"); !strings.Contains(l, "PASS") || !strings.Contains(l, "not expected") {
		t.Errorf("postcheck row guest-agent: %q", l)
	}
	if l := checkRow(r.Stdout, "talos-extensions"); !strings.Contains(l, "PASS") {
		t.Errorf("postcheck row talos-extensions: %q", l)
	}
}

// TestReorderedSchematicIsNotRolled: a cluster installed from a schematic
// made elsewhere with the same extensions in another order (another ID:
// the factory hashes them as written) is not rebooted to swap the ID when
// the config takes over the installer; the talos stage says why and the
// postcheck's extensions row passes. (Every node was upgraded in place
// before, for the same image.)
func TestReorderedSchematicIsNotRolled(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 4*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1, Workers: 1})
	cfg := h.Config()
	c, err := factory.NewClient(factory.ClientOptions{URL: h.Lab.Factory.URL(), CAFile: cfg.Resolve(cfg.Cluster.FactoryCAFile)})
	if err != nil {
		t.Fatal(err)
	}
	elsewhere := factory.New([]string{factory.GuestAgent, "siderolabs/i915"}, nil)
	if _, err := c.Register(ctx, elsewhere); err != nil {
		t.Fatal(err)
	}
	installer := factory.Images{Factory: h.Lab.Factory.URL(), ID: elsewhere.MustID(), Version: "v1.13.3"}.Installer()
	const schematic = "  schematic:\n    extensions: [siderolabs/i915, siderolabs/qemu-guest-agent]\n"
	if err := h.EditConfig(func(s string) (string, error) {
		return strings.Replace(s, "  talosVersion: v1.13.3\n", "  talosVersion: v1.13.3\n"+schematic+"  installImage: "+installer+"\n", 1), nil
	}); err != nil {
		t.Fatal(err)
	}
	if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
		t.Fatalf("run with the schematic made elsewhere:\n%s", r.Tail(60))
	}
	if err := h.EditConfig(func(s string) (string, error) {
		return strings.Replace(s, "  installImage: "+installer+"\n", "", 1), nil
	}); err != nil {
		t.Fatal(err)
	}
	declared := h.Config().Images().SchematicID
	if declared == elsewhere.MustID() {
		t.Fatal("the config's schematic has the other order's ID: the test proves nothing")
	}
	r := run(t, ctx, h, "run", "--stage", "talos")
	if r.ExitCode != 0 {
		t.Fatalf("talos stage with the config's schematic:\n%s", r.Tail(60))
	}
	if !strings.Contains(r.Stderr, "kept, not rolled") {
		t.Errorf("the stage did not say why the nodes were kept:\n%s", r.Tail(30))
	}
	for _, n := range h.Lab.Talos.Nodes() {
		if c := n.Counters(); c.UpgradeCalls != 0 {
			t.Errorf("node %s: %d upgrade calls for the same image under another ID", n.IP(), c.UpgradeCalls)
		}
	}
	p := run(t, ctx, h, "run", "--stage", "postcheck")
	if l := checkRow(p.Stdout, "talos-extensions"); !strings.Contains(l, "PASS") || !strings.Contains(l, "i915, qemu-guest-agent") {
		t.Errorf("postcheck row talos-extensions: %q\n%s", l, p.Tail(30))
	}
}

// TestEjectNeedsCDROMPrivilege: a token made with a runner role from
// before the ISO eject (no VM.Config.CDROM) still runs the pipeline: the
// precheck's privileges row warns, the talos stage names the VMs that keep
// the ISO and sends nothing, so a converged re-run stays without a
// mutating Proxmox call.
func TestEjectNeedsCDROMPrivilege(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 4*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1, ProxmoxWithoutPrivileges: []string{"VM.Config.CDROM"}})
	r := run(t, ctx, h, "run", "--stage", "all")
	if r.ExitCode != 0 {
		t.Fatalf("run:\n%s", r.Tail(60))
	}
	if l := checkRow(r.Stdout, "proxmox: privileges"); !strings.Contains(l, "WARN") || !strings.Contains(l, "VM.Config.CDROM") {
		t.Errorf("privileges row: %q", l)
	}
	n := h.Config().Nodes[0]
	if !strings.Contains(r.Stderr, fmt.Sprintf("VMs %d %s keep the Talos ISO", n.VMID, n.Name)) || !strings.Contains(r.Stderr, "VM.Config.CDROM") {
		t.Errorf("no warning naming the VM and the privilege:\n%s", r.Tail(40))
	}
	if vm, _ := h.Lab.PVE.VM(n.VMID); !strings.Contains(vm.Config["ide2"], ".iso") {
		t.Errorf("ide2 %q: the ISO was ejected without the privilege", vm.Config["ide2"])
	}
	before := counters(t, ctx, h)
	again := run(t, ctx, h, "run", "--stage", "all")
	if again.ExitCode != 0 {
		t.Fatalf("re-run:\n%s", again.Tail(40))
	}
	if after := counters(t, ctx, h); after.ProxmoxMutating != before.ProxmoxMutating {
		t.Errorf("re-run made %d mutating Proxmox calls: %v", after.ProxmoxMutating-before.ProxmoxMutating, after.ProxmoxList)
	}
}
