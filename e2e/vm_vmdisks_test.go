package e2e_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/postcheck"
)

// The storage disk and network TestPipeline/3cp+2w-vip gives wk-1.
const (
	dataDiskGiB = 20
	storageIP   = "10.0.30.21/24"
)

// withDataDiskAndStorageNIC gives wk-1 an extra 20 GiB disk "data" as a
// Talos user volume and a second NIC on vmbr1 (the lab's VLAN-aware
// jumbo-frame bridge) with a static address, and, once the test's runs
// are done, wants the VM to have them, Talos to see the disk by its
// serial with the user volume ready on it, and the address on the node.
func withDataDiskAndStorageNIC(t *testing.T, h *e2e.Harness) {
	t.Helper()
	setNodeVM(t, h, "wk-1", `{disks: [{name: data, sizeGiB: 20, volume: user}], nics: [{bridge: vmbr1, vlan: 30, mtu: 9000, firewall: true, ip: `+storageIP+`}]}`)
	t.Cleanup(func() {
		if t.Failed() {
			return // the runs failed already; this would only add noise
		}
		checkDataDiskAndStorageNIC(t, h)
	})
}

func checkDataDiskAndStorageNIC(t *testing.T, h *e2e.Harness) {
	var node config.Node
	for _, n := range h.Config().Nodes {
		if n.Name == "wk-1" {
			node = n
		}
	}
	serial := config.DiskSerial(h.Config().Cluster.Name, "wk-1", "data")
	vm, ok := h.Lab.PVE.VM(node.VMID)
	if !ok {
		t.Fatalf("VM %d wk-1 missing", node.VMID)
	}
	c := vm.Config
	if d := c["scsi1"]; !strings.Contains(d, "serial="+serial) || !strings.Contains(d, "size=20G") || !strings.Contains(d, "cache=writethrough") {
		t.Errorf("wk-1's scsi1 = %q, want the 20 GiB data disk with serial %s", d, serial)
	}
	if n := c["net1"]; !strings.Contains(n, "bridge=vmbr1") || !strings.Contains(n, "tag=30") || !strings.Contains(n, "mtu=9000") || !strings.Contains(n, "firewall=1") {
		t.Errorf("wk-1's net1 = %q", n)
	}
	if c["ipconfig1"] != "ip="+storageIP {
		t.Errorf("wk-1's ipconfig1 = %q", c["ipconfig1"])
	}
	for _, other := range h.Config().Nodes {
		if vm, _ := h.Lab.PVE.VM(other.VMID); other.Name != "wk-1" && (vm.Config["scsi1"] != "" || vm.Config["net1"] != "") {
			t.Errorf("%s got wk-1's extras: %v", other.Name, vm.Config)
		}
	}

	tn, ok := h.Lab.Talos.Node(node.IP)
	if !ok {
		t.Fatalf("no Talos node at %s", node.IP)
	}
	if got := tn.DiskSerials()["/dev/sdb"]; got != serial {
		t.Errorf("Talos sees /dev/sdb with serial %q, want %s (disks %v)", got, serial, tn.DiskSerials())
	}
	phase, location, msg, ok := tn.VolumeStatus("u-data")
	if !ok || phase != "ready" || location != "/dev/sdb" {
		t.Errorf("u-data on wk-1: %q at %q (%s), want ready on /dev/sdb", phase, location, msg)
	}
	if addrs := tn.Addresses(); !slices.Contains(addrs, "eth1/"+storageIP) {
		t.Errorf("wk-1's addresses %v lack eth1/%s", addrs, storageIP)
	}

	// The product saw it too: the postcheck's user volume row passed.
	st, err := h.State()
	if err != nil || st.Outputs.Postcheck == nil {
		t.Fatalf("no postcheck recorded: %v", err)
	}
	files, err := postcheck.ReadArchive(st.Outputs.Postcheck.Archive)
	if err != nil {
		t.Fatal(err)
	}
	var report postcheck.Report
	if err := json.Unmarshal(files["report.json"], &report); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(report.Checks, func(c postcheck.CheckReport) bool { return c.Name == postcheck.CheckUserVolumes })
	if i < 0 || report.Checks[i].Status != check.Pass {
		t.Errorf("postcheck row %s: %+v", postcheck.CheckUserVolumes, report.Checks)
	}
}
