package config

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
)

// The values of a VM disk's volume field.
const (
	// VolumeRaw leaves the disk to whatever takes it (the default).
	VolumeRaw = "raw"
	// VolumeUser makes the disk a Talos user volume.
	VolumeUser = "user"
)

// The buses an extra disk may take.
const (
	BusSCSI   = "scsi"
	BusVirtio = "virtio"
	BusSATA   = "sata"
)

// NICDHCP is an extra NIC's ip asking for DHCP.
const NICDHCP = "dhcp"

// ExtraDiskLimit is how many extra disks each bus takes. qemu-server knows
// scsi0-30, virtio0-15 and sata0-5 ($MAX_SCSI_DISKS 31, $MAX_VIRTIO_DISKS
// 16, $MAX_SATA_DISKS 6 in src/PVE/QemuServer/Drive.pm at 9.2.6 and on
// stable-bookworm, PVE 8); the install disk holds scsi0. ide2 (the ISO)
// and ide3 (the cloud-init drive) are on IDE, which extra disks do not use.
var ExtraDiskLimit = map[string]int{BusSCSI: 30, BusVirtio: 16, BusSATA: 6}

// ExtraNICLimit is how many extra NICs a VM takes: qemu-server knows
// net0-net31 ($MAX_NETS 32, src/PVE/QemuServer.pm at 9.2.6); net0 is the
// node network's.
const ExtraNICLimit = 31

// userVolumeNameMax is the longest user volume name Talos takes: its
// partition label u-<name> fits 36 characters (UserVolumeConfig's
// maxUserVolumeNameLength, PartitionLabelLength - len(UserVolumePrefix),
// pkg/machinery/config/types/block/user_volume_config.go at v1.12.0,
// v1.13.3 and v1.14.0-rc.1). Disk names keep to it whatever their volume,
// so a raw disk can become a user volume later.
const userVolumeNameMax = 34

var diskNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// DiskSerial is the serial number Proxmox gives node's extra disk name
// (serial= on its drive), stable for cluster, node and disk: a user volume
// selects the disk by it. 19 characters of [a-z0-9-]: qemu-server takes
// up to 20 bytes, url-encoded (Drive.pm's serial, format urlencoded:
// pve-common src/PVE/JSONSchema.pm pve_verify_urlencoded allows
// [-%a-zA-Z0-9_.!~*'()]), so it needs no encoding.
func DiskSerial(cluster, node, disk string) string {
	sum := sha256.Sum256([]byte("bootstrap-disk\x00" + cluster + "\x00" + node + "\x00" + disk))
	return "bs-" + hex.EncodeToString(sum[:8])
}

// DiskBus is the disk's bus: scsi unless set.
func (d VMDisk) DiskBus() string { return cmp.Or(d.Bus, BusSCSI) }

// VolumeKind is the disk's volume: raw unless set.
func (d VMDisk) VolumeKind() string { return cmp.Or(d.Volume, VolumeRaw) }

// extrasOf gives s the disks and NICs a narrower level (a role's
// roleVM, a node's vm) sets: a non-empty list replaces the wider one's.
func extrasOf(s *VMShape, over VMShape) {
	if len(over.Disks) > 0 {
		s.Disks = over.Disks
	}
	if len(over.NICs) > 0 {
		s.NICs = over.NICs
	}
}

// vmExtras checks the entries of one disks and nics list, each on its own
// (nodeExtras checks each node's effective lists).
func (v *validator) vmExtras(path string, s VMShape, node bool) {
	for i, d := range s.Disks {
		p := fmt.Sprintf("%s.disks[%d]", path, i)
		switch {
		case d.Name == "":
			v.errf(p+".name", "is required: name the disk (lowercase letters, digits and '-')")
		case len(d.Name) > userVolumeNameMax || !diskNameRE.MatchString(d.Name):
			v.errf(p+".name", "%q is not a disk name: use lowercase letters, digits and '-', at most %d characters, starting and ending with a letter or digit (Talos names a user volume u-<name> in a 36-character partition label)", d.Name, userVolumeNameMax)
		}
		if d.SizeGiB < 1 {
			v.errf(p+".sizeGiB", "%d is not a disk size: give the size in GiB, at least 1", d.SizeGiB)
		}
		if _, ok := ExtraDiskLimit[d.DiskBus()]; !ok {
			v.errf(p+".bus", "%q is not offered: use scsi, virtio or sata", d.Bus)
		}
		if k := d.VolumeKind(); k != VolumeRaw && k != VolumeUser {
			v.errf(p+".volume", "%q is not offered: use raw (Talos leaves the disk alone) or user (a Talos user volume at /var/mnt/%s)", d.Volume, d.Name)
		}
	}
	for i, n := range s.NICs {
		p := fmt.Sprintf("%s.nics[%d]", path, i)
		if n.VLAN < 0 || n.VLAN > 4094 {
			v.errf(p+".vlan", "%d is not a VLAN id: use 1-4094, or 0 for untagged", n.VLAN)
		}
		// qemu-server's net mtu: 1-65520, 1 meaning the bridge's
		// (src/PVE/QemuServer/Network.pm $net_fmt at 9.2.6); a start
		// refuses one below 576, the IP minimum (QemuServer.pm
		// print_netdevice_full).
		if n.MTU < 0 || n.MTU > 65520 || n.MTU > 1 && n.MTU < 576 {
			v.errf(p+".mtu", "%d is not an MTU Proxmox starts a VM with: use 1 (the bridge's MTU) or 576-65520, or leave it out", n.MTU)
		}
		switch {
		case n.IP == "" || n.IP == NICDHCP:
		case !node || !strings.HasPrefix(path, "nodes["):
			// proxmox.vm and proxmox.roleVM are shared by many nodes.
			v.errf(p+".ip", "%q is a static address, which each node needs its own of: set it under nodes[].vm.nics (or use dhcp here)", n.IP)
		default:
			if pfx, err := netip.ParsePrefix(n.IP); err != nil || !pfx.Addr().Is4() {
				v.errf(p+".ip", "%q is not an IPv4 address with prefix (e.g. 10.0.30.21/24), dhcp, or empty", n.IP)
			}
		}
	}
}

// nodeExtras checks each node's effective disks and NICs (its own lists,
// or proxmox.vm's): unique disk names, the buses' slots, and static
// addresses that neither clash with each other nor sit in the node
// network.
func (v *validator) nodeExtras() {
	nodeNet, okCIDR := netip.Prefix{}, false
	if p, err := netip.ParsePrefix(v.c.Cluster.Network.CIDR); err == nil {
		nodeNet, okCIDR = p.Masked(), true
	}
	owners := map[netip.Addr]string{}
	for i, n := range v.c.Nodes {
		s := v.c.VMShapeOf(n)
		diskPath, nicPath := "proxmox.vm.disks", "proxmox.vm.nics"
		role, rolePath := v.c.Proxmox.RoleVM.Worker, "proxmox.roleVM.worker"
		if n.Role == RoleControlPlane {
			role, rolePath = v.c.Proxmox.RoleVM.ControlPlane, "proxmox.roleVM.controlplane"
		}
		if len(role.Disks) > 0 {
			diskPath = rolePath + ".disks"
		}
		if len(role.NICs) > 0 {
			nicPath = rolePath + ".nics"
		}
		if len(n.VM.Disks) > 0 {
			diskPath = fmt.Sprintf("nodes[%d].vm.disks", i)
		}
		if len(n.VM.NICs) > 0 {
			nicPath = fmt.Sprintf("nodes[%d].vm.nics", i)
		}
		names := map[string]int{}
		perBus := map[string]int{}
		for j, d := range s.Disks {
			if prev, dup := names[d.Name]; dup && d.Name != "" {
				v.errf(fmt.Sprintf("%s[%d].name", diskPath, j), "%q is already the name of %s[%d] (node %s): disk names must be unique per node", d.Name, diskPath, prev, n.Name)
			}
			names[d.Name] = j
			perBus[d.DiskBus()]++
		}
		for _, bus := range []string{BusSCSI, BusVirtio, BusSATA} {
			if perBus[bus] > ExtraDiskLimit[bus] {
				v.errf(diskPath, "node %s has %d %s disks besides the install disk: Proxmox takes at most %d (move some to another bus)", n.Name, perBus[bus], bus, ExtraDiskLimit[bus])
			}
		}
		if len(s.NICs) > ExtraNICLimit {
			v.errf(nicPath, "node %s has %d extra NICs: Proxmox takes at most %d besides net0", n.Name, len(s.NICs), ExtraNICLimit)
		}
		if len(n.VM.NICs) == 0 {
			// proxmox.vm's and roleVM's static addresses are refused
			// there already.
			continue
		}
		var nets []netip.Prefix
		for j, nic := range s.NICs {
			pfx, err := netip.ParsePrefix(nic.IP)
			if err != nil || !pfx.Addr().Is4() {
				continue
			}
			p := fmt.Sprintf("%s[%d].ip", nicPath, j)
			addr, net := pfx.Addr(), pfx.Masked()
			switch {
			case okCIDR && net.Overlaps(nodeNet):
				v.errf(p, "%s overlaps the node network %s (cluster.network.cidr), which net0 holds: give the NIC an address on another network", nic.IP, nodeNet)
			case pfx.Bits() < 31 && (addr == net.Addr() || addr == broadcast(net)):
				v.errf(p, "%s is the network's %s address: pick a host address", nic.IP, map[bool]string{true: "network", false: "broadcast"}[addr == net.Addr()])
			}
			for _, other := range nets {
				if other.Overlaps(net) {
					v.errf(p, "%s overlaps %s, another NIC of node %s: each NIC needs its own network", nic.IP, other, n.Name)
				}
			}
			nets = append(nets, net)
			if prev, dup := owners[addr]; dup {
				v.errf(p, "%s is already the address of %s: addresses must be unique", addr, prev)
			}
			owners[addr] = fmt.Sprintf("%s (node %s)", p, n.Name)
		}
	}
}

// UserVolumes are the names of node n's disks that are Talos user volumes.
func (c *Config) UserVolumes(n Node) []string {
	var out []string
	for _, d := range c.VMShapeOf(n).Disks {
		if d.VolumeKind() == VolumeUser {
			out = append(out, d.Name)
		}
	}
	return out
}
