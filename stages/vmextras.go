package stages

import (
	"cmp"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/proxmox"
	"github.com/homelab/bootstrap/talos"
)

// extraDisks are node n's extra disks (proxmox.vm.disks, or its own) as
// the VM spec takes them: each on its storage (proxmox.diskStorage unless
// set) with its serial.
func extraDisks(cfg *config.Config, n config.Node) []proxmox.ExtraDisk {
	var out []proxmox.ExtraDisk
	for _, d := range cfg.VMShapeOf(n).Disks {
		out = append(out, proxmox.ExtraDisk{Name: d.Name, Storage: cmp.Or(d.Storage, cfg.Proxmox.DiskStorage), SizeGiB: d.SizeGiB,
			Bus: d.DiskBus(), Serial: config.DiskSerial(cfg.Cluster.Name, n.Name, d.Name)})
	}
	return out
}

// extraNICs are node n's extra NICs as the VM spec takes them: net1, net2,
// … on proxmox.bridge unless set, each with its stable MAC.
func extraNICs(cfg *config.Config, n config.Node) []proxmox.ExtraNIC {
	var out []proxmox.ExtraNIC
	for i, nic := range cfg.VMShapeOf(n).NICs {
		out = append(out, proxmox.ExtraNIC{Bridge: cmp.Or(nic.Bridge, cfg.Proxmox.Bridge), VLAN: nic.VLAN, MTU: nic.MTU, Firewall: nic.Firewall,
			IP: nic.IP, MAC: proxmox.ExtraNICMAC(cfg.Cluster.Name, n.Name, i+1)})
	}
	return out
}

// userVolumes are node n's disks that Talos is to make user volumes.
func userVolumes(cfg *config.Config, n config.Node) []talos.UserVolume {
	var out []talos.UserVolume
	for _, d := range cfg.VMShapeOf(n).Disks {
		if d.VolumeKind() == config.VolumeUser {
			out = append(out, talos.UserVolume{Name: d.Name, Serial: config.DiskSerial(cfg.Cluster.Name, n.Name, d.Name), Bus: d.DiskBus()})
		}
	}
	return out
}
