package proxmox

import (
	"cmp"
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// ExtraDisk is one disk of a VM besides its install disk (proxmox.vm.disks).
type ExtraDisk struct {
	// Name is the disk's name in the config (a user volume's name).
	Name    string
	Storage string
	SizeGiB int
	// Bus is "scsi" (default), "virtio" or "sata".
	Bus string
	// Serial is the drive's serial= (config.DiskSerial): what the guest
	// reports for the disk, and what a user volume selects it by.
	Serial string
}

// ExtraNIC is one network interface of a VM besides net0.
type ExtraNIC struct {
	Bridge string
	// VLAN tags the NIC when non-zero.
	VLAN int
	// MTU is net's mtu= (0: unset, 1: the bridge's).
	MTU      int
	Firewall bool
	// IP is the NIC's cloud-init address: a prefix (10.0.30.21/24),
	// "dhcp", or "" for no ipconfig at all.
	IP string
	// MAC is the NIC's address, stable for cluster, node and index
	// (ExtraNICMAC).
	MAC string
}

// ExtraNICMAC is the MAC of node's extra NIC netN (N from 1): derived like
// net0's (DeriveMAC), so a recreated VM keeps each NIC's address.
func ExtraNICMAC(cluster, node string, n int) string {
	return DeriveMAC(cluster, fmt.Sprintf("%s\x00net%d", node, n))
}

// maxSlots is how many drives of each bus qemu-server knows
// ($MAX_SCSI_DISKS 31, $MAX_VIRTIO_DISKS 16, $MAX_SATA_DISKS 6,
// src/PVE/QemuServer/Drive.pm at 9.2.6 and stable-bookworm).
var maxSlots = map[string]int{"scsi": 31, "virtio": 16, "sata": 6}

// maxNets is qemu-server's $MAX_NETS (src/PVE/QemuServer.pm at 9.2.6).
const maxNets = 32

// serialRE is a drive serial this tool sends: qemu-server takes up to 20
// bytes, url-encoded (Drive.pm serial, format urlencoded: pve-common
// 9.2.1 src/PVE/JSONSchema.pm pve_verify_urlencoded); ours need no
// encoding.
var serialRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,20}$`)

// DiskBus is the disk's bus, scsi unless set.
func (d ExtraDisk) DiskBus() string { return cmp.Or(d.Bus, "scsi") }

// ExtraDiskSlots are the config keys of the spec's extra disks, in order:
// each bus numbered from 0 in the order the disks are listed, skipping
// the install disk's slot (scsi0).
func (s VMSpec) ExtraDiskSlots() []string {
	next := map[string]int{}
	out := make([]string, len(s.Disks))
	for i, d := range s.Disks {
		bus := d.DiskBus()
		slot := bus + strconv.Itoa(next[bus])
		if slot == s.DiskSlot() {
			next[bus]++
			slot = bus + strconv.Itoa(next[bus])
		}
		next[bus]++
		out[i] = slot
	}
	return out
}

// validateExtras checks the extra disks and NICs before anything is sent.
func (s VMSpec) validateExtras() []error {
	var errs []error
	names := map[string]bool{}
	for i, slot := range s.ExtraDiskSlots() {
		d := s.Disks[i]
		bus := d.DiskBus()
		n, _ := strconv.Atoi(strings.TrimPrefix(slot, bus))
		switch {
		case names[d.Name]:
			errs = append(errs, fmt.Errorf("VM %s: two extra disks are called %q", s.Name, d.Name))
		case maxSlots[bus] == 0:
			errs = append(errs, fmt.Errorf("VM %s: disk %s: bus %q must be scsi, virtio or sata", s.Name, d.Name, d.Bus))
		case n >= maxSlots[bus]:
			errs = append(errs, fmt.Errorf("VM %s: disk %s would be %s: Proxmox has %s0-%d only", s.Name, d.Name, slot, bus, maxSlots[bus]-1))
		case d.SizeGiB < 1 || d.Storage == "":
			errs = append(errs, fmt.Errorf("VM %s: disk %s needs a storage and a size >= 1 GiB", s.Name, d.Name))
		case !serialRE.MatchString(d.Serial):
			errs = append(errs, fmt.Errorf("VM %s: disk %s: serial %q is not 1-20 characters of letters, digits, '_', '.' and '-'", s.Name, d.Name, d.Serial))
		}
		names[d.Name] = true
	}
	if len(s.NICs) >= maxNets {
		errs = append(errs, fmt.Errorf("VM %s: %d extra NICs, Proxmox has net0-net%d only", s.Name, len(s.NICs), maxNets-1))
	}
	for i, n := range s.NICs {
		key := fmt.Sprintf("net%d", i+1)
		if n.Bridge == "" {
			errs = append(errs, fmt.Errorf("VM %s: %s needs a bridge", s.Name, key))
		}
		if n.VLAN < 0 || n.VLAN > 4094 {
			errs = append(errs, fmt.Errorf("VM %s: %s: VLAN %d is outside 1..4094", s.Name, key, n.VLAN))
		}
		if n.MTU < 0 || n.MTU > 65520 {
			errs = append(errs, fmt.Errorf("VM %s: %s: MTU %d is outside 1..65520", s.Name, key, n.MTU))
		}
		if _, err := normalizeMAC(n.MAC); err != nil {
			errs = append(errs, fmt.Errorf("VM %s: %s: %w", s.Name, key, err))
		}
		if n.IP != "" && n.IP != "dhcp" {
			if p, err := netip.ParsePrefix(n.IP); err != nil || !p.Addr().Is4() {
				errs = append(errs, fmt.Errorf("VM %s: %s: %q is not an IPv4 address with prefix", s.Name, key, n.IP))
			}
		}
	}
	return errs
}

// extraDrive is the drive string of extra disk d as the create sends it: a
// new volume of SizeGiB on its storage, with the install disk's cache and
// discard (Talos trims its filesystems) and the disk's serial; an IO
// thread only on virtio-scsi-single, as for the install disk.
func (s VMSpec) extraDrive(d ExtraDisk) string {
	v := fmt.Sprintf("%s:%d,discard=on,cache=%s,serial=%s", d.Storage, d.SizeGiB, s.Hardware.CacheMode(), d.Serial)
	if d.DiskBus() == "scsi" && s.Hardware.Controller() == "virtio-scsi-single" {
		v += ",iothread=1"
	}
	return v
}

// netN is extra NIC n's net string: a VirtIO NIC with its stable MAC.
func (n ExtraNIC) net() string {
	mac, _ := normalizeMAC(n.MAC)
	v := "virtio=" + mac + ",bridge=" + n.Bridge
	if n.VLAN != 0 {
		v += fmt.Sprintf(",tag=%d", n.VLAN)
	}
	if n.MTU != 0 {
		v += fmt.Sprintf(",mtu=%d", n.MTU)
	}
	if n.Firewall {
		v += ",firewall=1"
	}
	return v
}

// ipconfig is the NIC's cloud-init ipconfig ("" for none). No gateway:
// the default route stays on net0. qemu-server writes one
// network-config entry per netN that has an ipconfigN, matched by MAC
// (src/PVE/QemuServer/Cloudinit.pm nocloud_network at 9.2.6), and Talos'
// nocloud platform puts the address on the link with that MAC
// (platform/nocloud/metadata.go applyNetworkConfigV1 at v1.13.3).
func (n ExtraNIC) ipconfig() string {
	if n.IP == "" {
		return ""
	}
	return "ip=" + n.IP
}

// addExtras puts the extra disks and NICs into a create's parameters.
func (s VMSpec) addExtras(p map[string]any) {
	for i, slot := range s.ExtraDiskSlots() {
		p[slot] = s.extraDrive(s.Disks[i])
	}
	for i, n := range s.NICs {
		p[fmt.Sprintf("net%d", i+1)] = n.net()
		if ipc := n.ipconfig(); ipc != "" {
			p[fmt.Sprintf("ipconfig%d", i+1)] = ipc
		}
	}
}

// extrasChanges describes a create's extra disks and NICs, one line each.
func (s VMSpec) extrasChanges() []string {
	var out []string
	for i, slot := range s.ExtraDiskSlots() {
		d := s.Disks[i]
		out = append(out, fmt.Sprintf("  with disk %s: %d GiB %s on %s (serial %s)", d.Name, d.SizeGiB, slot, d.Storage, d.Serial))
	}
	for i, n := range s.NICs {
		addr := cmp.Or(n.IP, "no address")
		out = append(out, fmt.Sprintf("  with NIC net%d: %s on %s%s, MAC %s", i+1, addr, n.Bridge, vlanSuffix(n.VLAN), n.MAC))
	}
	return out
}

// reportExtras reports the extra disks and NICs an existing VM lacks or
// has otherwise, each with the command that adds or changes it: a VM that
// exists keeps its hardware (adding a disk would be safe, but the run
// never changes hardware by itself, and never removes or shrinks what a
// user put there). A disk is found by its serial, whatever slot it is in.
func reportExtras(s VMSpec, cfg *VMConfig, report func(field, want, have, why string)) {
	e := cfg.Effective
	bySerial := map[string]string{}
	used := map[string]bool{}
	for k, v := range e {
		if !driveKeyRE.MatchString(k) {
			continue
		}
		used[k] = true
		if d := parseDriveString(v); d.opts["serial"] != "" {
			bySerial[d.opts["serial"]] = k
		}
	}
	free := func(bus string) string {
		for i := range maxSlots[bus] {
			if k := bus + strconv.Itoa(i); !used[k] {
				used[k] = true
				return k
			}
		}
		return bus + "?"
	}
	for _, d := range s.Disks {
		want := fmt.Sprintf("%d GiB on %s, serial %s", d.SizeGiB, d.Storage, d.Serial)
		slot, ok := bySerial[d.Serial]
		if !ok {
			report("disk "+d.Name, want, "none",
				fmt.Sprintf("a VM that exists gets no hardware from a run: add it with `qm set %d --%s %s` (hotplugged while it runs; Talos finds it by its serial) or replace the node (bootstrap node replace %s)",
					s.VMID, free(d.DiskBus()), s.extraDrive(d), s.Name))
			continue
		}
		dv := parseDriveString(e[slot])
		size, _ := parseSize(dv.opts["size"])
		if have := int64(d.SizeGiB) << 30; size < have {
			report("disk "+d.Name+" size", sizeString(have), sizeString(size),
				fmt.Sprintf("grow it with `qm disk resize %d %s %s` (never shrunk or grown by a run)", s.VMID, slot, sizeString(have)))
		}
	}
	for i, n := range s.NICs {
		key := fmt.Sprintf("net%d", i+1)
		ipKey := fmt.Sprintf("ipconfig%d", i+1)
		set := fmt.Sprintf("--%s %s", key, n.net())
		if ipc := n.ipconfig(); ipc != "" {
			set += fmt.Sprintf(" --%s %s", ipKey, ipc)
		}
		how := fmt.Sprintf("a VM that exists keeps its NICs: `qm set %d %s` (a new cloud-init address reaches Talos at the next boot) or replace the node (bootstrap node replace %s)", s.VMID, set, s.Name)
		have := e[key]
		if have == "" {
			report("NIC "+key, n.net(), "none", how)
			continue
		}
		if got := normalizeNet(have); got != normalizeNet(n.net()) {
			report("NIC "+key, normalizeNet(n.net()), got, how)
		}
		report("NIC "+key+" address", n.ipconfig(), e[ipKey], how)
	}
}

// normalizeNet is a net string with its model and MAC first, MAC upper
// case, and the options this tool sets in one order, so a stored one
// compares with a wanted one (Proxmox rewrites the order it was sent in).
func normalizeNet(v string) string {
	var model, mac string
	opts := map[string]string{}
	for i, part := range strings.Split(v, ",") {
		k, val, _ := strings.Cut(part, "=")
		switch {
		case i == 0 && k != "model":
			model, mac = k, val
		case k == "model":
			model = val
		case k == "macaddr":
			mac = val
		default:
			opts[k] = val
		}
	}
	out := []string{model + "=" + strings.ToUpper(mac)}
	keys := make([]string, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, k+"="+opts[k])
	}
	return strings.Join(out, ",")
}

// driveKeyRE matches the config keys of disks on a bus.
var driveKeyRE = regexp.MustCompile(`^(scsi|virtio|sata|ide)\d+$`)

// nicBridges are the (bridge, VLAN) pairs of the spec's NICs, net0 first.
func (s VMSpec) nicBridges() []bridgeUse {
	out := []bridgeUse{{Bridge: s.Bridge, VLAN: s.VLAN}}
	for i, n := range s.NICs {
		out = append(out, bridgeUse{Bridge: n.Bridge, VLAN: n.VLAN, MTU: n.MTU, NIC: fmt.Sprintf("%s's net%d", s.Name, i+1)})
	}
	return out
}

// bridgeUse is one NIC's bridge and VLAN, and the MTU it asks (0 or 1:
// the bridge's).
type bridgeUse struct {
	Bridge string
	VLAN   int
	MTU    int
	NIC    string
}

// mtuProblem judges a NIC's MTU against its bridge's: qemu-server starts
// a VirtIO NIC only with an MTU up to the bridge's (print_netdevice_full,
// qemu-server 9.2.6 src/PVE/QemuServer.pm), which it reads from sysfs. The
// listing gives the mtu of /etc/network/interfaces; without one there
// the bridge's MTU is not known here (Linux gives a bridge the smallest of
// its ports' MTUs, 1500 by default: unverified for a given host).
func mtuProblem(u bridgeUse, b Bridge) (fail, warn string) {
	switch {
	case u.MTU <= 1:
		return "", ""
	case b.MTU > 0 && u.MTU > b.MTU:
		return fmt.Sprintf("%s asks MTU %d, bridge %s has %d: Proxmox would refuse to start the VM (\"MTU '%d' is bigger than the bridge MTU\"); raise the bridge's mtu in /etc/network/interfaces or lower nics[].mtu", u.NIC, u.MTU, u.Bridge, b.MTU, u.MTU), ""
	case b.MTU == 0 && u.MTU > 1500:
		return "", fmt.Sprintf("%s asks MTU %d and bridge %s sets no mtu in /etc/network/interfaces: a bridge whose MTU is below %d makes Proxmox refuse to start the VM", u.NIC, u.MTU, u.Bridge, u.MTU)
	}
	return "", ""
}
