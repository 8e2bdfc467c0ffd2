package pvesim

import (
	"cmp"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// What qemu-server does with a VM's extra disks and NICs beyond what the
// install disk and net0 already exercise: a drive's serial, a NIC's mtu
// and firewall options, and the bridge a VirtIO NIC needs at start.

// urlencodedRE is pve-common's urlencoded format (9.2.1
// src/PVE/JSONSchema.pm pve_verify_urlencoded).
var urlencodedRE = regexp.MustCompile(`^[-%a-zA-Z0-9_.!~*'()]*$`)

// serialError checks a drive's serial= as the drive schema does
// (qemu-server 9.2.6 src/PVE/QemuServer/Drive.pm: format urlencoded,
// maxLength 60, "up to 20 bytes long" once decoded, which the schema
// leaves to its maxLength of 20*3).
func serialError(key string, d drive) string {
	v := d.get("serial")
	switch {
	case v == "":
		return ""
	case !urlencodedRE.MatchString(v):
		return "invalid format - format error\n" + key + ".serial: invalid urlencoded string: " + v
	case len(v) > 60:
		return "invalid format - format error\n" + key + ".serial: value may only be 60 characters long"
	}
	return ""
}

// driveSerial is the serial the guest reads: qemu-server url-decodes it
// onto the device (src/PVE/QemuServer/DriveDevice.pm at 9.2.6).
func driveSerial(d drive) string {
	v := d.get("serial")
	if dec, err := url.PathUnescape(v); err == nil {
		return dec
	}
	return v
}

// netOptionsError checks the net options parseNet leaves in rest:
// mtu an integer 1-65520, firewall and link_down booleans (qemu-server
// 9.2.6 src/PVE/QemuServer/Network.pm $net_fmt).
func netOptionsError(n nic) string {
	for _, o := range n.rest {
		switch o[0] {
		case "mtu":
			m, err := strconv.Atoi(o[1])
			switch {
			case err != nil:
				return "mtu: type check ('integer') failed - got '" + o[1] + "'"
			case m < 1:
				return "mtu: value must have a minimum value of 1"
			case m > 65520:
				return "mtu: value must have a maximum value of 65520"
			}
		case "firewall", "link_down":
			switch strings.ToLower(o[1]) {
			case "0", "1", "yes", "no", "on", "off", "true", "false":
			default:
				return o[0] + ": type check ('boolean') failed - got '" + o[1] + "'"
			}
		}
	}
	return ""
}

// netdevLocked is what building a VirtIO NIC's device asks of its bridge
// at start (qemu-server 9.2.6 src/PVE/QemuServer.pm print_netdevice_full):
// the bridge's MTU, which fails the start when the bridge does not exist
// (pve-common 9.2.1 src/PVE/Network.pm read_bridge_mtu: "bridge '<b>' does
// not exist", before tap_plug's own check), and an mtu other than 1 must
// be 576 or more and no more than the bridge's. Creating the VM checks
// none of this (only SDN.Use on the bridge, check_bridge_access).
func (s *Server) netdevLocked(key string, n nic) error {
	if n.model != "virtio" {
		return nil
	}
	b, ok := s.bridgeLocked(n.bridge)
	if !ok {
		return fmt.Errorf("bridge '%s' does not exist", n.bridge)
	}
	bridgeMTU := cmp.Or(b.MTU, 1500)
	for _, o := range n.rest {
		if o[0] != "mtu" {
			continue
		}
		m, _ := strconv.Atoi(o[1])
		switch {
		case m == 1:
		case m < 576:
			return fmt.Errorf("netdev %s: MTU '%d' is smaller than the IP minimum MTU '576'", key, m)
		case m > bridgeMTU:
			return fmt.Errorf("netdev %s: MTU '%d' is bigger than the bridge MTU '%d' - adjust the MTU for the network device in the VM configuration, while ensuring that the bridge is configured as desired.", key, m, bridgeMTU)
		}
	}
	return nil
}

// extraNICsOf lists a VM's NICs besides net0 with their cloud-init static
// addresses: qemu-server's nocloud network-config has one entry per netN
// that has an ipconfigN, by the NIC's MAC (src/PVE/QemuServer/Cloudinit.pm
// nocloud_network at 9.2.6).
func extraNICsOf(conf map[string]string) []NIC {
	var out []NIC
	for k, v := range conf {
		m := netKeyRE.FindStringSubmatch(k)
		if m == nil || m[1] == "0" {
			continue
		}
		n, err := parseNet(v)
		if err != nil {
			continue
		}
		nic := NIC{Key: k, MAC: strings.ToUpper(n.mac), Bridge: n.bridge, VLAN: n.tag}
		if ipc := conf["ipconfig"+m[1]]; ipc != "" {
			if p, _, err := parseIPConfig(ipc); err == nil {
				nic.IPv4 = p
			}
		}
		out = append(out, nic)
	}
	sort.Slice(out, func(i, j int) bool {
		a, _ := strconv.Atoi(strings.TrimPrefix(out[i].Key, "net"))
		b, _ := strconv.Atoi(strings.TrimPrefix(out[j].Key, "net"))
		return a < b
	})
	return out
}
