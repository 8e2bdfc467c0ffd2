package proxmox

import (
	"strings"
	"testing"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/lab/pvesim"
)

var storageBridges = []pvesim.BridgeSpec{{Name: "vmbr0", VLANAware: true, Ports: "enp1s0"}, {Name: "vmbr1", VLANAware: true, VIDs: "30", Ports: "enp2s0", MTU: 9000}}

// withExtras is spec i with a user-volume disk, a raw virtio disk and a
// storage NIC.
func withExtras(i int) VMSpec {
	s := spec(i)
	s.Disks = []ExtraDisk{
		{Name: "data", Storage: "local-lvm", SizeGiB: 20, Bus: "scsi", Serial: "bs-0123456789abcdef"},
		{Name: "ceph", Storage: "local-lvm", SizeGiB: 8, Bus: "virtio", Serial: "bs-fedcba9876543210"},
	}
	s.NICs = []ExtraNIC{{Bridge: "vmbr1", VLAN: 30, MTU: 9000, Firewall: true, IP: "10.0.30.21/24", MAC: ExtraNICMAC("lab", s.Name, 1)}}
	return s
}

func TestExtraDisksAndNICsAtCreate(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: storageBridges})
	ctx := ctxT(t)
	s := withExtras(4)
	if got := strings.Join(s.ExtraDiskSlots(), ","); got != "scsi1,virtio0" {
		t.Fatalf("slots %s", got)
	}
	res := e.provision(ctx, e.c, []VMSpec{s})
	if !res[0].Created {
		t.Fatalf("result %+v", res[0])
	}
	vm, _ := e.sim.VM(s.VMID)
	for k, want := range map[string][]string{
		"scsi1":     {"serial=bs-0123456789abcdef", "cache=writethrough", "discard=on", "size=20G"},
		"virtio0":   {"serial=bs-fedcba9876543210", "size=8G"},
		"net1":      {"virtio=" + s.NICs[0].MAC, "bridge=vmbr1", "tag=30", "mtu=9000", "firewall=1"},
		"ipconfig1": {"ip=10.0.30.21/24"},
	} {
		for _, w := range want {
			if !strings.Contains(vm.Config[k], w) {
				t.Errorf("%s = %q lacks %q", k, vm.Config[k], w)
			}
		}
	}
	ev := e.starts[s.VMID]
	if len(ev.Disks) != 3 || ev.Disks[1].Serial != "bs-0123456789abcdef" || ev.Disks[2].Serial != "bs-fedcba9876543210" {
		t.Errorf("the guest sees disks %+v", ev.Disks)
	}
	if len(ev.NICs) != 1 || ev.NICs[0].IPv4.String() != "10.0.30.21/24" {
		t.Errorf("the guest sees NICs %+v", ev.NICs)
	}
	// Adopted as created: nothing to report or change.
	vms, _ := e.c.ListVMs(ctx)
	p, err := e.c.PlanVM(ctx, s, vms)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range p.Drift {
		if strings.HasPrefix(d.Field, "disk ") || strings.HasPrefix(d.Field, "NIC ") {
			t.Errorf("drift on the VM it created: %s", d)
		}
	}
	// node remove and destroy delete the extra disks with the VM.
	owned := 0
	for _, v := range e.sim.Volumes("local-lvm", "images") {
		if strings.Contains(v, "vm-704-") {
			owned++
		}
	}
	if owned < 3 {
		t.Fatalf("VM 704 owns %d volumes on local-lvm, want its install disk, extra disks and more", owned)
	}
	if err := e.c.DestroyClusterVM(ctx, "lab", VMSummary{VMID: s.VMID}); err != nil {
		t.Fatal(err)
	}
	for _, v := range e.sim.Volumes("local-lvm", "images") {
		if strings.Contains(v, "vm-704-") {
			t.Errorf("volume %s left after the VM was destroyed", v)
		}
	}
}

// TestExtrasMissingOnAnAdoptedVMAreReported: a VM created without the
// extra disk and NIC keeps its hardware; each is reported with the qm
// command that adds it.
func TestExtrasMissingOnAnAdoptedVMAreReported(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: storageBridges})
	ctx := ctxT(t)
	e.provision(ctx, e.c, []VMSpec{spec(4)})
	before, _ := e.sim.VM(704)
	res := e.provision(ctx, e.c, []VMSpec{withExtras(4)})
	reports := map[string]Drift{}
	for _, d := range res[0].Drift {
		reports[d.Field] = d
	}
	for field, how := range map[string]string{
		"disk data": "qm set 704 --scsi1 local-lvm:20,discard=on,cache=writethrough,serial=bs-0123456789abcdef",
		"disk ceph": "qm set 704 --virtio0 local-lvm:8,",
		"NIC net1":  "--ipconfig1 ip=10.0.30.21/24",
	} {
		d, ok := reports[field]
		if !ok || d.Kind != DriftReport || !strings.Contains(d.Why, how) {
			t.Errorf("%s: %+v, want a report saying %q", field, d, how)
		}
	}
	after, _ := e.sim.VM(704)
	for _, k := range []string{"scsi1", "virtio0", "net1", "ipconfig1"} {
		if after.Config[k] != before.Config[k] {
			t.Errorf("adoption changed %s: %q → %q", k, before.Config[k], after.Config[k])
		}
	}
}

// TestPrecheckJudgesExtraStoragesAndBridges: an extra disk's storage is
// checked like the install disk's (exists, images, room), an extra NIC's
// bridge like net0's (exists, carries its VLAN).
func TestPrecheckJudgesExtraStoragesAndBridges(t *testing.T) {
	e := newEnv(t, pvesim.Options{Bridges: storageBridges})
	in := precheckInput(1)
	in.VMs = []VMSpec{withExtras(1)}
	rs := runPrechecks(t, e.c, in)
	expect(t, rs, "proxmox: disk storage", check.Pass, "48.0 GiB for new disks")
	expect(t, rs, "proxmox: bridge", check.Pass, "vmbr1 (VLAN-aware, VLAN 30)")

	in.VMs[0].NICs[0].MTU = 9216
	rs = runPrechecks(t, e.c, in)
	expect(t, rs, "proxmox: bridge", check.Fail, "node-1's net1 asks MTU 9216, bridge vmbr1 has 9000")
	in.VMs[0].NICs[0].Bridge, in.VMs[0].NICs[0].VLAN = "vmbr0", 20
	rs = runPrechecks(t, e.c, in)
	expect(t, rs, "proxmox: bridge", check.Warn, "bridge vmbr0 sets no mtu")
	in.VMs[0].NICs[0].Bridge, in.VMs[0].NICs[0].VLAN, in.VMs[0].NICs[0].MTU = "vmbr1", 30, 9000

	in.VMs[0].Disks[1].Storage = "fast"
	in.VMs[0].NICs[0].VLAN = 40
	rs = runPrechecks(t, e.c, in)
	expect(t, rs, "proxmox: disk storage", check.Fail, "storage fast not found")
	expect(t, rs, "proxmox: bridge", check.Fail, "bridge vmbr1 is VLAN aware but its ports carry only VLANs 30")
}
