package pvesim

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Host PCI devices and the cluster's PCI resource mappings:
//
//   - GET /cluster/mapping/pci and /cluster/mapping/pci/{id} (pve-manager
//     9.2.11 and 8.4.21 PVE/API2/Cluster/Mapping/PCI.pm, the same in both):
//     the list holds the mappings the caller has Mapping.Modify, .Use or
//     .Audit on, each its config entry with its id (check-node adds the
//     node's diagnostics); one mapping needs one of those privileges and
//     dies "mapping '<id>' not found" (500) when there is none.
//   - GET /nodes/{node}/hardware/pci (pve-manager PVE/API2/Hardware/PCI.pm,
//     Sys.Audit or Sys.Modify on /): the node's devices (pve-common 9.2.1
//     SysFSTools lspci) without the classes of pci-class-blacklist
//     (default 05;06;0b).
//   - hostpci<N> on create and update: its format (qemu-server 9.2.6 and
//     8.4.10 src/PVE/QemuServer/PCI.pm $hostpci_fmt; 'driver' from 9.0.25)
//     and check_hostpci_perm (src/PVE/API2/Qemu.pm): a raw address is
//     root@pam's, a mapping needs Mapping.Use on /mapping/pci/<id>.
//   - vm_start (src/PVE/QemuServer.pm, PCI.pm parse_hostpci,
//     parse_hostpci_devices, choose_hostpci_devices, reserve_pci_usage):
//     the mapping's entries for this node, each checked against the
//     hardware (PVE::Mapping::PCI::assert_valid, pve-guest-common 6.0.2),
//     pcie only on q35, and each device reserved for one running VM; a
//     mediated device is not reserved.

// PCIMapping is a cluster-wide PCI resource mapping (mapping/pci.cfg):
// Options.PCIMappings, the same on every member.
type PCIMapping struct {
	ID          string
	Description string
	// MDev marks the devices as providing mediated devices.
	MDev bool
	// LiveMigrationCapable exists from pve-guest-common 5.1.7 (PVE 8.4):
	// before it, the answers leave it out.
	LiveMigrationCapable bool
	// Map are the entries as the config writes them:
	// "node=pve,path=0000:00:02.0,id=8086:46d1,iommugroup=0".
	Map []string
}

// PCIDevice is a host PCI device as lspci reads it from sysfs.
type PCIDevice struct {
	// ID is the address, "0000:00:02.0".
	ID string
	// Class, Vendor, Device, SubsystemVendor, SubsystemDevice are sysfs'
	// hex values with 0x ("0x030000", "0x8086").
	Class, Vendor, Device            string
	SubsystemVendor, SubsystemDevice string
	VendorName, DeviceName           string
	// IOMMUGroup is -1 without an IOMMU.
	IOMMUGroup int
	// MDev: the device offers mediated device types.
	MDev bool
}

// N100IGPU is the integrated GPU of the lab's reference host, an Intel
// N100: 00:02.0, the iGPU's usual address. Its device ID 0x46d1 is one of
// the Alder Lake-N IDs the Linux i915 driver lists (INTEL_ADLN_IDS:
// 46d0, 46d1, 46d2); that an N100 reports 46d1 rather than another of
// them is unverified. The subsystem (the board vendor's) and the IOMMU
// group are made up.
func N100IGPU() PCIDevice {
	return PCIDevice{ID: "0000:00:02.0", Class: "0x030000", Vendor: "0x8086", Device: "0x46d1",
		SubsystemVendor: "0x8086", SubsystemDevice: "0x7270", VendorName: "Intel Corporation",
		DeviceName: "Alder Lake-N [UHD Graphics]", IOMMUGroup: 0}
}

// IGPUMapping is the mapping "igpu" of N100IGPU on nodes, as Proxmox's GUI
// writes it (id, subsystem-id and iommugroup from the device).
func IGPUMapping(nodes ...string) PCIMapping {
	d := N100IGPU()
	m := PCIMapping{ID: "igpu", Description: "N100 UHD Graphics"}
	for _, n := range nodes {
		m.Map = append(m.Map, fmt.Sprintf("node=%s,path=%s,id=%s:%s,subsystem-id=%s:%s,iommugroup=%d",
			n, d.ID, hex4(d.Vendor), hex4(d.Device), hex4(d.SubsystemVendor), hex4(d.SubsystemDevice), d.IOMMUGroup))
	}
	return m
}

func hex4(v string) string { return strings.ToLower(strings.TrimPrefix(v, "0x")) }

var (
	hostpciRE = regexp.MustCompile(`^hostpci(\d+)$`)
	// configIDRE is pve-common's pve-configid ($CONFIGID_RE, 9.2.1).
	configIDRE = regexp.MustCompile(`^(?i)[a-z][a-z0-9_-]+$`)
	// pciAddrRE is $hostpci_fmt's host pattern: one address of $PCIRE.
	pciAddrRE = regexp.MustCompile(`^([a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(\.[a-f0-9])?$`)
	hexIDRE   = regexp.MustCompile(`^0x[0-9a-fA-F]{4}$`)
)

// isHostPCIKey: hostpci0 to hostpci15 ($MAX_HOSTPCI_DEVICES 16).
func isHostPCIKey(k string) bool {
	m := hostpciRE.FindStringSubmatch(k)
	if m == nil {
		return false
	}
	n, _ := strconv.Atoi(m[1])
	return n < 16
}

// hostpciOpt is a parsed hostpci value.
type hostpciOpt struct {
	host, mapping, mdev string
	pcie, romfile       bool
}

// parseHostPCIValue reads a hostpci value as pve-qm-hostpci; the message
// is the schema's, "" when it is valid.
func parseHostPCIValue(k, v string, withDriver bool) (hostpciOpt, string) {
	var o hostpciOpt
	bad := func(sub, msg string) (hostpciOpt, string) {
		return o, "invalid format - format error\n" + k + "." + sub + ": " + msg
	}
	for i, part := range strings.Split(v, ",") {
		key, val, hasEq := strings.Cut(part, "=")
		if i == 0 && !hasEq {
			key, val = "host", part
		}
		switch key {
		case "host":
			for _, a := range strings.Split(val, ";") {
				if !pciAddrRE.MatchString(a) {
					return bad(key, "value does not match the regex pattern")
				}
			}
			o.host = val
		case "mapping":
			if !configIDRE.MatchString(val) {
				return bad(key, "invalid configuration ID '"+val+"'")
			}
			o.mapping = val
		case "rombar", "pcie", "x-vga", "legacy-igd":
			b, ok := pveBool(val)
			if !ok {
				return bad(key, "type check ('boolean') failed - got '"+val+"'")
			}
			if key == "pcie" {
				o.pcie = b
			}
		case "romfile":
			o.romfile = true
		case "mdev":
			if strings.ContainsAny(val, "/.:") || val == "" {
				return bad(key, "value does not match the regex pattern")
			}
			o.mdev = val
		case "vendor-id", "device-id", "sub-vendor-id", "sub-device-id":
			if !hexIDRE.MatchString(val) {
				return bad(key, "value does not match the regex pattern")
			}
		case "driver":
			if !withDriver {
				return bad(key, "property is not defined in schema and the schema does not allow additional properties")
			}
			if val != "vfio" && val != "keep" {
				return bad(key, "value '"+val+"' does not have a value in the enumeration 'vfio, keep'")
			}
		default:
			return bad(key, "property is not defined in schema and the schema does not allow additional properties")
		}
	}
	return o, ""
}

func pveBool(v string) (bool, bool) {
	switch strings.ToLower(v) {
	case "1", "yes", "on", "true":
		return true, true
	case "0", "no", "off", "false":
		return false, true
	}
	return false, false
}

// hostpciPerms is check_hostpci_perm for every hostpci option set (on
// create and update, qemu-server 9.2.6 and 8.4.10 src/PVE/API2/Qemu.pm);
// $check_vm_modify_config_perm skips these options.
func hostpciPerms(who *identity, id int, cfg map[string]string) *apiError {
	// 'root@pam' the user, not a token of it (see configPerms).
	if who.name() == "root@pam" {
		return nil
	}
	for _, k := range sortedKeys(cfg) {
		if !isHostPCIKey(k) {
			continue
		}
		o, _ := parseHostPCIValue(k, cfg[k], true)
		switch {
		case o.host != "":
			return errf(500, "only root can set '%s' config for non-mapped devices", k)
		case o.mapping != "":
			if aerr := who.check("/mapping/pci/"+o.mapping, "Mapping.Use"); aerr != nil {
				return aerr
			}
			if aerr := who.check("/vms/"+strconv.Itoa(id), "VM.Config.HWType"); aerr != nil {
				return aerr
			}
		default:
			return errf(500, "either 'host' or 'mapping' must be set.")
		}
		if o.romfile {
			return paramErr(map[string]string{k: "only root@pam can set 'romfile' option"})
		}
	}
	return nil
}

// liveMigrationKnown: pve-guest-common 5.1.7 (PVE 8.4) added
// live-migration-capable to the mapping schema.
func (s *Server) liveMigrationKnown() bool {
	major, minor := s.versionLocked()
	return major > 8 || (major == 8 && minor >= 4)
}

// mappingEntry is a mapping's config entry as the API answers it.
func (s *Server) mappingEntry(m PCIMapping, withID bool) map[string]any {
	e := map[string]any{"type": "pci", "map": append([]string{}, m.Map...), "digest": "0000000000000000000000000000000000000000",
		// pvesim always answers a description: the schema of the index
		// calls it required, while PVE leaves an unset one out.
		"description": m.Description}
	if withID {
		e["id"] = m.ID
	}
	if m.MDev {
		e["mdev"] = 1
	}
	s.mu.Lock()
	known := s.liveMigrationKnown()
	s.mu.Unlock()
	if m.LiveMigrationCapable && known {
		e["live-migration-capable"] = 1
	}
	return e
}

func canSeeMapping(who *identity, id string) bool {
	return who.checkAny("/mapping/pci/"+id, "Mapping.Modify", "Mapping.Use", "Mapping.Audit") == nil
}

// mappingIndex is GET /cluster/mapping/pci.
func (s *Server) mappingIndex(r *request) (any, *apiError) {
	check := r.param("check-node")
	if check != "" && check != "localhost" && check != s.node.Name {
		if peer := s.peer(check); peer != nil {
			return peer.mappingIndex(r)
		}
		return nil, errf(500, "hostname lookup '%s' failed - failed to get address info for: %s: Name or service not known", check, check)
	}
	out := []any{}
	for _, m := range s.opts.PCIMappings {
		if !canSeeMapping(r.who, m.ID) {
			continue
		}
		e := s.mappingEntry(m, true)
		if check != "" {
			checks := []any{}
			entries := nodeEntries(m, s.node.Name)
			if len(entries) == 0 {
				checks = append(checks, map[string]any{"severity": "warning", "message": "No mapping for node " + s.node.Name + "."})
			}
			for _, en := range entries {
				if err := s.assertValid(m, en); err != "" {
					checks = append(checks, map[string]any{"severity": "error", "message": "Invalid configuration: " + err + "\n"})
				}
			}
			e["checks"] = checks
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].(map[string]any)["id"].(string) < out[j].(map[string]any)["id"].(string)
	})
	return out, nil
}

// mappingGet is GET /cluster/mapping/pci/{id}.
func (s *Server) mappingGet(r *request, id string) (any, *apiError) {
	if aerr := r.who.checkAny("/mapping/pci/"+id, "Mapping.Use", "Mapping.Modify", "Mapping.Audit"); aerr != nil {
		return nil, aerr
	}
	for _, m := range s.opts.PCIMappings {
		if m.ID == id {
			return s.mappingEntry(m, false), nil
		}
	}
	return nil, errf(500, "mapping '%s' not found", id)
}

// hardwarePCI is GET /nodes/{node}/hardware/pci.
func (s *Server) hardwarePCI(r *request) (any, *apiError) {
	if aerr := r.who.checkAny("/", "Sys.Audit", "Sys.Modify"); aerr != nil {
		return nil, aerr
	}
	blacklist := "05;06;0b"
	if r.params.Has("pci-class-blacklist") {
		blacklist = r.param("pci-class-blacklist")
	}
	classes := strings.FieldsFunc(blacklist, func(c rune) bool { return c == ';' || c == ',' || c == ' ' })
	verbose := r.param("verbose") != "0"
	s.mu.Lock()
	devs := append([]PCIDevice(nil), s.node.PCIDevices...)
	s.mu.Unlock()
	sort.Slice(devs, func(i, j int) bool { return devs[i].ID < devs[j].ID })
	out := []any{}
next:
	for _, d := range devs {
		for _, c := range classes {
			if strings.HasPrefix(d.Class, "0x"+c) {
				continue next
			}
		}
		e := map[string]any{"id": d.ID, "class": d.Class, "vendor": d.Vendor, "device": d.Device, "iommugroup": d.IOMMUGroup}
		if d.MDev {
			e["mdev"] = 1
		}
		if verbose {
			for k, v := range map[string]string{"subsystem_vendor": d.SubsystemVendor, "subsystem_device": d.SubsystemDevice, "vendor_name": d.VendorName, "device_name": d.DeviceName} {
				if v != "" {
					e[k] = v
				}
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// mapEntry is one parsed map entry of a mapping.
type mapEntry struct {
	node, path, id, subsystem string
	iommu                     int
	hasIOMMU                  bool
}

func nodeEntries(m PCIMapping, node string) []mapEntry {
	var out []mapEntry
	for _, raw := range m.Map {
		e := mapEntry{}
		for _, part := range strings.Split(raw, ",") {
			k, v, _ := strings.Cut(part, "=")
			switch k {
			case "node":
				e.node = v
			case "path":
				e.path = v
			case "id":
				e.id = strings.ToLower(v)
			case "subsystem-id":
				e.subsystem = strings.ToLower(v)
			case "iommugroup":
				e.iommu, _ = strconv.Atoi(v)
				e.hasIOMMU = true
			}
		}
		if e.node == node {
			out = append(out, e)
		}
	}
	return out
}

// device finds one of the node's devices by its address.
func (s *Server) device(addr string) (PCIDevice, bool) {
	for _, d := range s.node.PCIDevices {
		if d.ID == addr {
			return d, true
		}
	}
	return PCIDevice{}, false
}

// assertValid is PVE::Mapping::PCI::assert_valid (pve-guest-common
// 6.0.2): each path's device present with the entry's id, subsystem-id
// and (first path only) IOMMU group, mdev-capable exactly when the
// mapping says so. "" when it holds, else its message.
func (s *Server) assertValid(m PCIMapping, e mapEntry) string {
	for i, p := range strings.Split(e.path, ";") {
		if !strings.Contains(p, ".") {
			p += ".0"
		}
		d, ok := s.device(p)
		if !ok {
			return fmt.Sprintf("pci device '%s' not found", p)
		}
		expected := map[string]string{"id": hex4(d.Vendor) + ":" + hex4(d.Device), "mdev": boolDigit(d.MDev)}
		configured := map[string]string{"id": e.id, "mdev": boolDigit(m.MDev)}
		if d.SubsystemVendor != "" && d.SubsystemDevice != "" {
			expected["subsystem-id"] = hex4(d.SubsystemVendor) + ":" + hex4(d.SubsystemDevice)
		}
		if e.subsystem != "" {
			configured["subsystem-id"] = e.subsystem
		}
		if i == 0 {
			if d.IOMMUGroup >= 0 {
				expected["iommugroup"] = strconv.Itoa(d.IOMMUGroup)
			}
			if e.hasIOMMU {
				configured["iommugroup"] = strconv.Itoa(e.iommu)
			}
		}
		for _, prop := range []string{"id", "iommugroup", "mdev", "subsystem-id"} {
			ex, exOK := expected[prop]
			co, coOK := configured[prop]
			switch {
			case !exOK && !coOK:
			case exOK && !coOK:
				return fmt.Sprintf("missing expected property '%s' for device '%s'", prop, p)
			case !exOK && coOK:
				return fmt.Sprintf("unexpected property '%s' configured for device '%s'", prop, p)
			case ex != co:
				return fmt.Sprintf("'%s' does not match for '%s' (%s != %s)", prop, m.ID, ex, co)
			}
		}
	}
	return ""
}

func boolDigit(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// isQ35Conf is machine_type_is_q35 (qemu-server 9.2.6 Machine.pm): the
// machine's type (a property string from PVE 8) is q35 or pc-q35-….
func isQ35Conf(conf map[string]string) bool {
	m := conf["machine"]
	typ, _, _ := strings.Cut(m, ",")
	typ = strings.TrimPrefix(typ, "type=")
	return typ == "q35" || strings.HasPrefix(typ, "pc-q35-")
}

// pciStartLocked resolves and reserves v's host PCI devices at start, as
// vm_start does before QEMU runs; s.mu is held. The chosen addresses are
// kept on v: a device is in use while its VM is not stopped.
func (s *Server) pciStartLocked(v *vm) error {
	var chosen []string
	used := map[string]bool{}
	q35 := isQ35Conf(v.conf)
	for i := 0; i < 16; i++ {
		k := "hostpci" + strconv.Itoa(i)
		val, ok := v.conf[k]
		if !ok {
			continue
		}
		o, _ := parseHostPCIValue(k, val, true)
		var alternatives [][]string
		switch {
		case o.mapping != "":
			var m *PCIMapping
			for j := range s.opts.PCIMappings {
				if s.opts.PCIMappings[j].ID == o.mapping {
					m = &s.opts.PCIMappings[j]
				}
			}
			var entries []mapEntry
			if m != nil {
				entries = nodeEntries(*m, s.node.Name)
			}
			if len(entries) == 0 {
				return fmt.Errorf("PCI device mapping not found for '%s'", o.mapping)
			}
			for _, e := range entries {
				if why := s.assertValid(*m, e); why != "" {
					return fmt.Errorf("PCI device mapping invalid (hardware probably changed): %s", why)
				}
				alternatives = append(alternatives, strings.Split(e.path, ";"))
			}
		case o.host != "":
			alternatives = [][]string{strings.Split(o.host, ";")}
		default:
			return fmt.Errorf("Either 'host' or 'mapping' must be set.")
		}
		// lspci by each path: a path without a function is every function.
		var ids [][]string
		for _, alt := range alternatives {
			var one []string
			for _, p := range alt {
				if !strings.HasPrefix(p, "0000:") && strings.Count(p, ":") == 1 {
					p = "0000:" + p
				}
				n := len(one)
				for _, d := range s.node.PCIDevices {
					if d.ID == p || (!strings.Contains(p, ".") && strings.HasPrefix(d.ID, p+".")) {
						one = append(one, d.ID)
					}
				}
				if len(one) == n {
					return fmt.Errorf("no PCI device found for '%s'", p)
				}
			}
			ids = append(ids, one)
		}
		if o.pcie && !q35 {
			return fmt.Errorf("q35 machine model is not enabled")
		}
		if o.mdev != "" {
			// vm_start reserves no mediated device.
			continue
		}
		if len(ids) == 1 {
			for _, id := range ids[0] {
				if used[id] {
					return fmt.Errorf("device '%s' assigned more than once", id)
				}
				used[id] = true
				if err := s.pciHeldLocked(v, id); err != nil {
					return err
				}
			}
			chosen = append(chosen, ids[0]...)
			continue
		}
		found := false
	alt:
		for _, one := range ids {
			for _, id := range one {
				if used[id] || s.pciHeldLocked(v, id) != nil {
					continue alt
				}
			}
			for _, id := range one {
				used[id] = true
			}
			chosen = append(chosen, one...)
			found = true
			break
		}
		if !found {
			return fmt.Errorf("could not find a free device for '%s'", k)
		}
	}
	v.pci = chosen
	return nil
}

// pciHeldLocked is reserve_pci_usage's refusal: another VM of this node
// holds the device while it starts or runs (a stopped VM's reservation is
// a leftover, taken over).
func (s *Server) pciHeldLocked(self *vm, id string) error {
	for _, o := range s.vms {
		if o == self || o.state == "stopped" {
			continue
		}
		for _, held := range o.pci {
			if held != id {
				continue
			}
			if o.state == "starting" {
				return fmt.Errorf("PCI device '%s' is currently reserved for use by VMID '%d'", id, o.id)
			}
			return fmt.Errorf("PCI device '%s' already in use by VMID '%d'", id, o.id)
		}
	}
	return nil
}
