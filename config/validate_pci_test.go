package config

import "testing"

// TestVMShapeOfPCI: a node's pci list replaces proxmox.vm's, an empty one
// clears it, none inherits it.
func TestVMShapeOfPCI(t *testing.T) {
	c := &Config{Proxmox: Proxmox{VM: VMShape{PCI: []PCIDevice{{Mapping: "igpu"}}}}}
	if got := c.VMShapeOf(Node{}).PCI; len(got) != 1 || got[0].Mapping != "igpu" {
		t.Errorf("a node without pci: %+v, want proxmox.vm's", got)
	}
	if got := c.VMShapeOf(Node{VM: VMShape{PCI: []PCIDevice{}}}).PCI; len(got) != 0 {
		t.Errorf("a node with pci: []: %+v, want none", got)
	}
	if got := c.VMShapeOf(Node{VM: VMShape{PCI: []PCIDevice{{Mapping: "nic"}}}}).PCI; len(got) != 1 || got[0].Mapping != "nic" {
		t.Errorf("a node with its own pci: %+v, want its own", got)
	}
	c.Proxmox.RoleVM.Worker.PCI = []PCIDevice{{Mapping: "hba"}}
	if got := c.VMShapeOf(Node{Role: RoleWorker}).PCI; len(got) != 1 || got[0].Mapping != "hba" {
		t.Errorf("a worker without pci under proxmox.roleVM.worker.pci: %+v, want the role's", got)
	}
	if got := c.VMShapeOf(Node{Role: RoleControlPlane}).PCI; len(got) != 1 || got[0].Mapping != "igpu" {
		t.Errorf("a control plane without pci: %+v, want proxmox.vm's", got)
	}
}
