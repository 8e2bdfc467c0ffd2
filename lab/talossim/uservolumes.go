package talossim

import (
	"context"
	"net/netip"
	"strings"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	blockpb "github.com/siderolabs/talos/pkg/machinery/api/resource/definitions/block"
	"github.com/siderolabs/talos/pkg/machinery/cel/celenv"
	"github.com/siderolabs/talos/pkg/machinery/config"
	configdoc "github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/nethelpers"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
)

// NoDiskMatched is the error of a user volume whose selector matches no
// disk (controllers/block/internal/volumes/locate.go findCandidateDisks at
// v1.13.3); the volume manager puts it in the VolumeStatus with phase
// failed (controllers/block/volume_manager.go at v1.13.3).
const NoDiskMatched = "no disks matched selector for volume"

// byIDLink is the udev by-id link of a disk with serial on bus, as
// systemd's 60-persistent-storage rules name a QEMU disk: virtio-<serial>
// for virtio-blk, scsi-0QEMU_QEMU_HARDDISK_<serial> from scsi_id's
// vendor-specific page 0x83 id, ata-QEMU_HARDDISK_<serial> from ata_id.
// The exact forms are unverified here (udev's rules and helpers are not
// in the sources read); what the user volume selector relies on is that
// the link ends in the serial.
func byIDLink(bus, serial string) string {
	switch strings.ToLower(bus) {
	case "virtio":
		return "/dev/disk/by-id/virtio-" + serial
	case "sata", "ide":
		return "/dev/disk/by-id/ata-QEMU_HARDDISK_" + serial
	}
	return "/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_" + serial
}

// diskProto is a Disk's spec in the protobuf form Talos' volume manager
// evaluates disk selectors against (volumes.DiskContext, locate.go at
// v1.13.3), with the fields the simulator sets.
func diskProto(d *block.DiskSpec) *blockpb.DiskSpec {
	return &blockpb.DiskSpec{Size: d.Size, PrettySize: d.PrettySize, IoSize: uint64(d.IOSize), SectorSize: uint64(d.SectorSize),
		Readonly: d.Readonly, Cdrom: d.CDROM, Model: d.Model, Serial: d.Serial, Transport: d.Transport, DevPath: d.DevPath, Symlinks: d.Symlinks}
}

// publishUserVolumes sets a VolumeStatus u-<name> per UserVolumeConfig of
// cfg, as Talos' volume manager does: the disk its selector matches
// (writable disks only, findCandidateDisks), the volume ready on it; none
// matched, failed with NoDiskMatched. Only volumeType disk is simulated
// (a partition volume's size and placement are not); a selector that
// matches several disks takes the first (Talos' selectBestDisk ranks them:
// unverified here). Volumes whose document is gone are withdrawn.
func publishUserVolumes(st state.State, cfg config.Provider) {
	ctx := context.Background()
	want := map[string]bool{}
	var vols []configdoc.UserVolumeConfig
	if cfg != nil {
		vols = cfg.UserVolumeConfigs()
	}
	disks, _ := safe.StateListAll[*block.Disk](ctx, st)
	for _, v := range vols {
		id := constants.UserVolumePrefix + v.Name()
		want[id] = true
		var match *block.DiskSpec
		if sel, ok := v.Provisioning().DiskSelector().Get(); ok {
			for d := range disks.All() {
				spec := d.TypedSpec()
				if spec.Readonly {
					continue
				}
				if ok, err := sel.EvalBool(celenv.DiskLocator(), map[string]any{"disk": diskProto(spec)}); err == nil && ok {
					match = spec
					break
				}
			}
		}
		_ = safe.StateModify(ctx, st, block.NewVolumeStatus(block.NamespaceName, id), func(vs *block.VolumeStatus) error {
			s := vs.TypedSpec()
			s.Type = v.Type().ValueOr(block.VolumeTypePartition)
			if match == nil {
				s.PreFailPhase, s.Phase = block.VolumePhaseWaiting, block.VolumePhaseFailed
				s.ErrorMessage, s.Location, s.MountLocation = NoDiskMatched, "", ""
				return nil
			}
			s.Phase, s.PreFailPhase, s.ErrorMessage = block.VolumePhaseReady, 0, ""
			s.Location, s.MountLocation = match.DevPath, match.DevPath
			s.Filesystem = block.FilesystemTypeXFS
			s.SetSize(match.Size)
			return nil
		})
	}
	old, _ := safe.StateListAll[*block.VolumeStatus](ctx, st)
	for r := range old.All() {
		if strings.HasPrefix(r.Metadata().ID(), constants.UserVolumePrefix) && !want[r.Metadata().ID()] {
			_ = st.Destroy(ctx, r.Metadata())
		}
	}
}

// Address is a static address of one of the VM's extra NICs, from its
// cloud-init ipconfigN.
type Address struct {
	// Link is the name the NIC gets: eth<N> for netN, the name qemu-server
	// writes in the network-config (Cloudinit.pm nocloud_network at
	// 9.2.6); Talos' nocloud platform renames it to the link whose MAC
	// matches (platform/nocloud/metadata.go applyNetworkConfigV1 at
	// v1.13.3), which on a real VM may be another name (unverified).
	Link   string
	Prefix netip.Prefix
}

// publishAddresses sets an AddressStatus per static address of the extra
// NICs: Talos' nocloud platform config puts them on their links in
// maintenance mode and after the install alike (the platform network
// config is read at every boot).
func publishAddresses(st state.State, addrs []Address) {
	ctx := context.Background()
	for _, a := range addrs {
		_ = safe.StateModify(ctx, st, network.NewAddressStatus(network.NamespaceName, network.AddressID(a.Link, a.Prefix)), func(r *network.AddressStatus) error {
			s := r.TypedSpec()
			s.Address, s.Local, s.LinkName = a.Prefix, a.Prefix.Addr(), a.Link
			s.Family, s.Scope = nethelpers.FamilyInet4, nethelpers.ScopeGlobal
			return nil
		})
	}
}

// VolumeStatus is the phase and location of the node's VolumeStatus id
// (e.g. u-data), as `talosctl get volumestatus` shows them; ok is false
// when the node has none.
func (n *Node) VolumeStatus(id string) (phase, location, errMsg string, ok bool) {
	vs, err := safe.StateGetByID[*block.VolumeStatus](context.Background(), n.cosi, id)
	if err != nil {
		return "", "", "", false
	}
	s := vs.TypedSpec()
	return s.Phase.String(), s.Location, s.ErrorMessage, true
}

// DiskSerials maps each of the node's disks (device path) to the serial
// its Disk resource reports.
func (n *Node) DiskSerials() map[string]string {
	out := map[string]string{}
	list, _ := safe.StateListAll[*block.Disk](context.Background(), n.cosi)
	for d := range list.All() {
		out[d.TypedSpec().DevPath] = d.TypedSpec().Serial
	}
	return out
}

// Addresses lists the node's AddressStatus resources as link/prefix.
func (n *Node) Addresses() []string {
	var out []string
	list, _ := safe.StateListAll[*network.AddressStatus](context.Background(), n.cosi)
	for a := range list.All() {
		out = append(out, a.Metadata().ID())
	}
	return out
}
