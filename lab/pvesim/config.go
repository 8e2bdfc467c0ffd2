package pvesim

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// drive is a parsed drive property string ("local-lvm:32,iothread=1").
type drive struct {
	file string
	opts [][2]string
}

func parseDrive(v string) (drive, error) {
	var d drive
	for i, part := range strings.Split(v, ",") {
		k, val, hasEq := strings.Cut(part, "=")
		switch {
		case i == 0 && !hasEq:
			d.file = part
		case k == "file" || k == "volume":
			d.file = val
		case !hasEq:
			return d, fmt.Errorf("invalid format - missing key in comma-separated list property")
		default:
			d.opts = append(d.opts, [2]string{k, val})
		}
	}
	if d.file == "" {
		return d, fmt.Errorf("invalid format - missing key in comma-separated list property")
	}
	return d, nil
}

func (d drive) get(k string) string {
	for _, o := range d.opts {
		if o[0] == k {
			return o[1]
		}
	}
	return ""
}

func (d *drive) set(k, v string) {
	for i, o := range d.opts {
		if o[0] == k {
			d.opts[i][1] = v
			return
		}
	}
	d.opts = append(d.opts, [2]string{k, v})
}

func (d *drive) del(k string) {
	out := d.opts[:0]
	for _, o := range d.opts {
		if o[0] != k {
			out = append(out, o)
		}
	}
	d.opts = out
}

// String prints the drive as PVE stores it: the volume, then options sorted.
func (d drive) String() string {
	opts := append([][2]string(nil), d.opts...)
	sort.Slice(opts, func(i, j int) bool { return opts[i][0] < opts[j][0] })
	parts := []string{d.file}
	for _, o := range opts {
		parts = append(parts, o[0]+"="+o[1])
	}
	return strings.Join(parts, ",")
}

func (d drive) isCDROM() bool { return d.get("media") == "cdrom" || d.file == "cdrom" }

func (d drive) isCloudInit() bool {
	_, vol, _ := strings.Cut(d.file, ":")
	return d.file == "cloudinit" || vol == "cloudinit" || strings.HasSuffix(vol, "-cloudinit") || strings.Contains(vol, "-cloudinit.")
}

// newDiskRE is PVE's allocation syntax "STORAGE:SIZE_IN_GiB".
var newDiskRE = regexp.MustCompile(`^(([^/:\s]+):)?(\d+(\.\d+)?)$`)

var (
	driveKeyRE = regexp.MustCompile(`^(ide|sata|scsi|virtio)(\d+)$`)
	netKeyRE   = regexp.MustCompile(`^net(\d+)$`)
	ipcfgKeyRE = regexp.MustCompile(`^ipconfig(\d+)$`)
	unusedRE   = regexp.MustCompile(`^unused(\d+)$`)
	serialRE   = regexp.MustCompile(`^serial[0-3]$`)
	dnsNameRE  = regexp.MustCompile(`^(?:[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9\-]*[a-zA-Z0-9])?)*$`)
	tagRE      = regexp.MustCompile(`^(?i)[a-z0-9_][a-z0-9_\-+.]*$`)
	// macRE is pve-common's mac-addr format (9.2.1 src/PVE/JSONSchema.pm
	// pve_verify_mac_addr): unicast only, the I/G bit of the first octet
	// clear.
	isoVolRE = regexp.MustCompile(`^[^:/]+:iso/`)
	macRE    = regexp.MustCompile(`^(?i)[0-9a-f][02468ace](:[0-9a-f]{2}){5}$`)
)

var driveMax = map[string]int{"ide": 3, "sata": 5, "scsi": 30, "virtio": 15}

func isDriveKey(k string) bool {
	m := driveKeyRE.FindStringSubmatch(k)
	if m == nil {
		return k == "efidisk0" || k == "tpmstate0"
	}
	n, _ := strconv.Atoi(m[2])
	return n <= driveMax[m[1]]
}

func driveBus(k string) string {
	if m := driveKeyRE.FindStringSubmatch(k); m != nil {
		return m[1]
	}
	return ""
}

// Option groups as qemu-server's $check_vm_modify_config_perm sees them
// (9.2.6 and 8.4.10 src/PVE/API2/Qemu.pm; 9.x adds allow-ksm). An option
// in none of them (args, affinity, hookscript, meta, vmgenid, …) is for
// root@pam only. Tags are skipped there and checked by
// assert_tag_permissions, which wants VM.Config.Options (pve-guest-common
// GuestHelpers.pm), so they are listed with the general options here.
var (
	cpuOptions      = set("cores", "cpu", "runningcpu", "cpulimit", "cpuunits", "numa", "smp", "sockets", "vcpus")
	memoryOptions   = set("memory", "balloon", "shares", "allow-ksm")
	hwtypeOptions   = set("acpi", "hotplug", "kvm", "machine", "runningmachine", "scsihw", "smbios1", "tablet", "vga", "watchdog", "audio0", "rng0")
	generalOptions  = set("agent", "autostart", "bios", "description", "keyboard", "localtime", "migrate_downtime", "migrate_speed", "name", "onboot", "ostype", "protection", "reboot", "startdate", "startup", "tdf", "template", "tags")
	powerOptions    = set("freeze")
	diskOptions     = set("boot", "bootdisk", "vmstatestorage")
	cloudinitOption = set("cicustom", "cipassword", "citype", "ciuser", "nameserver", "searchdomain", "sshkeys", "ciupgrade")
	// fastPlug options change a running VM's config directly; the rest of
	// the non-hotpluggable options wait in the pending section.
	fastPlug = set("name", "description", "onboot", "protection", "tags", "startup", "hookscript", "migrate_downtime", "migrate_speed", "vmstatestorage", "meta")
	// numericKeys are returned as JSON numbers.
	numericKeys = set("cores", "sockets", "vcpus", "onboot", "numa", "balloon", "kvm", "tablet", "protection", "template", "acpi", "localtime", "reboot", "freeze", "cpuunits", "shares", "migrate_speed", "autostart")
	boolKeys    = set("onboot", "numa", "kvm", "tablet", "protection", "template", "acpi", "localtime", "reboot", "freeze", "autostart")
	intKeys     = map[string]int{"cores": 1, "sockets": 1, "vcpus": 1, "balloon": 0, "cpuunits": 0, "shares": 0, "migrate_speed": 0}
	enumKeys    = map[string][]string{
		"scsihw": {"lsi", "lsi53c810", "virtio-scsi-pci", "virtio-scsi-single", "megasas", "pvscsi"},
		"ostype": {"other", "wxp", "w2k", "w2k3", "w2k8", "wvista", "win7", "win8", "win10", "win11", "l24", "l26", "solaris"},
		"bios":   {"seabios", "ovmf"},
		"citype": {"configdrive2", "nocloud", "opennebula"},
	}
	stringKeys = set("cpu", "cpulimit", "machine", "vga", "smbios1", "vmgenid", "hotplug", "agent", "boot", "bootdisk", "description", "keyboard", "startup", "hookscript", "meta", "nameserver", "searchdomain", "ciuser", "cipassword", "cicustom", "sshkeys", "watchdog", "audio0", "affinity", "vmstatestorage", "migrate_downtime", "startdate", "tdf", "smp", "ciupgrade")
)

func set(keys ...string) map[string]bool {
	m := map[string]bool{}
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// knownKey reports whether k is a VM config option.
func knownKey(k string) bool {
	switch {
	case isDriveKey(k), netKeyRE.MatchString(k), ipcfgKeyRE.MatchString(k), unusedRE.MatchString(k), serialRE.MatchString(k), isHostPCIKey(k):
		return true
	case k == "name" || k == "memory" || k == "tags" || k == "lock" || k == "rng0":
		return true
	}
	_, isInt := intKeys[k]
	_, isEnum := enumKeys[k]
	return boolKeys[k] || isInt || isEnum || stringKeys[k]
}

// validateConfig checks option values like PVE's JSON schema does and
// returns per-option errors.
func validateConfig(cfg map[string]string, major int) map[string]string {
	errs := map[string]string{}
	for k, v := range cfg {
		if !knownKey(k) || k == "lock" {
			errs[k] = "property is not defined in schema and the schema does not allow additional properties"
			continue
		}
		if msg := validateOption(k, v, major); msg != "" {
			errs[k] = msg
		}
	}
	return errs
}

func validateOption(k, v string, major int) string {
	switch {
	case boolKeys[k]:
		switch strings.ToLower(v) {
		case "0", "1", "yes", "no", "on", "off", "true", "false":
			return ""
		}
		return fmt.Sprintf("type check ('boolean') failed - got '%s'", v)
	case k == "memory":
		val := v
		if major >= 8 {
			val = strings.TrimPrefix(v, "current=")
		}
		n, err := strconv.Atoi(val)
		if err != nil {
			if major >= 8 {
				return "invalid format - format error\nmemory.current: type check ('integer') failed - got '" + val + "'"
			}
			return fmt.Sprintf("type check ('integer') failed - got '%s'", v)
		}
		if n < 16 {
			return "value must have a minimum value of 16"
		}
	case k == "name":
		if !dnsNameRE.MatchString(v) {
			return "invalid format - value does not look like a valid DNS name"
		}
	case k == "tags":
		for _, t := range splitTags(v) {
			if !tagRE.MatchString(t) {
				return "invalid format - invalid characters in tag"
			}
		}
	case k == "rng0":
		// pve-qm-rng (qemu-server 9.2.6 src/PVE/QemuServer/RNG.pm):
		// source (the default key) one of three host devices, max_bytes
		// and period integers.
		for i, part := range strings.Split(v, ",") {
			key, val, hasEq := strings.Cut(part, "=")
			if i == 0 && !hasEq {
				key, val = "source", part
			}
			switch key {
			case "source":
				if val != "/dev/urandom" && val != "/dev/random" && val != "/dev/hwrng" {
					return "invalid format - format error\nrng0.source: value '" + val + "' does not have a value in the enumeration '/dev/urandom, /dev/random, /dev/hwrng'"
				}
			case "max_bytes", "period":
				if _, err := strconv.Atoi(val); err != nil {
					return "invalid format - format error\nrng0." + key + ": type check ('integer') failed - got '" + val + "'"
				}
			default:
				return "invalid format - format error\nrng0." + key + ": property is not defined in schema and the schema does not allow additional properties"
			}
		}
	case isHostPCIKey(k):
		// 'driver' came with qemu-server 9.0.25 (commit aa47045f); the
		// installed version is not known here, so only 9.x takes it.
		_, msg := parseHostPCIValue(k, v, major >= 9)
		return msg
	case netKeyRE.MatchString(k):
		n, err := parseNet(v)
		if err != nil {
			return "invalid format - " + err.Error()
		}
		if msg := netOptionsError(n); msg != "" {
			return "invalid format - format error\n" + msg
		}
	case ipcfgKeyRE.MatchString(k):
		if _, _, err := parseIPConfig(v); err != nil {
			return "invalid format - " + err.Error()
		}
	case isDriveKey(k):
		d, err := parseDrive(v)
		if err != nil {
			return err.Error()
		}
		if msg := serialError(k, d); msg != "" {
			return msg
		}
		if m := d.get("media"); m != "" && m != "disk" && m != "cdrom" {
			return "invalid format - format error\n" + k + ".media: value '" + m + "' does not have a value in the enumeration 'cdrom, disk'"
		}
		// An existing ISO volume must say it is a CD-ROM (qemu-server
		// 9.2.6 src/PVE/API2/Qemu.pm $check_drive_param, on create and
		// update); ISOs live under iso/ on file-based storages
		// (pve-storage Plugin.pm parse_volname).
		if isoVolRE.MatchString(d.file) && d.get("media") != "cdrom" {
			return "explicit 'media=cdrom' is required for iso images"
		}
		// $check_drive_param (qemu-server 9.2.6): an import allocates a new
		// disk of the source's size, written <storage>:0.
		if d.get("import-from") != "" {
			if m := newDiskRE.FindStringSubmatch(d.file); m == nil || m[3] != "0" {
				return "'import-from' requires special syntax - use <storage ID>:0,import-from=<source>"
			}
		}
	}
	if min, ok := intKeys[k]; ok {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Sprintf("type check ('integer') failed - got '%s'", v)
		}
		if n < min {
			return fmt.Sprintf("value must have a minimum value of %d", min)
		}
	}
	if vals, ok := enumKeys[k]; ok {
		for _, e := range vals {
			if v == e {
				return ""
			}
		}
		return fmt.Sprintf("value '%s' does not have a value in the enumeration '%s'", v, strings.Join(vals, ", "))
	}
	return ""
}

func splitTags(v string) []string {
	return strings.FieldsFunc(v, func(r rune) bool { return r == ';' || r == ',' || r == ' ' })
}

// nic is a parsed net property string.
type nic struct {
	model  string
	mac    string
	bridge string
	tag    int
	rest   [][2]string
}

var nicModels = set("virtio", "e1000", "e1000e", "rtl8139", "vmxnet3", "i82551", "i82557b", "i82559er", "ne2k_isa", "ne2k_pci", "pcnet")

func parseNet(v string) (nic, error) {
	var n nic
	for i, part := range strings.Split(v, ",") {
		k, val, hasEq := strings.Cut(part, "=")
		if i == 0 && (nicModels[k] || k == "model") {
			if k == "model" {
				n.model = val
			} else {
				n.model, n.mac = k, val
			}
			continue
		}
		if !hasEq {
			return n, fmt.Errorf("format error")
		}
		switch k {
		case "macaddr":
			n.mac = val
		case "bridge":
			n.bridge = val
		case "tag":
			t, err := strconv.Atoi(val)
			if err != nil || t < 1 || t > 4094 {
				return n, fmt.Errorf("format error\ntag: value must have a maximum value of 4094")
			}
			n.tag = t
		default:
			n.rest = append(n.rest, [2]string{k, val})
		}
	}
	if n.model == "" {
		return n, fmt.Errorf("format error\nmodel: property is missing and it is not optional")
	}
	if n.mac != "" && !macRE.MatchString(n.mac) {
		return n, fmt.Errorf("format error\nmacaddr: value does not look like a valid unicast MAC address")
	}
	return n, nil
}

func (n nic) String() string {
	parts := []string{n.model + "=" + strings.ToUpper(n.mac)}
	if n.bridge != "" {
		parts = append(parts, "bridge="+n.bridge)
	}
	for _, o := range n.rest {
		parts = append(parts, o[0]+"="+o[1])
	}
	if n.tag != 0 {
		parts = append(parts, "tag="+strconv.Itoa(n.tag))
	}
	return strings.Join(parts, ",")
}

// parseIPConfig reads "ip=10.0.20.11/24,gw=10.0.20.1" (or ip=dhcp).
func parseIPConfig(v string) (netip.Prefix, netip.Addr, error) {
	var pfx netip.Prefix
	var gw netip.Addr
	for _, part := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(part, "=")
		if !ok {
			return pfx, gw, fmt.Errorf("format error")
		}
		switch k {
		case "ip":
			if val == "dhcp" {
				continue
			}
			p, err := netip.ParsePrefix(val)
			if err != nil || !p.Addr().Is4() {
				return pfx, gw, fmt.Errorf("format error\nip: value does not look like a valid IPv4 network configuration")
			}
			pfx = p
		case "gw":
			a, err := netip.ParseAddr(val)
			if err != nil || !a.Is4() {
				return pfx, gw, fmt.Errorf("format error\ngw: value does not look like a valid IPv4 address")
			}
			gw = a
		case "ip6", "gw6":
		default:
			return pfx, gw, fmt.Errorf("format error\n%s: property is not defined in schema", k)
		}
	}
	return pfx, gw, nil
}

// digestOf is the SHA-1 over the config as PVE writes it.
func digestOf(conf map[string]string) string {
	keys := make([]string, 0, len(conf))
	for k := range conf {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	h := sha1.New()
	for _, k := range keys {
		fmt.Fprintf(h, "%s: %s\n", k, conf[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// typedValue renders a config value with the JSON type PVE uses.
func typedValue(k, v string, major int) any {
	if numericKeys[k] || (k == "memory" && major < 8) {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
		if f, err := strconv.ParseFloat(v, 64); err == nil {
			return f
		}
	}
	return v
}

// memoryMiB reads the memory option; PVE's default is 512 MiB.
func memoryMiB(conf map[string]string) int64 {
	v := strings.TrimPrefix(conf["memory"], "current=")
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 512
	}
	return n
}

func intOr(v string, def int) int {
	n, err := strconv.Atoi(v)
	if err != nil {
		return def
	}
	return n
}
