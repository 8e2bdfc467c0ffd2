package config

import (
	"cmp"
	"fmt"
	"regexp"
	"strings"
)

// MaxPCIDevices is how many hostpci<N> a VM may have: hostpci0 to
// hostpci15 ($MAX_HOSTPCI_DEVICES in qemu-server 9.2.6 and 8.4.10
// src/PVE/QemuServer/PCI.pm; the published schema lists hostpci[n]).
const MaxPCIDevices = 16

// mappingIDRE is pve-common's pve-configid format, which a hostpci
// mapping and a PCI mapping's id both take ($CONFIGID_RE in
// src/PVE/JSONSchema.pm, 9.2.1 and 8.3.8; qemu-server's $hostpci_fmt
// mapping, pve-guest-common 6.0.2 src/PVE/Mapping/PCI.pm id).
var mappingIDRE = regexp.MustCompile(`^(?i)[a-z][a-z0-9_-]+$`)

// rawPCIRE is a host PCI address as qemu-server's hostpci 'host' key
// takes it ($PCIRE: [domain:]bus:slot[.function], hexadecimal).
var rawPCIRE = regexp.MustCompile(`^(?i)([a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(\.[a-f0-9])?$`)

// mdevTypeRE is $hostpci_fmt's mdev pattern.
var mdevTypeRE = regexp.MustCompile(`^[^/.:]+$`)

// IsQ35 reports whether machine is a q35 type (q35 or pc-q35-…), the only
// one on which qemu-server passes a device on PCIe
// (PVE::QemuServer::Machine machine_type_is_q35; parse_hostpci_devices
// dies "q35 machine model is not enabled" at start otherwise, qemu-server
// 9.2.6 src/PVE/QemuServer/PCI.pm).
func IsQ35(machine string) bool {
	return machine == "q35" || strings.HasPrefix(machine, "pc-q35-")
}

// pciList checks one pci list (proxmox.vm.pci or a node's) for what is
// knowable without Proxmox: the mapping id, the count, pcie against the
// machine type the list is used with, one primary GPU.
func (v *validator) pciList(path string, devs []PCIDevice, machine string) {
	if len(devs) > MaxPCIDevices {
		v.errf(path, "has %d devices: Proxmox gives a VM at most %d (hostpci0 to hostpci%d)", len(devs), MaxPCIDevices, MaxPCIDevices-1)
	}
	primary := 0
	for i, d := range devs {
		p := fmt.Sprintf("%s[%d]", path, i)
		switch {
		case d.Mapping == "":
			v.errf(p+".mapping", "is required: the ID of a PCI resource mapping (Datacenter → Resource Mappings in Proxmox)")
		case rawPCIRE.MatchString(d.Mapping):
			v.errf(p+".mapping", "%q is a host PCI address: Proxmox lets only root@pam pass a raw address (\"only root can set 'hostpci0' config for non-mapped devices\"), so this tool passes devices by resource mapping only; create one for it (as root: pvesh create /cluster/mapping/pci --id igpu --map node=<member>,path=%s,id=<vendor>:<device>, the IDs lspci -nn shows; or Datacenter → Resource Mappings) and name it here", d.Mapping, d.Mapping)
		case !mappingIDRE.MatchString(d.Mapping):
			v.errf(p+".mapping", "%q is not a Proxmox mapping ID: two or more letters, digits, '-' or '_', the first a letter", d.Mapping)
		}
		if d.PCIe != "" && d.PCIe != On && d.PCIe != Off {
			v.errf(p+".pcie", "%q is not offered: use on, off", d.PCIe)
		}
		if d.PCIe == On && machine != "" && !IsQ35(machine) {
			v.errf(p+".pcie", "on needs a q35 machine (Proxmox fails the start with \"q35 machine model is not enabled\"), but the VM's machine is %s: set pcie off or the machine to q35", machine)
		}
		if d.ROMBar != "" && d.ROMBar != On && d.ROMBar != Off {
			v.errf(p+".rombar", "%q is not offered: use on, off", d.ROMBar)
		}
		if d.MDev != "" && !mdevTypeRE.MatchString(d.MDev) {
			v.errf(p+".mdev", "%q is not a mediated device type: no '/', '.' or ':'", d.MDev)
		}
		if d.PrimaryGPU {
			primary++
			if primary == 2 {
				v.errf(p+".primaryGPU", "a VM has one primary GPU: set primaryGPU on one device only")
			}
		}
	}
}

// nodePCI checks a node's effective pci list: its own (checked as a list
// here), or an inherited one (proxmox.roleVM's or proxmox.vm's, checked
// there against that level's machine) against a machine set on a
// narrower level; and that a VM with devices is pinned to a member when
// there are several: a device serves the member it is in, and
// auto-placement does not read the mappings.
func (v *validator) nodePCI(p string, n Node) {
	eff := v.c.VMShapeOf(n)
	pv := v.c.Proxmox
	role, rolePath := pv.RoleVM.Worker, "proxmox.roleVM.worker"
	if n.Role == RoleControlPlane {
		role, rolePath = pv.RoleVM.ControlPlane, "proxmox.roleVM.controlplane"
	}
	// The machine the inherited list was checked with, and where it came from.
	listMachine, from := pv.VM.Machine, "proxmox.vm.pci"
	if role.PCI != nil {
		listMachine, from = cmp.Or(role.Machine, pv.VM.Machine), rolePath+".pci"
	}
	machinePath := p + ".vm.machine"
	if n.VM.Machine == "" {
		machinePath = rolePath + ".machine"
	}
	switch {
	case n.VM.PCI != nil:
		v.pciList(p+".vm.pci", n.VM.PCI, eff.Machine)
	case eff.Machine != listMachine && !IsQ35(eff.Machine):
		for _, d := range eff.PCI {
			if d.PCIe == On {
				v.errf(machinePath, "%s is not q35, but %s passes %s on PCIe (pcie: on), which Proxmox refuses there: keep q35, or give the node a pci list of its own", eff.Machine, from, d.Mapping)
				break
			}
		}
	}
	if len(eff.PCI) > 0 && len(v.c.Proxmox.Hosts) > 1 && n.Host == "" {
		v.errf(p+".host", "is required for a VM with pci devices when proxmox.hosts has several members: a mapped device lives in one member, so set the member whose mapping entry the VM takes (one of %s)", strings.Join(v.c.Proxmox.Hosts, ", "))
	}
}
