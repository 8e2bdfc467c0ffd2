package pveapi

import (
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// format is one named format: a check returning what the real verifier
// dies with ("" when the value passes), or the sub-options of a named
// property string (with an optional check of the parsed whole).
type format struct {
	props map[string]*Schema
	check func(v *validator, value string) string
}

var (
	uncheckedMu sync.Mutex
	unchecked   = map[string]bool{}
)

func noteUnchecked(name string) {
	uncheckedMu.Lock()
	unchecked[name] = true
	uncheckedMu.Unlock()
}

// Unchecked lists the named formats values met in this process that no
// rule here implements: they passed unchecked.
func Unchecked() []string {
	uncheckedMu.Lock()
	defer uncheckedMu.Unlock()
	return slices.Sorted(maps.Keys(unchecked))
}

// Implemented says whether a named format (or its -list/-opt form) has a
// rule here.
func (a *API) Implemented(name string) bool {
	if name == "regex" {
		return true
	}
	base := strings.TrimSuffix(strings.TrimSuffix(name, "-list"), "-opt")
	return (&validator{api: a}).format(base) != nil
}

func dieIf(bad bool, msg string) string {
	if bad {
		return msg + "\n"
	}
	return ""
}

func re(p string) *regexp.Regexp { return regexp.MustCompile(p) }

var (
	vmidRE    = re(`^[1-9][0-9]{2,8}$`)
	nodeRE    = re(`^([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)$`)
	idRE      = re(`(?i)^[a-z][a-z0-9\-_.]*[a-z0-9]$`)
	bridgeRE  = re(`^[-_.\w\d]+$`)
	macRE     = re(`(?i)^[a-f0-9][02468ace](?::[a-f0-9]{2}){5}$`)
	dnsRE     = re(`^(([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)\.)*([a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?)$`)
	configRE  = re(`(?i)^[a-z][a-z0-9_-]+$`)
	tagRE     = re(`(?i)^[a-z0-9_][a-z0-9_\-+.]*$`)
	urlencRE  = re(`^[-%a-zA-Z0-9_.!~*'()]*$`)
	sizeRE    = re(`^(\d+(\.\d+)?)([KMGT])?$`)
	sizeIBRE  = re(`^(\d+(\.\d+)?)([KMGT](?:iB)?)?$`)
	volidRE   = re(`(?i)^([a-z][a-z0-9\-_.]*[a-z0-9]):(.+)$`)
	haSIDRE   = re(`^([a-z]+:\S+|\d+)$`)
	haRIDRE   = re(`^[a-z]+:\S+$`)
	physRE    = re(`^(host|\d{1,2})$`)
	cidrRE    = re(`^(.+)/(\d+)$`)
	ifaceRE   = re(`(?i)^[a-z][a-z0-9_]{1,20}([:.]\d+)?$`)
	vlanRE    = re(`^(\d+)(?:-(\d+))?$`)
	vnetRE    = re(`(?i)^[a-z][a-z0-9]*[a-z0-9]$`)
	driveRE   = re(`^(ide|scsi|virtio|sata)(\d+)$`)
	bootdevRE = re(`^(net|usb|hostpci)(\d+)$`)
)

// ipv4 and ipv6 stand for PVE::Tools' $IPV4RE and $IPV6RE: dotted quads
// without leading zeros, and the RFC 4291 text forms (an IPv4 tail
// included), no zone.
func ipv4(s string) bool {
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is4()
}

func ipv6(s string) bool {
	if strings.Contains(s, "%") {
		return false
	}
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is6()
}

// cidr is pve_verify_cidrv4/v6: the address, then a prefix above 7 and up
// to the address's length.
func cidr(s string, v6 bool) bool {
	m := cidrRE.FindStringSubmatch(s)
	if m == nil {
		return false
	}
	n, err := strconv.Atoi(m[2])
	if err != nil || n <= 7 {
		return false
	}
	if v6 {
		return ipv6(m[1]) && n <= 128
	}
	return ipv4(m[1]) && n <= 32
}

// parseID is parse_id (pve-common src/PVE/JSONSchema.pm): at least two
// characters (the length message only since 9.1.7, commit d43c573), a
// letter first, letters, digits, -, _ and . inside, no - _ . last.
func (v *validator) parseID(id, typ string) string {
	if v.api.Common.ShortID && len(id) < 2 {
		return fmt.Sprintf("%s ID '%s' cannot be shorter than 2 characters\n", typ, id)
	}
	return dieIf(!idRE.MatchString(id), fmt.Sprintf("%s ID '%s' contains illegal characters", typ, id))
}

// format returns the rule of a named format. Each is pve-common
// src/PVE/JSONSchema.pm at the release's commit (see commonFor) unless
// another repository is named; the texts are what they die with.
func (v *validator) format(name string) *format {
	c := func(f func(string) string) *format {
		return &format{check: func(_ *validator, s string) string { return f(s) }}
	}
	switch name {
	case "string":
		return c(func(string) string { return "" })
	case "urlencoded":
		return c(func(s string) string { return dieIf(!urlencRE.MatchString(s), "invalid urlencoded string: "+s) })
	case "pve-configid":
		return c(func(s string) string { return dieIf(!configRE.MatchString(s), "invalid configuration ID '"+s+"'") })
	case "pve-storage-id":
		return c(func(s string) string { return v.parseID(s, "storage") })
	case "pve-bridge-id":
		return c(func(s string) string { return dieIf(!bridgeRE.MatchString(s), "invalid bridge ID '"+s+"'") })
	case "pve-vmid":
		return c(func(s string) string { return dieIf(!vmidRE.MatchString(s), "value does not look like a valid VM ID") })
	case "pve-node":
		return c(func(s string) string {
			return dieIf(!nodeRE.MatchString(s), "value does not look like a valid node name")
		})
	case "mac-addr":
		return c(func(s string) string {
			return dieIf(!macRE.MatchString(s), "value does not look like a valid unicast MAC address")
		})
	case "ipv4":
		return c(func(s string) string { return dieIf(!ipv4(s), "value does not look like a valid IPv4 address") })
	case "ipv6":
		return c(func(s string) string { return dieIf(!ipv6(s), "value does not look like a valid IPv6 address") })
	case "ip":
		return c(func(s string) string {
			return dieIf(!ipv4(s) && !ipv6(s), "value does not look like a valid IP address")
		})
	case "CIDRv4":
		return c(func(s string) string {
			return dieIf(!cidr(s, false), "value does not look like a valid IPv4 CIDR network")
		})
	case "CIDRv6":
		return c(func(s string) string {
			return dieIf(!cidr(s, true), "value does not look like a valid IPv6 CIDR network")
		})
	case "CIDR":
		return c(func(s string) string {
			return dieIf(!cidr(s, false) && !cidr(s, true), "value does not look like a valid CIDR network")
		})
	case "pve-ipv4-config":
		return c(func(s string) string {
			return dieIf(s != "dhcp" && s != "manual" && !cidr(s, false), "value does not look like a valid ipv4 network configuration")
		})
	case "pve-ipv6-config":
		return c(func(s string) string {
			return dieIf(s != "auto" && s != "dhcp" && s != "manual" && !cidr(s, true), "value does not look like a valid ipv6 network configuration")
		})
	case "dns-name":
		return c(func(s string) string {
			return dieIf(!dnsRE.MatchString(s), "value does not look like a valid DNS name")
		})
	case "address":
		return c(func(s string) string {
			return dieIf(!ipv4(s) && !ipv6(s) && !dnsRE.MatchString(s), "value does not look like a valid address: "+s)
		})
	case "disk-size":
		return c(func(s string) string {
			ok := sizeRE.MatchString(s) || v.api.Common.SizeIB && sizeIBRE.MatchString(s)
			return dieIf(!ok, "value does not look like a valid disk size: "+s)
		})
	case "pve-tag":
		return c(func(s string) string { return dieIf(!tagRE.MatchString(s), "invalid characters in tag") })
	case "pve-iface":
		return c(func(s string) string { return dieIf(!ifaceRE.MatchString(s), "invalid network interface name '"+s+"'") })
	case "pve-vlan-id-or-range":
		return c(vlanIDOrRange)

	// pve-network 1.2.5 (5893df0) src/PVE/Network/SDN/VnetPlugin.pm
	// parse_sdn_vnet_id; the format is gone after commit ecf98c5 (a
	// pattern instead), but every published schema still names it.
	case "pve-sdn-vnet-id":
		return c(func(s string) string {
			if !vnetRE.MatchString(s) {
				return "vnet ID '" + s + "' contains illegal characters\n"
			}
			return dieIf(len(s) > 8, "vnet ID '"+s+"' can't be more length than 8 characters")
		})

	// pve-storage src/PVE/Storage/Plugin.pm (8.2.3 13a8187, 9.1.7 0c56bad):
	// parse_volume_id; verify_content against the dir plugin's types,
	// 'import' always.
	case "pve-volume-id":
		return c(func(s string) string { return dieIf(!volidRE.MatchString(s), "unable to parse volume ID '"+s+"'") })
	case "pve-storage-content":
		return c(func(s string) string {
			switch s {
			case "images", "rootdir", "vztmpl", "iso", "backup", "snippets", "none", "import":
				return ""
			}
			return "invalid content type '" + s + "'\n"
		})

	// qemu-server src/PVE/QemuServer.pm (8.2.4 00d68b8d and 9.1.9
	// 6bdc5547 alike): verify_volume_id_or_qm_path (none, cdrom, an
	// absolute path or a volume ID), verify_volume_id_or_absolute_path,
	// verify_bootdev.
	case "pve-volume-id-or-qm-path":
		return c(func(s string) string {
			if s == "none" || s == "cdrom" || strings.HasPrefix(s, "/") {
				return ""
			}
			return dieIf(!volidRE.MatchString(s), "unable to parse volume ID '"+s+"'")
		})
	case "pve-volume-id-or-absolute-path":
		return c(func(s string) string {
			if strings.HasPrefix(s, "/") {
				return ""
			}
			return dieIf(!volidRE.MatchString(s), "unable to parse volume ID '"+s+"'")
		})
	case "pve-qm-bootdev":
		return c(func(s string) string { return dieIf(!validBootDev(s), "invalid boot device '"+s+"'") })
	case "pve-qm-boot":
		return &format{props: qmBoot}
	case "pve-qm-ipconfig":
		return &format{props: qmIPConfig}
	case "pve-qm-hostpci":
		return &format{props: qmHostPCI(v.api.Common.QemuServer)}
	case "pve-vm-cpu-conf":
		props := cpuConf
		if !v.api.Common.GuestPhysBits {
			props = cpuConfNoGuestPhys
		}
		return &format{props: props, check: checkVMCPU}
	case "pve-phys-bits":
		return c(func(s string) string {
			bad := !physRE.MatchString(s)
			if n, err := strconv.Atoi(s); err == nil && (n < 8 || n > 64) {
				bad = true
			}
			return dieIf(bad, "value must be an integer between 8 and 64 or 'host'")
		})

	// pve-ha-manager src/PVE/HA/Tools.pm pve_verify_ha_resource_or_vm_id
	// (HEAD, 5.2.0 b53aa83).
	case "pve-ha-resource-or-vm-id":
		return c(func(s string) string {
			return dieIf(!haSIDRE.MatchString(s), "value does not look like a valid ha resource id")
		})
	// pve_verify_ha_resource_id, the same file: its -list form is the
	// resources of an HA rule (pve-ha-resource-id-list).
	case "pve-ha-resource-id":
		return c(func(s string) string {
			return dieIf(!haRIDRE.MatchString(s), "value does not look like a valid ha resource id")
		})
	}
	return nil
}

// vlanIDOrRange is pve_verify_vlan_id_or_range: a tag from 2 to 4094, or
// a range of two such tags, lower first.
func vlanIDOrRange(s string) string {
	m := vlanRE.FindStringSubmatch(s)
	if m == nil {
		return "invalid VLAN configuration '" + s + "'\n"
	}
	for _, t := range m[1:] {
		if t == "" {
			continue
		}
		if n, _ := strconv.Atoi(t); n < 2 || n > 4094 {
			return "invalid VLAN tag '" + t + "'\n"
		}
	}
	if m[2] != "" {
		a, _ := strconv.Atoi(m[1])
		b, _ := strconv.Atoi(m[2])
		if a >= b {
			return "VLAN range must go from lower to higher tag '" + s + "'\n"
		}
	}
	return ""
}

// validBootDev is verify_bootdev: a drive (is_valid_drivename: ide0-3,
// scsi0-30, virtio0-15, sata0-5; not efidisk or tpmstate), or a net, usb
// or hostpci the config schema knows.
func validBootDev(s string) bool {
	if m := driveRE.FindStringSubmatch(s); m != nil {
		n, _ := strconv.Atoi(m[2])
		return n < indexed[m[1]] && (len(m[2]) == 1 || m[2][0] != '0')
	}
	if m := bootdevRE.FindStringSubmatch(s); m != nil {
		n, _ := strconv.Atoi(m[2])
		return n < indexed[m[1]] && (len(m[2]) == 1 || m[2][0] != '0')
	}
	return false
}

func str(opt bool) *Schema { return &Schema{Type: "string", Optional: opt} }

func withFormat(s *Schema, f string) *Schema { s.FormatName = f; return s }

// qmBoot is $boot_fmt (qemu-server src/PVE/QemuServer.pm): the legacy
// letters as the default key, or order=dev;dev.
var qmBoot = map[string]*Schema{
	"legacy": {Type: "string", Optional: true, DefaultKey: true, Pattern: "[acdn]{1,4}"},
	"order":  withFormat(str(true), "pve-qm-bootdev-list"),
}

// qmIPConfig is $ipconfig_fmt (qemu-server src/PVE/QemuServer.pm at
// 8.2.4, src/PVE/QemuServer/Network.pm at 9.1.9): gw requires ip, gw6 ip6.
var qmIPConfig = map[string]*Schema{
	"ip":  withFormat(str(true), "pve-ipv4-config"),
	"gw":  {Type: "string", Optional: true, FormatName: "ipv4", Requires: "ip"},
	"ip6": withFormat(str(true), "pve-ipv6-config"),
	"gw6": {Type: "string", Optional: true, FormatName: "ipv6", Requires: "ip6"},
}

// qmHostPCI is $hostpci_fmt (qemu-server src/PVE/QemuServer/PCI.pm,
// 8.2.4 to 9.1.9): host (the default key, addresses of $PCIRE joined by
// ;) or mapping (a pve-configid), and the device's options; driver from
// qemu-server 9.0.25 (commit aa47045f).
func qmHostPCI(qemuServer string) map[string]*Schema {
	const pciRE = `(?:[a-f0-9]{4,}:)?[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?`
	hexID := &Schema{Type: "string", Optional: true, Pattern: `^0x[0-9a-fA-F]{4}$`}
	boolean := func() *Schema { return &Schema{Type: "boolean", Optional: true} }
	m := map[string]*Schema{
		"host":          {Type: "string", Optional: true, DefaultKey: true, Pattern: pciRE + `(;` + pciRE + `)*`},
		"mapping":       withFormat(str(true), "pve-configid"),
		"rombar":        boolean(),
		"romfile":       {Type: "string", Optional: true, Pattern: `[^,;]+`},
		"pcie":          boolean(),
		"x-vga":         boolean(),
		"legacy-igd":    boolean(),
		"mdev":          {Type: "string", Optional: true, Pattern: `[^/\.:]+`},
		"vendor-id":     hexID,
		"device-id":     hexID,
		"sub-vendor-id": hexID,
		"sub-device-id": hexID,
	}
	var major, minor, patch int
	fmt.Sscanf(qemuServer, "%d.%d.%d", &major, &minor, &patch)
	if major > 9 || major == 9 && (minor > 0 || patch >= 25) {
		m["driver"] = &Schema{Type: "string", Optional: true, Enum: []string{"vfio", "keep"}}
	}
	return m
}

func intRange(min, max float64) *Schema {
	return &Schema{Type: "integer", Optional: true, Minimum: &min, Maximum: &max}
}

// cpuConf is $cpu_fmt (qemu-server src/PVE/QemuServer/CPUConfig.pm):
// cputype is the default key; flags are +flag or -flag joined by ;.
var cpuConf = map[string]*Schema{
	"cputype":         {Type: "string", Optional: true, DefaultKey: true},
	"reported-model":  str(true),
	"hidden":          {Type: "boolean", Optional: true},
	"hv-vendor-id":    {Type: "string", Optional: true, Pattern: "[a-zA-Z0-9]{1,12}"},
	"flags":           {Type: "string", Optional: true, Pattern: `([+-])([a-zA-Z0-9\-_\.]+)(;([+-])([a-zA-Z0-9\-_\.]+))*`},
	"phys-bits":       withFormat(str(true), "pve-phys-bits"),
	"guest-phys-bits": intRange(32, 64),
}

var cpuConfNoGuestPhys = func() map[string]*Schema {
	m := map[string]*Schema{}
	for k, s := range cpuConf {
		if k != "guest-phys-bits" {
			m[k] = s
		}
	}
	return m
}()

// checkVMCPU is validate_vm_cpu_conf's part that needs no host: a
// VM-specific config may not set reported-model. Whether the cputype is
// a model QEMU or the custom models know is not checked (unverified here).
func checkVMCPU(v *validator, value string) string {
	props := cpuConf
	if !v.api.Common.GuestPhysBits {
		props = cpuConfNoGuestPhys
	}
	res, msg := v.parsePropertyString(props, value, "")
	if msg != "" {
		return msg
	}
	if _, ok := res["reported-model"]; ok {
		return "Property 'reported-model' not allowed in VM-specific CPU config.\n"
	}
	return ""
}
