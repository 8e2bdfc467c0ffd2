package e2e_test

import (
	"testing"

	"github.com/homelab/bootstrap/e2e"
)

// passIGPU gives node name the lab's mapped iGPU (the mapping "igpu" the
// lab declares on its N100, pvesim.IGPUMapping) in nodes[].vm.pci, and
// returns the check to run after the first run: the VM was created with
// hostpci0 mapping=igpu on PCIe (q35), and no other VM got a device.
func passIGPU(t *testing.T, h *e2e.Harness, name string) func() {
	t.Helper()
	setNodeVM(t, h, name, `{pci: [{mapping: igpu}]}`)
	return func() {
		t.Helper()
		for _, n := range h.Config().Nodes {
			vm, ok := h.Lab.PVE.VM(n.VMID)
			if !ok {
				t.Fatalf("VM %d %s missing", n.VMID, n.Name)
			}
			want := ""
			if n.Name == name {
				want = "mapping=igpu,pcie=1"
			}
			if got := vm.Config["hostpci0"]; got != want {
				t.Errorf("VM %s: hostpci0 %q, want %q", n.Name, got, want)
			}
		}
	}
}
