package config

import (
	"slices"
	"strings"
	"testing"
)

// TestVMShapeLayers checks the order a node's VM hardware is taken in:
// proxmox.cpu, then proxmox.vm, then its role's proxmox.roleVM, then its
// own vm; a list (cpuFlags) set on a narrower level replaces the wider one.
func TestVMShapeLayers(t *testing.T) {
	base := string(mustRead(t, "testdata/good/three-plus-two.yaml"))
	if !strings.Contains(base, "\nproxmox:\n") {
		t.Fatal("fixture has no proxmox block")
	}
	data := strings.Replace(base, "\nproxmox:\n", `
proxmox:
  cpu: x86-64-v2-AES
  vm: {cpuFlags: [+aes], rng: "on"}
  roleVM:
    worker: {cpu: x86-64-v3, cpuFlags: [+pdpe1gb, -pcid], cache: none}
    controlplane: {scsihw: virtio-scsi-single}
`, 1)
	cfg, err := Parse("layers.yaml", []byte(data), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	var cp, wk Node
	for _, n := range cfg.Nodes {
		switch {
		case n.Role == RoleControlPlane && cp.Name == "":
			cp = n
		case n.Role == RoleWorker && wk.Name == "":
			wk = n
		}
	}
	got := cfg.VMShapeOf(cp)
	if got.CPU != "x86-64-v2-AES" || !slices.Equal(got.CPUFlags, []string{"+aes"}) || got.SCSIHW != "virtio-scsi-single" || got.RNG != On || got.Cache != "writethrough" {
		t.Errorf("control plane: %+v", got)
	}
	got = cfg.VMShapeOf(wk)
	if got.CPU != "x86-64-v3" || !slices.Equal(got.CPUFlags, []string{"+pdpe1gb", "-pcid"}) || got.Cache != "none" || got.SCSIHW != "virtio-scsi-pci" || got.RNG != On {
		t.Errorf("worker: %+v", got)
	}
	// A node's own vm wins over its role's; an empty list clears the flags.
	wk.VM = VMShape{CPU: "host", CPUFlags: []string{}}
	got = cfg.VMShapeOf(wk)
	if got.CPU != "host" || len(got.CPUFlags) != 0 || got.Cache != "none" {
		t.Errorf("worker with its own vm: %+v", got)
	}
}
