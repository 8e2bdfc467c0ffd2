package proxmox

import (
	"strings"
	"testing"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/lab/pvesim"
)

func TestHostPCIParams(t *testing.T) {
	for _, tc := range []struct {
		machine string
		dev     PCIDevice
		want    string
	}{
		{"", PCIDevice{Mapping: "igpu"}, "mapping=igpu,pcie=1"},
		{"pc-q35-9.2+pve1", PCIDevice{Mapping: "igpu"}, "mapping=igpu,pcie=1"},
		{"pc", PCIDevice{Mapping: "igpu"}, "mapping=igpu"},
		{"q35", PCIDevice{Mapping: "nic", PCIe: "off", ROMBar: "off"}, "mapping=nic,rombar=0"},
		{"q35", PCIDevice{Mapping: "gpu", PrimaryGPU: true, MDev: "i915-GVTg_V5_4"}, "mapping=gpu,pcie=1,x-vga=1,mdev=i915-GVTg_V5_4"},
	} {
		s := spec(4)
		s.Hardware = Hardware{Machine: tc.machine, PCI: []PCIDevice{tc.dev}}
		if got := s.createParams()["hostpci0"]; got != tc.want {
			t.Errorf("%s on %q: hostpci0 %v, want %s", tc.dev.Mapping, tc.machine, got, tc.want)
		}
	}
	if _, ok := spec(4).createParams()["hostpci0"]; ok {
		t.Error("a VM without pci got a hostpci0")
	}
}

// pciHost is a pvesim host with the N100's iGPU and mappings.
func pciHost(t *testing.T, devs []pvesim.PCIDevice, maps ...pvesim.PCIMapping) *env {
	return newEnv(t, pvesim.Options{Bridges: vlanBridge, Node: pvesim.NodeSpec{PCIDevices: devs}, PCIMappings: maps})
}

func withIGPU(in PrecheckInput, names ...string) PrecheckInput {
	for i := range in.VMs {
		for _, n := range names {
			if in.VMs[i].Name == n {
				in.VMs[i].Hardware.PCI = []PCIDevice{{Mapping: "igpu"}}
			}
		}
	}
	return in
}

// TestPCIPrecheck: the PCI row passes a mapped device that is there for
// the VM and fails, naming the fix, what Proxmox would refuse at create or
// start.
func TestPCIPrecheck(t *testing.T) {
	igpu := pvesim.N100IGPU()
	moved := igpu
	moved.Device = "0x46d0"
	vf1, vf2 := igpu, igpu
	vf1.ID, vf2.ID, vf1.IOMMUGroup, vf2.IOMMUGroup = "0000:00:02.1", "0000:00:02.2", 20, 21
	vfs := pvesim.PCIMapping{ID: "igpu", Description: "VFs", Map: []string{
		"node=pve,path=0000:00:02.1,id=8086:46d1,subsystem-id=8086:7270,iommugroup=20",
		"node=pve,path=0000:00:02.2,id=8086:46d1,subsystem-id=8086:7270,iommugroup=21"}}
	for _, tc := range []struct {
		name  string
		devs  []pvesim.PCIDevice
		maps  []pvesim.PCIMapping
		vms   []string
		ha    bool
		st    check.Status
		wants []string
	}{
		{"present", []pvesim.PCIDevice{igpu}, []pvesim.PCIMapping{pvesim.IGPUMapping("pve")}, []string{"node-4"}, false, check.Pass, []string{"igpu on pve for node-4"}},
		{"no mapping", []pvesim.PCIDevice{igpu}, nil, []string{"node-4"}, false, check.Fail, []string{"PCI mapping igpu does not exist (node-4 wants it)"}},
		{"no entry for the host", []pvesim.PCIDevice{igpu}, []pvesim.PCIMapping{pvesim.IGPUMapping("pve2")}, []string{"node-4"}, false, check.Fail,
			[]string{"PCI mapping igpu has no entry for pve, where node-4 runs", "PCI device mapping not found for 'igpu'", "it has entries for pve2"}},
		{"hardware changed", []pvesim.PCIDevice{moved}, []pvesim.PCIMapping{pvesim.IGPUMapping("pve")}, []string{"node-4"}, false, check.Fail,
			[]string{"PCI device mapping invalid (hardware probably changed): 'id' does not match for 'igpu' (8086:46d0 != 8086:46d1)"}},
		{"device missing", nil, []pvesim.PCIMapping{pvesim.IGPUMapping("pve")}, []string{"node-4"}, false, check.Fail, []string{"pci device '0000:00:02.0' not found"}},
		{"one device, two VMs", []pvesim.PCIDevice{igpu}, []pvesim.PCIMapping{pvesim.IGPUMapping("pve")}, []string{"node-4", "node-5"}, false, check.Fail,
			[]string{"PCI mapping igpu has 1 device(s) on pve, but node-4, node-5 would use 2", "already in use by VMID"}},
		{"two functions, two VMs", []pvesim.PCIDevice{vf1, vf2}, []pvesim.PCIMapping{vfs}, []string{"node-4", "node-5"}, false, check.Pass, []string{"igpu on pve for node-4, node-5"}},
		{"HA", []pvesim.PCIDevice{igpu}, []pvesim.PCIMapping{pvesim.IGPUMapping("pve")}, []string{"node-4"}, true, check.Warn,
			[]string{"with proxmox.ha, node-4 uses mapping igpu, which is not live-migration-capable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := pciHost(t, tc.devs, tc.maps...)
			in := withIGPU(precheckInput(5), tc.vms...)
			in.HA = tc.ha
			rs := runPrechecks(t, e.c, in)
			expect(t, rs, PCICheck, tc.st, tc.wants...)
		})
	}
	// Without devices the row is not there.
	e := pciHost(t, nil)
	if _, ok := runPrechecks(t, e.c, precheckInput(2))[PCICheck]; ok {
		t.Error("a PCI row without any pci configured")
	}
}

// TestPCINeedsMappingUse: a VM created with a mapped device needs
// Mapping.Use on the mapping (check_hostpci_perm); the runner role on /
// alone lacks it, and without any Mapping privilege the row cannot read
// the mapping.
func TestPCINeedsMappingUse(t *testing.T) {
	v, _ := ParseVersion("8.2.4")
	role := []pvesim.ACE{{Path: "/", Privileges: RunnerPrivileges(v)}}
	tok := func(acl []pvesim.ACE) []pvesim.Token {
		return []pvesim.Token{{ID: "bootstrap@pve!homelab", Secret: "s", ACL: acl}}
	}
	for _, tc := range []struct {
		name        string
		acl         []pvesim.ACE
		priv, pciSt check.Status
		wants       []string
	}{
		{"runner role alone", role, check.Fail, check.Warn, []string{"could not check mapping igpu: the token may not read it"}},
		{"with PVEMappingUser on the mapping", append(role, pvesim.ACE{Path: "/mapping/pci/igpu", Privileges: []string{"Mapping.Use", "Mapping.Audit"}}), check.Pass, check.Pass, []string{"igpu on pve for node-4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, pvesim.Options{Bridges: vlanBridge, Tokens: tok(tc.acl), Node: pvesim.NodeSpec{PCIDevices: []pvesim.PCIDevice{pvesim.N100IGPU()}},
				PCIMappings: []pvesim.PCIMapping{pvesim.IGPUMapping("pve")}})
			c := e.client(func(o *Options) { o.TokenID, o.TokenSecret = "bootstrap@pve!homelab", "s" })
			rs := runPrechecks(t, c, withIGPU(precheckInput(4), "node-4"))
			if tc.priv == check.Fail {
				expect(t, rs, "proxmox: privileges", check.Fail, "Mapping.Use on /mapping/pci/igpu", `PVEMappingUser: README's "PCI devices"`)
			} else {
				expect(t, rs, "proxmox: privileges", check.Pass)
			}
			expect(t, rs, PCICheck, tc.pciSt, tc.wants...)
		})
	}
	if slicesContain(RunnerPrivileges(v), "Mapping.Use") {
		t.Error("the runner role holds Mapping.Use on /: it is needed only on the mappings a config passes")
	}
}

func slicesContain(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// TestPCIAdoptionReportsTheMissingDevice: an adopted VM without the
// device keeps its hardware; the plan reports it with the qm command.
func TestPCIAdoptionReportsTheMissingDevice(t *testing.T) {
	e := pciHost(t, []pvesim.PCIDevice{pvesim.N100IGPU()}, pvesim.IGPUMapping("pve"))
	createOn(t, e.c, spec(4), "pve")
	s := spec(4)
	s.Node = "pve"
	s.Hardware.PCI = []PCIDevice{{Mapping: "igpu"}}
	vms, err := e.c.ListVMs(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.c.PlanVM(ctxT(t), s, vms)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, d := range p.Drift {
		if d.Field == "hostpci0" {
			found = true
			if d.Kind != DriftReport || d.Have != "none" || !strings.Contains(d.Why, "qm set 704 --hostpci0 mapping=igpu,pcie=1") {
				t.Errorf("drift %+v", d)
			}
		}
	}
	if !found || len(p.Update) != 0 {
		t.Errorf("plan: drift %v, update %v", p.Drift, p.Update)
	}
	if vm, _ := e.sim.VM(704); vm.Config["hostpci0"] != "" {
		t.Errorf("the adopted VM was changed: %v", vm.Config)
	}
	// A VM created with the device shows no difference.
	s5 := spec(5)
	s5.Hardware.PCI = []PCIDevice{{Mapping: "igpu"}}
	createOn(t, e.c, s5, "pve")
	if vm, _ := e.sim.VM(705); vm.Config["hostpci0"] != "mapping=igpu,pcie=1" {
		t.Errorf("hostpci0 of the new VM: %v", vm.Config)
	}
	vms, _ = e.c.ListVMs(ctxT(t))
	s5.Node = "pve"
	p, err = e.c.PlanVM(ctxT(t), s5, vms)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range p.Drift {
		if d.Field == "hostpci0" {
			t.Errorf("a VM created with its device reports %v", d)
		}
	}
}
