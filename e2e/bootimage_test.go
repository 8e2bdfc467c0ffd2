package e2e_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/lab/pvesim"
	"github.com/homelab/bootstrap/stages"
)

// imageLab is a PVE 8.4 host whose local storage holds the 'import'
// content type: proxmox.boot auto takes the factory's disk image there.
var imageLab = e2e.Options{ControlPlanes: 1, Workers: 1, ProxmoxVersion: "8.4.21", ProxmoxImport: true}

// nodesBootedFromImage checks that every running Talos node of the lab
// booted from the disk image and took its config with no install and no
// reboot (talossim's counters).
func nodesBootedFromImage(t *testing.T, h *e2e.Harness) {
	t.Helper()
	nodes := h.Lab.Talos.Nodes()
	if len(nodes) != len(h.Config().Nodes) {
		t.Fatalf("%d Talos nodes run, want %d", len(nodes), len(h.Config().Nodes))
	}
	for _, n := range nodes {
		c := n.Counters()
		if !n.BootedFromImage() || c.Installs != 0 || c.Reboots != 0 || c.ImageBoots != 1 {
			t.Errorf("node %s: booted from the image %v, installs %d, reboots %d, image boots %d", n.IP(), n.BootedFromImage(), c.Installs, c.Reboots, c.ImageBoots)
		}
	}
}

// On PVE 8.4 with a storage for imports, auto boots every VM from the
// factory's disk image: downloaded once, each VM's disk imported from it and
// grown before the first start, no ISO; no node installs or reboots; a
// converged re-run changes nothing; node replace re-creates a node from the
// same image; destroy leaves the image for the next cluster.
func TestBootFromImage(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 4*time.Minute)
	h := startHarness(t, imageLab)
	r := run(t, ctx, h, "run", "--stage", "all")
	if r.ExitCode != 0 {
		t.Fatalf("run failed:\n%s", r.Tail(40))
	}
	if !strings.Contains(r.Stdout, "new VMs boot the disk image: Proxmox VE 8.4.21 imports talos-") {
		t.Errorf("the precheck's boot row does not say the disk image:\n%s", r.Stdout)
	}
	if err := h.PostcheckGreen(); err != nil {
		t.Fatal(err)
	}
	nodesBootedFromImage(t, h)
	fc := h.Lab.Factory.Counts()
	images := h.Lab.PVE.Volumes("local", "import")
	if fc.ImageDownloads != 1 || fc.ISODownloads != 0 || len(images) != 1 || len(h.Lab.PVE.Volumes("local", "iso")) != 0 {
		t.Errorf("downloads: %d images, %d ISOs from the factory; import content %v", fc.ImageDownloads, fc.ISODownloads, images)
	}
	for _, n := range h.Config().Nodes {
		vm, _ := h.Lab.PVE.VM(n.VMID)
		if d := vm.Event.Disks; len(d) != 1 || d[0].SizeBytes != int64(n.DiskGiB)<<30 || d[0].ImportedFrom != images[0] || vm.Config["ide2"] != "" {
			t.Errorf("VM %d: disks %+v, ide2 %q", n.VMID, d, vm.Config["ide2"])
		}
	}
	before := counters(t, ctx, h)
	r = run(t, ctx, h, "run", "--stage", "all")
	after := counters(t, ctx, h)
	if r.ExitCode != 0 || after.ProxmoxMutating != before.ProxmoxMutating || after.TalosApplies != before.TalosApplies {
		t.Errorf("the converged re-run (exit %d) changed something: Proxmox %v, Talos applies %d → %d\n%s",
			r.ExitCode, after.ProxmoxList, before.TalosApplies, after.TalosApplies, r.Tail(20))
	}

	r = run(t, ctx, h, "node", "replace", "wk-1", "--yes")
	if r.ExitCode != 0 {
		t.Fatalf("node replace wk-1:\n%s", r.Tail(40))
	}
	nodesBootedFromImage(t, h)
	if fc := h.Lab.Factory.Counts(); fc.ImageDownloads != 1 {
		t.Errorf("the replacement downloaded the image again (%d downloads)", fc.ImageDownloads)
	}

	r = run(t, ctx, h, "destroy", "--yes")
	if r.ExitCode != 0 || len(h.Lab.PVE.VMIDs()) != 0 {
		t.Fatalf("destroy (exit %d) left VMs %v:\n%s", r.ExitCode, h.Lab.PVE.VMIDs(), r.Tail(20))
	}
	if got := h.Lab.PVE.Volumes("local", "import"); len(got) != 1 || got[0] != images[0] {
		t.Errorf("destroy took the shared image: %v", got)
	}
}

// PVE 8.3.5 has the import content type but downloads .ova files only:
// auto uses the ISO and says why; image refuses (exit 2) with that reason
// before any change.
func TestBootImageRefusedOnPVE83(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 2*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1, ProxmoxVersion: "8.3.5", ProxmoxImport: true})
	r := run(t, ctx, h, "run", "--stage", "provision")
	const why = "PVE 8.3.5 (pve-storage 8.2.9 on pve): imports .ova only (disk images from pve-storage 8.3.6, PVE 8.4)"
	if r.ExitCode != 0 || !strings.Contains(r.Stdout+r.Stderr, "new VMs boot the ISO: "+why) {
		t.Fatalf("auto on 8.3 (exit %d) does not say why it takes the ISO:\n%s", r.ExitCode, r.Tail(20))
	}
	if fc := h.Lab.Factory.Counts(); fc.ISODownloads != 1 || fc.ImageDownloads != 0 {
		t.Errorf("downloads: %d ISOs, %d images", fc.ISODownloads, fc.ImageDownloads)
	}
	if n := h.Lab.Talos.Nodes(); len(n) != 1 || n[0].BootedFromImage() {
		t.Errorf("nodes %v: want one booted from the ISO", n)
	}

	if err := h.EditConfig(func(s string) (string, error) {
		return strings.Replace(s, "proxmox:\n", "proxmox:\n  boot: image\n", 1), nil
	}); err != nil {
		t.Fatal(err)
	}
	// A node to create: the one the first run made is destroyed first.
	if r := run(t, ctx, h, "destroy", "--yes"); r.ExitCode != 0 {
		t.Fatalf("destroy:\n%s", r.Tail(20))
	}
	mutating := h.Lab.PVE.MutatingCalls()
	r = run(t, ctx, h, "run", "--stage", "all")
	if r.ExitCode != stages.ExitUsage || !strings.Contains(r.Stderr, "proxmox.boot is image, but "+why) || !strings.Contains(r.Stderr, "nothing was changed") {
		t.Fatalf("image on 8.3: exit %d, want %d with the reason:\n%s", r.ExitCode, stages.ExitUsage, r.Tail(20))
	}
	if n := h.Lab.PVE.MutatingCalls(); n != mutating || len(h.Lab.PVE.VMIDs()) != 0 {
		t.Errorf("the refused run changed Proxmox: %v", h.Lab.PVE.MutatingCallList())
	}
}

// A run killed while the image downloads, after a VM was created but before
// its disk was grown, and while the next VM's disk is imported (that VM holds
// only its create lock) resumes to a green cluster booted from the image: one
// image kept, no disk left over, every disk grown, no install, no reboot.
func TestBootFromImageKilledAndResumed(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 4*time.Minute)
	o := imageLab
	// Tasks that take long enough to be killed in (n100 at 1/20).
	o.Profile, o.TimeScale = "n100", 0.05
	h := startHarness(t, o)
	// One VM at a time: the second kill leaves the first VM created and
	// not grown, the third kills the run while the second is imported.
	if err := h.SetParallelism(1, 0); err != nil {
		t.Fatal(err)
	}
	pve := h.Lab.PVE
	// during waits, at most 10 s, until cond holds; the run goes on meanwhile.
	during := func(cond func() bool) bool {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if cond() {
				return true
			}
		}
		return false
	}
	kills := []struct {
		what  string
		at    func(e2e.Event) bool
		after func() error // what the kill left, checked before the resume
	}{
		{"while the image downloads", func(ev e2e.Event) bool {
			return strings.HasPrefix(ev.Message, "download talos-") && during(func() bool { return pve.RunningTasks("download") > 0 })
		}, nil},
		{"after a create, before the disk is grown", func(ev e2e.Event) bool {
			if !strings.HasPrefix(ev.Message, "create VM") {
				return false
			}
			pve.InjectFault(pvesim.Fault{Kind: pvesim.FaultSlow, Method: "PUT", Path: "/nodes/*/qemu/*/resize", Delay: 5 * time.Second, Times: 1})
			return during(func() bool { return pve.FaultsFired() > 0 })
		}, func() error {
			ids := pve.VMIDs()
			if len(ids) != 1 {
				return fmt.Errorf("VMs %v, want the one created", ids)
			}
			for _, n := range h.Config().Nodes {
				if n.VMID != ids[0] {
					continue
				}
				if vm, _ := pve.VM(n.VMID); len(vm.Event.Disks) != 1 || vm.Event.Disks[0].SizeBytes >= int64(n.DiskGiB)<<30 {
					return fmt.Errorf("VM %d disks %+v: want the image's size, not grown", n.VMID, vm.Event.Disks)
				}
				return nil
			}
			return fmt.Errorf("VM %d is not in the config", ids[0])
		}},
		{"while a disk is imported", func(ev e2e.Event) bool {
			return strings.HasPrefix(ev.Message, "create VM") && during(func() bool { return pve.RunningTasks("qmcreate") > 0 })
		}, nil},
	}
	args := []string{"run", "--stage", "all"}
	var log []string
	for _, k := range kills {
		r, err := h.RunWith(ctx, e2e.RunOptions{KillWhen: k.at}, args...)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Killed {
			t.Fatalf("not killed %s (exit %d; %s):\n%s", k.what, r.ExitCode, strings.Join(log, "; "), r.Tail(30))
		}
		log = append(log, "killed "+k.what+" at "+r.KilledEvent)
		// A create the kill left running holds a config with only its
		// lock until its import ends.
		during(func() bool { return pve.RunningTasks("qmcreate") == 0 })
		if err := checkVMs(h, false); err != nil {
			t.Fatalf("after a kill %s: %v", k.what, err)
		}
		if k.after != nil {
			if err := k.after(); err != nil {
				t.Fatalf("after a kill %s: %v", k.what, err)
			}
		}
		args = []string{"run", "--resume"}
		pve.ClearFaults()
	}
	r := run(t, ctx, h, args...)
	if r.ExitCode != 0 {
		t.Fatalf("resume after %s:\n%s", strings.Join(log, "; "), r.Tail(40))
	}
	t.Logf("%s; resumed: %s", strings.Join(log, "; "), r.Wall.Round(100*time.Millisecond))
	if err := h.PostcheckGreen(); err != nil {
		t.Fatal(err)
	}
	if err := checkVMs(h, true); err != nil {
		t.Error(err)
	}
	nodesBootedFromImage(t, h)
	// The install disks: not the cloud-init drives, nor the EFI disks
	// (proxmox.vm's OVMF baseline gives each VM one).
	efi := map[string]bool{}
	for _, n := range h.Config().Nodes {
		if vm, ok := pve.VM(n.VMID); ok && vm.Config["efidisk0"] != "" {
			vol, _, _ := strings.Cut(vm.Config["efidisk0"], ",")
			efi[vol] = true
		}
	}
	var disks []string
	for _, v := range pve.Volumes("local-lvm", "images") {
		if !strings.Contains(v, "cloudinit") && !efi[v] {
			disks = append(disks, v)
		}
	}
	if imgs := pve.Volumes("local", "import"); len(imgs) != 1 || len(disks) != len(h.Config().Nodes) {
		t.Errorf("left behind: images %v, disks %v", imgs, disks)
	}
	for _, n := range h.Config().Nodes {
		if vm, _ := pve.VM(n.VMID); len(vm.Event.Disks) != 1 || vm.Event.Disks[0].SizeBytes != int64(n.DiskGiB)<<30 {
			t.Errorf("VM %d disks %+v", n.VMID, vm.Event.Disks)
		}
	}
}
