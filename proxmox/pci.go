package proxmox

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/homelab/bootstrap/check"
)

// Host PCI devices pass through to a VM only by a Proxmox resource
// mapping (hostpci<N>: mapping=<id>): a raw host address is for root@pam
// alone ("only root can set 'hostpci<N>' config for non-mapped devices",
// check_hostpci_perm in qemu-server 9.2.6 and 8.4.10
// src/PVE/API2/Qemu.pm), and a mapping is what a token can be granted
// (Mapping.Use on /mapping/pci/<id>).

// PCIDevice is one mapped host PCI device of a new VM (hostpci<N>, in
// qemu-server's $hostpci_fmt, 9.2.6 and 8.4.10
// src/PVE/QemuServer/PCI.pm).
type PCIDevice struct {
	// Mapping is the cluster-wide PCI mapping's ID.
	Mapping string
	// PCIe is "on", "off", or "" (on with a q35 machine, else off).
	PCIe string
	// PrimaryGPU is x-vga: the device becomes the VM's GPU and its
	// emulated display is dropped (vga none unless set:
	// print_hostpci_devices).
	PrimaryGPU bool
	// ROMBar is "off" to hide the device's ROM; "" or "on" is Proxmox's
	// default (rombar 1).
	ROMBar string
	// MDev is a mediated device type created on the mapped device at
	// start; "" passes the device itself.
	MDev string
}

// isQ35 is qemu-server's machine_type_is_q35 for the types proxmox.vm
// offers (src/PVE/QemuServer/Machine.pm at 9.2.6): q35 and pc-q35-….
func isQ35(machine string) bool {
	return machine == "q35" || strings.HasPrefix(machine, "pc-q35-")
}

// hostpci is the device's hostpci<N> value on a VM of machine type
// machine: mapping first, then only what differs from Proxmox's defaults
// (pcie 0, x-vga 0, rombar 1).
func (d PCIDevice) hostpci(machine string) string {
	v := "mapping=" + d.Mapping
	if d.PCIe == "on" || (d.PCIe == "" && isQ35(machine)) {
		v += ",pcie=1"
	}
	if d.PrimaryGPU {
		v += ",x-vga=1"
	}
	if d.ROMBar == "off" {
		v += ",rombar=0"
	}
	if d.MDev != "" {
		v += ",mdev=" + d.MDev
	}
	return v
}

// hostpciParams are the hostpci<N> options of a new VM with hw.
func (h Hardware) hostpciParams() map[string]string {
	out := map[string]string{}
	for i, d := range h.PCI {
		out["hostpci"+strconv.Itoa(i)] = d.hostpci(h.MachineType())
	}
	return out
}

// maxHostPCI is $MAX_HOSTPCI_DEVICES (qemu-server 9.2.6 and 8.4.10
// src/PVE/QemuServer/PCI.pm): hostpci0 to hostpci15.
const maxHostPCI = 16

// hostpciUse is one hostpci<N> of a VM config, as the reservation at
// start sees it.
type hostpciUse struct {
	key, mapping string
	mdev         bool
}

// parseHostPCI reads the mapped devices of a VM config: raw host
// addresses (root@pam's) are left out.
func parseHostPCI(cfg map[string]string) []hostpciUse {
	var out []hostpciUse
	for i := 0; i < maxHostPCI; i++ {
		k := "hostpci" + strconv.Itoa(i)
		v, ok := cfg[k]
		if !ok {
			continue
		}
		u := hostpciUse{key: k}
		for _, part := range strings.Split(v, ",") {
			key, val, _ := strings.Cut(part, "=")
			switch key {
			case "mapping":
				u.mapping = val
			case "mdev":
				u.mdev = val != ""
			}
		}
		if u.mapping != "" {
			out = append(out, u)
		}
	}
	return out
}

// canonHostPCI is a hostpci value with its options sorted and booleans
// spelled 1/0, so that equal settings compare equal.
func canonHostPCI(v string) string {
	if v == "" {
		return ""
	}
	parts := strings.Split(v, ",")
	for i, p := range parts {
		k, val, ok := strings.Cut(p, "=")
		if !ok {
			// The default key is host.
			k, val = "host", p
		}
		switch strings.ToLower(val) {
		case "1", "on", "yes", "true":
			if k != "mapping" && k != "host" && k != "mdev" {
				val = "1"
			}
		case "0", "off", "no", "false":
			if k != "mapping" && k != "host" && k != "mdev" {
				val = "0"
			}
		}
		parts[i] = k + "=" + val
	}
	// Defaults left out: pcie 0, x-vga 0, rombar 1.
	parts = slices.DeleteFunc(parts, func(p string) bool { return p == "pcie=0" || p == "x-vga=0" || p == "rombar=1" })
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// reportPCI reports where an adopted VM's mapped devices differ from
// proxmox.vm's pci: a VM keeps its hardware, and the report gives the qm
// command that changes it (on the member that runs the VM).
func reportPCI(s VMSpec, cfg *VMConfig, report func(field, want, have, why string)) {
	want := s.Hardware.hostpciParams()
	for i := 0; i < maxHostPCI; i++ {
		k := "hostpci" + strconv.Itoa(i)
		w, h := want[k], cfg.Effective[k]
		if canonHostPCI(w) == canonHostPCI(h) {
			continue
		}
		var why string
		if w == "" {
			why = fmt.Sprintf("a VM keeps the hardware it was created with; to remove it, on the member that runs the VM: qm set %d --delete %s", s.VMID, k)
		} else {
			d := s.Hardware.PCI[i]
			why = fmt.Sprintf("a VM keeps the hardware it was created with; to pass the device, on the member that runs the VM (as a user with Mapping.Use on /mapping/pci/%s): qm set %d --%s %s (it applies at the VM's next start)", d.Mapping, s.VMID, k, w)
		}
		report(k, cmp.Or(w, "none"), cmp.Or(h, "none"), why)
	}
}

// PCIMapping is one cluster-wide PCI resource mapping, as GET
// /cluster/mapping/pci lists it (pve-manager 9.2.11 and 8.4.21
// PVE/API2/Cluster/Mapping/PCI.pm index: the mapping's config entry with
// its id; pve-guest-common 6.0.2 src/PVE/Mapping/PCI.pm for the keys).
type PCIMapping struct {
	ID string
	// MDev marks the devices as able to provide mediated devices.
	MDev bool
	// LiveMigration is live-migration-capable (pve-guest-common 5.1.7 and
	// later, PVE 8.4): QemuMigrate live-migrates a running VM with the
	// device only when it is set.
	LiveMigration bool
	Map           []PCIMapEntry
}

// PCIMapEntry is one node's device of a mapping ($map_fmt).
type PCIMapEntry struct {
	Node string
	// Paths are the device's addresses (path, ';'-separated): a
	// multifunction device passed whole. A path without a function is the
	// whole device, checked as function 0 (assert_valid).
	Paths []string
	// ID is vendor:device; SubsystemID subsystem vendor:device ("" when
	// not set); IOMMUGroup -1 when not set.
	ID, SubsystemID string
	IOMMUGroup      int
}

// On are the entries of node.
func (m PCIMapping) On(node string) []PCIMapEntry {
	var out []PCIMapEntry
	for _, e := range m.Map {
		if e.Node == node {
			out = append(out, e)
		}
	}
	return out
}

// Nodes are the members the mapping has an entry for, sorted.
func (m PCIMapping) Nodes() []string {
	var out []string
	for _, e := range m.Map {
		if !slices.Contains(out, e.Node) {
			out = append(out, e.Node)
		}
	}
	sort.Strings(out)
	return out
}

func parsePCIMapEntry(s string) PCIMapEntry {
	e := PCIMapEntry{IOMMUGroup: -1}
	for _, part := range strings.Split(s, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "node":
			e.Node = v
		case "path":
			e.Paths = strings.Split(v, ";")
		case "id":
			e.ID = strings.ToLower(v)
		case "subsystem-id":
			e.SubsystemID = strings.ToLower(v)
		case "iommugroup":
			if n, err := strconv.Atoi(v); err == nil {
				e.IOMMUGroup = n
			}
		}
	}
	return e
}

// PCIMappings lists the PCI mappings the token may see: those it holds
// Mapping.Use, Mapping.Modify or Mapping.Audit on (the index skips the
// others).
func (c *Client) PCIMappings(ctx context.Context) (map[string]PCIMapping, error) {
	rows, err := c.getList(ctx, "/cluster/mapping/pci")
	if err != nil {
		return nil, err
	}
	out := map[string]PCIMapping{}
	for _, e := range rows {
		m := PCIMapping{ID: str(e["id"]), MDev: num(e["mdev"]) > 0, LiveMigration: num(e["live-migration-capable"]) > 0}
		for _, s := range list(e["map"]) {
			m.Map = append(m.Map, parsePCIMapEntry(s))
		}
		out[m.ID] = m
	}
	return out, nil
}

// HostPCIDevice is one PCI device of a member (GET
// /nodes/{node}/hardware/pci: pve-common's SysFSTools lspci, 9.2.1).
type HostPCIDevice struct {
	// ID is the address, 0000:00:02.0.
	ID string
	// VendorDevice is vendor:device without 0x, lower case (8086:46d1);
	// Subsystem likewise, "" when the device has none.
	VendorDevice, Subsystem string
	IOMMUGroup              int
	MDev                    bool
}

func hex4(v any) string { return strings.ToLower(strings.TrimPrefix(str(v), "0x")) }

// HostPCI lists this member's PCI devices, without the classes the call
// hides by default (05 memory, 06 bridge, 0b processor: pve-manager
// PVE/API2/Hardware/PCI.pm). It needs Sys.Audit or Sys.Modify on /.
func (c *Client) HostPCI(ctx context.Context) (map[string]HostPCIDevice, error) {
	rows, err := c.getList(ctx, "/nodes/"+c.node+"/hardware/pci")
	if err != nil {
		return nil, err
	}
	out := map[string]HostPCIDevice{}
	for _, e := range rows {
		d := HostPCIDevice{ID: str(e["id"]), VendorDevice: hex4(e["vendor"]) + ":" + hex4(e["device"]), IOMMUGroup: int(num(e["iommugroup"])), MDev: num(e["mdev"]) > 0}
		if sv, sd := hex4(e["subsystem_vendor"]), hex4(e["subsystem_device"]); sv != "" && sd != "" {
			d.Subsystem = sv + ":" + sd
		}
		out[d.ID] = d
	}
	return out, nil
}

// validOn is PVE::Mapping::PCI::assert_valid (pve-guest-common 6.0.2),
// which qemu-server runs for each entry at start (parse_hostpci: "PCI
// device mapping invalid (hardware probably changed)"): each path's device
// is present with the entry's vendor:device, subsystem and (first path
// only) IOMMU group, and is mdev-capable exactly when the mapping is
// marked mdev. "" when it holds.
func validOn(m PCIMapping, e PCIMapEntry, devs map[string]HostPCIDevice) string {
	for i, p := range e.Paths {
		path := strings.ToLower(p)
		if !strings.Contains(path, ".") {
			path += ".0"
		}
		d, ok := devs[path]
		switch {
		case !ok:
			return fmt.Sprintf("pci device '%s' not found", path)
		case d.VendorDevice != e.ID:
			return fmt.Sprintf("'id' does not match for '%s' (%s != %s)", m.ID, d.VendorDevice, e.ID)
		case e.SubsystemID != "" && d.Subsystem != e.SubsystemID:
			return fmt.Sprintf("'subsystem-id' does not match for '%s' (%s != %s)", m.ID, d.Subsystem, e.SubsystemID)
		case e.SubsystemID == "" && d.Subsystem != "":
			return fmt.Sprintf("missing expected property 'subsystem-id' for device '%s'", path)
		case i == 0 && e.IOMMUGroup >= 0 && d.IOMMUGroup != e.IOMMUGroup:
			return fmt.Sprintf("'iommugroup' does not match for '%s' (%d != %d)", m.ID, d.IOMMUGroup, e.IOMMUGroup)
		case i == 0 && e.IOMMUGroup < 0 && d.IOMMUGroup >= 0:
			return fmt.Sprintf("missing expected property 'iommugroup' for device '%s'", path)
		case d.MDev != m.MDev:
			return fmt.Sprintf("'mdev' does not match for '%s' (%d != %d)", m.ID, b2i(d.MDev), b2i(m.MDev))
		}
	}
	return ""
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// pciNeeds are what passing mapped devices needs of the token: Mapping.Use
// on each mapping a new VM takes (check_hostpci_perm, qemu-server 9.2.6
// and 8.4.10 src/PVE/API2/Qemu.pm; its VM.Config.HWType is among the
// create privileges). With Mapping.Use the token also reads the mapping
// (GET /cluster/mapping/pci lists what it holds Use, Modify or Audit on).
func pciNeeds(in PrecheckInput, plans map[int]Plan) []Need {
	var needs []Need
	for _, s := range in.VMs {
		if p, planned := plans[s.VMID]; planned && !p.Create && !p.WaitCreate {
			continue
		}
		for _, d := range s.Hardware.PCI {
			needs = append(needs, allOf(fmt.Sprintf("pass the mapped device %s to VM %d", d.Mapping, s.VMID), "/mapping/pci/"+d.Mapping, "Mapping.Use"))
		}
	}
	return needs
}

// pciMissingHint points a missing Mapping.Use at README's PCI section:
// the runner role on / leaves it out, it is granted per mapping.
func pciMissingHint(miss []Grant) string {
	for _, g := range miss {
		if strings.HasPrefix(g.Path, "/mapping/pci/") {
			return `; Mapping.Use is granted on each PCI mapping, e.g. the role PVEMappingUser: README's "PCI devices"`
		}
	}
	return ""
}

// PCICheck names the precheck row of the mapped PCI devices.
const PCICheck = "proxmox: PCI devices"

// usesPCI reports whether any spec passes a device.
func usesPCI(specs []VMSpec) bool {
	return slices.ContainsFunc(specs, func(s VMSpec) bool { return len(s.Hardware.PCI) > 0 })
}

// checkPCI is the PCI devices row. For each VM with mapped devices (a new
// VM's from its spec, an adopted one's from its config, where it runs):
// the mapping exists and the token sees it, it has an entry for the VM's
// member, the entry's device is present there as qemu-server checks at
// start, and no device would serve more running VMs than the mapping has
// entries on that member. With proxmox.ha it warns about devices Proxmox
// cannot live-migrate.
func (f *facts) checkPCI(ctx context.Context) (check.Status, string) {
	ps, placed, err := f.placedPlans(ctx)
	if err != nil {
		return check.Failf("%v", err)
	}
	type use struct {
		vm   VMSpec
		key  string
		mdev bool
	}
	byMapping := map[string][]use{}
	var ids []string
	for _, s := range placed {
		var uses []hostpciUse
		if p, ok := ps.plans[s.VMID]; ok && p.Config != nil {
			uses = parseHostPCI(p.Config.Effective)
		} else {
			for k, v := range s.Hardware.hostpciParams() {
				uses = append(uses, parseHostPCI(map[string]string{k: v})...)
			}
			sort.Slice(uses, func(i, j int) bool { return uses[i].key < uses[j].key })
		}
		for _, u := range uses {
			if _, seen := byMapping[u.mapping]; !seen {
				ids = append(ids, u.mapping)
			}
			byMapping[u.mapping] = append(byMapping[u.mapping], use{vm: s, key: u.key, mdev: u.mdev})
		}
	}
	if len(ids) == 0 {
		return check.Passf("no VM of this cluster passes a device (the VMs that exist keep theirs: see the provision stage's report)")
	}
	sort.Strings(ids)
	maps, err := f.c.PCIMappings(ctx)
	if err != nil {
		return check.Failf("cannot list the PCI resource mappings: %v", err)
	}
	hw := map[string]map[string]HostPCIDevice{}
	hostPCI := func(node string) (map[string]HostPCIDevice, error) {
		if d, ok := hw[node]; ok {
			return d, nil
		}
		d, err := f.c.On(node).HostPCI(ctx)
		if err == nil {
			hw[node] = d
		}
		return d, err
	}
	var fails, warns, parts []string
	for _, id := range ids {
		uses := byMapping[id]
		m, ok := maps[id]
		if !ok {
			path := "/mapping/pci/" + id
			held, err := f.c.Permissions(ctx, []string{path})
			if err == nil && !held[path]["Mapping.Use"] && !held[path]["Mapping.Audit"] && !held[path]["Mapping.Modify"] {
				warns = append(warns, fmt.Sprintf("could not check mapping %s: the token may not read it (it needs Mapping.Use on %s to pass the device, which also lets it read the mapping; Mapping.Audit reads it alone)", id, path))
				continue
			}
			fails = append(fails, fmt.Sprintf("PCI mapping %s does not exist (%s wants it): create it as root (Datacenter → Resource Mappings, or pvesh create /cluster/mapping/pci --id %s --map node=<member>,path=<address>,id=<vendor>:<device>)", id, vmNames(uses, func(u use) VMSpec { return u.vm }), id))
			continue
		}
		byNode := map[string][]use{}
		var nodes []string
		for _, u := range uses {
			if _, seen := byNode[u.vm.Node]; !seen {
				nodes = append(nodes, u.vm.Node)
			}
			byNode[u.vm.Node] = append(byNode[u.vm.Node], u)
		}
		sort.Strings(nodes)
		for _, node := range nodes {
			here := byNode[node]
			entries := m.On(node)
			if len(entries) == 0 {
				// parse_hostpci at start: find_on_current_node finds none.
				fails = append(fails, fmt.Sprintf("PCI mapping %s has no entry for %s, where %s runs or will be created (Proxmox fails the start with \"PCI device mapping not found for '%s'\"); it has entries for %s: add one for %s, or put the VM on one of those (nodes[].host)", id, node, vmNames(here, func(u use) VMSpec { return u.vm }), id, orNone(m.Nodes()), node))
				continue
			}
			devs, err := hostPCI(node)
			switch {
			case IsForbidden(err):
				warns = append(warns, fmt.Sprintf("could not check mapping %s's devices on %s: listing a member's PCI devices needs Sys.Audit on /", id, node))
			case err != nil:
				warns = append(warns, fmt.Sprintf("could not check mapping %s's devices on %s: %v", id, node, err))
			default:
				bad := false
				for _, e := range entries {
					if why := validOn(m, e, devs); why != "" {
						fails = append(fails, fmt.Sprintf("PCI mapping %s on %s does not match the hardware, so Proxmox fails the start with \"PCI device mapping invalid (hardware probably changed): %s\": fix the mapping's entry for %s", id, node, why, node))
						bad = true
						break
					}
				}
				if bad {
					continue
				}
			}
			// A device serves one running VM: vm_start reserves its PCI IDs
			// (reserve_pci_usage, "already in use by VMID"), and with several
			// entries on a member choose_hostpci_devices takes a free one.
			// Mediated devices are not reserved (vm_start skips them): each
			// VM gets an instance, as many as the device offers (not read).
			var whole []use
			for _, u := range here {
				if !u.mdev {
					whole = append(whole, u)
				}
			}
			if len(whole) > len(entries) {
				fails = append(fails, fmt.Sprintf("PCI mapping %s has %d device(s) on %s, but %s would use %d: a device serves one running VM, so Proxmox refuses the next start (\"PCI device … already in use by VMID …\"); give the mapping more entries on %s (e.g. SR-IOV virtual functions) or put the VMs on other members", id, len(entries), node, vmNames(whole, func(u use) VMSpec { return u.vm }), len(whole), node))
				continue
			}
			parts = append(parts, fmt.Sprintf("%s on %s for %s", id, node, vmNames(here, func(u use) VMSpec { return u.vm })))
		}
		if f.in.HA && !m.LiveMigration {
			others := slices.DeleteFunc(slices.Clone(f.in.Hosts), func(h string) bool { return slices.Contains(m.Nodes(), h) })
			w := fmt.Sprintf("with proxmox.ha, %s uses mapping %s, which is not live-migration-capable: Proxmox refuses to live-migrate it (\"can't live migrate running VM which uses following mapped devices\"), so HA moves it only stopped (relocate), and a recovery to a member without an entry fails its start", vmNames(uses, func(u use) VMSpec { return u.vm }), id)
			if len(others) > 0 {
				w += fmt.Sprintf(" (none on %s)", strings.Join(others, ", "))
			}
			warns = append(warns, w)
		}
	}
	switch {
	case len(fails) > 0:
		return check.Failf("%s", strings.Join(append(fails, warns...), "; "))
	case len(warns) > 0:
		return check.Warnf("%s", strings.Join(append(parts, warns...), "; "))
	}
	return check.Passf("%s", strings.Join(parts, "; "))
}

func orNone(xs []string) string {
	if len(xs) == 0 {
		return "no member"
	}
	return strings.Join(xs, ", ")
}

// vmNames names the distinct VMs of xs, in order.
func vmNames[T any](xs []T, vm func(T) VMSpec) string {
	var names []string
	for _, x := range xs {
		if n := vm(x).Name; !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return strings.Join(names, ", ")
}
