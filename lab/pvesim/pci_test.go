package pvesim

import (
	"net/url"
	"strconv"
	"strings"
	"testing"
)

func pciVM(vmid, name, hostpci string) url.Values {
	vm := url.Values{}
	for k, v := range talosVM {
		vm[k] = v
	}
	vm.Set("vmid", vmid)
	vm.Set("name", name)
	vm.Set("machine", "q35")
	vm.Set("net0", "virtio,bridge=vmbr0")
	if hostpci != "" {
		vm.Set("hostpci0", hostpci)
	}
	return vm
}

// TestPCIMappingsAndHardware: the mapping index and one mapping, as the
// token may see them and as each release shapes them, and the node's
// devices without the hidden classes.
func TestPCIMappingsAndHardware(t *testing.T) {
	bridge := PCIDevice{ID: "0000:00:00.0", Class: "0x060000", Vendor: "0x8086", Device: "0x461c", IOMMUGroup: 1}
	for _, version := range []string{"8.2.4", "9.1.1"} {
		t.Run(version, func(t *testing.T) {
			nic := PCIMapping{ID: "nic", Description: "X710", LiveMigrationCapable: true, Map: []string{"node=pve,path=0000:01:00.0,id=8086:1572"}}
			s := newSim(t, Options{Version: version, Node: NodeSpec{PCIDevices: []PCIDevice{N100IGPU(), bridge}},
				PCIMappings: []PCIMapping{IGPUMapping("pve"), nic}})
			s.AddToken(Token{ID: "bootstrap@pve!pci", Secret: "s", ACL: []ACE{{Path: "/mapping/pci/igpu", Privileges: []string{"Mapping.Use"}}}})
			c := newClient(t, s)
			list := c.ok("GET", "/cluster/mapping/pci", nil).([]any)
			if len(list) != 2 {
				t.Fatalf("admin sees %d mappings, want 2: %v", len(list), list)
			}
			n := list[1].(map[string]any)
			if _, has := n["live-migration-capable"]; has != (version != "8.2.4") {
				t.Errorf("live-migration-capable on %s: %v (pve-guest-common added it for PVE 8.4)", version, n)
			}
			one := c.ok("GET", "/cluster/mapping/pci/igpu", nil).(map[string]any)
			if m := one["map"].([]any); len(m) != 1 || !strings.Contains(m[0].(string), "id=8086:46d1") || one["type"] != "pci" {
				t.Errorf("igpu: %v", one)
			}
			if a := c.do("GET", "/cluster/mapping/pci/gpu2", nil); a.code != 500 || a.msg != "mapping 'gpu2' not found\n" {
				t.Errorf("a missing mapping: %s %s", a.status, a.body)
			}
			checked := c.ok("GET", "/cluster/mapping/pci", url.Values{"check-node": {"pve"}}).([]any)
			if ch := checked[1].(map[string]any)["checks"].([]any); len(ch) != 1 || !strings.Contains(ch[0].(map[string]any)["message"].(string), "pci device '0000:01:00.0' not found") {
				t.Errorf("check-node of a mapping whose device is missing: %v", ch)
			}

			limited := newClient(t, s)
			limited.auth = "PVEAPIToken=bootstrap@pve!pci=s"
			if l := limited.ok("GET", "/cluster/mapping/pci", nil).([]any); len(l) != 1 || l[0].(map[string]any)["id"] != "igpu" {
				t.Errorf("a token with Mapping.Use on igpu only sees %v", l)
			}
			if a := limited.do("GET", "/cluster/mapping/pci/nic", nil); a.code != 403 {
				t.Errorf("reading a mapping without Mapping.*: %s %s", a.status, a.body)
			}
			if a := limited.do("GET", "/nodes/pve/hardware/pci", nil); a.code != 403 {
				t.Errorf("hardware/pci without Sys.Audit on /: %s", a.status)
			}
			devs := c.ok("GET", "/nodes/pve/hardware/pci", nil).([]any)
			if len(devs) != 1 || devs[0].(map[string]any)["device"] != "0x46d1" {
				t.Errorf("hardware/pci hides class 06 (bridges) by default: %v", devs)
			}
			if all := c.ok("GET", "/nodes/pve/hardware/pci", url.Values{"pci-class-blacklist": {""}}).([]any); len(all) != 2 {
				t.Errorf("hardware/pci with an empty blacklist: %v", all)
			}
		})
	}
}

// TestHostPCIOnCreate: check_hostpci_perm and the option's format.
func TestHostPCIOnCreate(t *testing.T) {
	s := newSim(t, Options{ISOs: []ISOSpec{{Storage: "local", Name: "talos.iso", Size: 100 << 20}},
		Node: NodeSpec{PCIDevices: []PCIDevice{N100IGPU()}}, PCIMappings: []PCIMapping{IGPUMapping("pve")}})
	create := []string{"VM.Allocate", "VM.Audit", "VM.Config.HWType", "VM.Config.Disk", "VM.Config.CPU", "VM.Config.Memory", "VM.Config.Network", "VM.Config.Options", "VM.Config.CDROM", "VM.PowerMgmt", "Datastore.AllocateSpace", "Datastore.Audit", "SDN.Use"}
	s.AddToken(Token{ID: "bootstrap@pve!vm", Secret: "s", ACL: []ACE{{Path: "/", Privileges: create}}})
	c := newClient(t, s)
	c.auth = "PVEAPIToken=bootstrap@pve!vm=s"
	if a := c.do("POST", "/nodes/pve/qemu", pciVM("701", "wk-1", "mapping=igpu,pcie=1")); a.code != 403 || a.msg != "Permission check failed (/mapping/pci/igpu, Mapping.Use)\n" {
		t.Errorf("hostpci mapping without Mapping.Use: %s %s", a.status, a.body)
	}
	if a := c.do("POST", "/nodes/pve/qemu", pciVM("701", "wk-1", "0000:00:02.0,pcie=1")); a.code != 500 || a.msg != "only root can set 'hostpci0' config for non-mapped devices\n" {
		t.Errorf("a raw address from a token: %s %s", a.status, a.body)
	}
	if a := c.do("POST", "/nodes/pve/qemu", pciVM("701", "wk-1", "mapping=1gpu")); a.code != 400 || !strings.Contains(string(a.body), "hostpci0") {
		t.Errorf("a mapping ID that is no configid: %s %s", a.status, a.body)
	}
	s.AddToken(Token{ID: "bootstrap@pve!gpu", Secret: "s", ACL: []ACE{{Path: "/", Privileges: create}, {Path: "/mapping/pci/igpu", Privileges: []string{"Mapping.Use"}}}})
	c.auth = "PVEAPIToken=bootstrap@pve!gpu=s"
	if st := c.waitTask(c.ok("POST", "/nodes/pve/qemu", pciVM("701", "wk-1", "mapping=igpu,pcie=1")).(string)); st["exitstatus"] != "OK" {
		t.Fatalf("create with Mapping.Use: %v", st)
	}
	if vm, _ := s.VM(701); vm.Config["hostpci0"] != "mapping=igpu,pcie=1" {
		t.Errorf("hostpci0 = %q", vm.Config["hostpci0"])
	}
}

// TestHostPCIAtStart: what vm_start refuses, and one running VM per
// device.
func TestHostPCIAtStart(t *testing.T) {
	changed := N100IGPU()
	changed.ID, changed.Device = "0000:00:03.0", "0x46d0"
	vf1, vf2 := N100IGPU(), N100IGPU()
	vf1.ID, vf2.ID = "0000:00:02.1", "0000:00:02.2"
	vf1.IOMMUGroup, vf2.IOMMUGroup = 20, 21
	vfs := PCIMapping{ID: "vf", Description: "two SR-IOV functions", Map: []string{
		"node=pve,path=0000:00:02.1,id=8086:46d1,subsystem-id=8086:7270,iommugroup=20",
		"node=pve,path=0000:00:02.2,id=8086:46d1,subsystem-id=8086:7270,iommugroup=21"}}
	s := newSim(t, Options{ISOs: []ISOSpec{{Storage: "local", Name: "talos.iso", Size: 100 << 20}},
		Node: NodeSpec{PCIDevices: []PCIDevice{N100IGPU(), changed, vf1, vf2}},
		PCIMappings: []PCIMapping{IGPUMapping("pve", "pve2"), vfs,
			{ID: "elsewhere", Description: "x", Map: []string{"node=pve2,path=0000:00:02.0,id=8086:46d1"}},
			{ID: "moved", Description: "x", Map: []string{"node=pve,path=0000:00:03.0,id=8086:46d1,subsystem-id=8086:7270,iommugroup=0"}}}})
	c := newClient(t, s)
	start := func(vmid string) map[string]any {
		t.Helper()
		return c.waitTask(c.ok("POST", "/nodes/pve/qemu/"+vmid+"/status/start", nil).(string))
	}
	vmid := 700
	startWith := func(hostpci, machine string) map[string]any {
		t.Helper()
		vmid++
		vm := pciVM(strconv.Itoa(vmid), "vm-"+strconv.Itoa(vmid), hostpci)
		vm.Set("machine", machine)
		if st := c.waitTask(c.ok("POST", "/nodes/pve/qemu", vm).(string)); st["exitstatus"] != "OK" {
			t.Fatalf("create %d: %v", vmid, st)
		}
		return start(strconv.Itoa(vmid))
	}
	for _, tc := range []struct{ hostpci, machine, want string }{
		{"mapping=elsewhere", "q35", "PCI device mapping not found for 'elsewhere'"},
		{"mapping=moved", "q35", "PCI device mapping invalid (hardware probably changed): 'id' does not match for 'moved' (8086:46d0 != 8086:46d1)"},
		{"mapping=igpu,pcie=1", "pc", "q35 machine model is not enabled"},
	} {
		if st := startWith(tc.hostpci, tc.machine); st["exitstatus"] != tc.want {
			t.Errorf("start with %s on %s: %v, want %q", tc.hostpci, tc.machine, st["exitstatus"], tc.want)
		}
	}
	if st := startWith("mapping=igpu,pcie=1", "q35"); st["exitstatus"] != "OK" {
		t.Fatalf("the first VM with the iGPU: %v", st)
	}
	first := strconv.Itoa(vmid)
	if st := startWith("mapping=igpu,pcie=1", "q35"); st["exitstatus"] != "PCI device '0000:00:02.0' already in use by VMID '"+first+"'" {
		t.Errorf("a second VM with the iGPU: %v", st["exitstatus"])
	}
	second := strconv.Itoa(vmid)
	c.waitTask(c.ok("POST", "/nodes/pve/qemu/"+first+"/status/stop", nil).(string))
	if st := start(second); st["exitstatus"] != "OK" {
		t.Errorf("the second VM once the first stopped: %v", st["exitstatus"])
	}
	// Two entries on the node: two VMs, a third finds none free.
	for i, want := range []string{"OK", "OK", "could not find a free device for 'hostpci0'"} {
		if st := startWith("mapping=vf,pcie=1", "q35"); st["exitstatus"] != want {
			t.Errorf("VM %d on the two functions: %v, want %q", i+1, st["exitstatus"], want)
		}
	}
}
