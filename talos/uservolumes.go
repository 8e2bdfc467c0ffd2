package talos

import (
	"context"
	"fmt"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/client"

	"github.com/siderolabs/go-pointer"
	"github.com/siderolabs/talos/pkg/machinery/cel"
	"github.com/siderolabs/talos/pkg/machinery/cel/celenv"
	configdoc "github.com/siderolabs/talos/pkg/machinery/config/config"
	blockcfg "github.com/siderolabs/talos/pkg/machinery/config/types/block"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
)

// UserVolume is an extra disk of a node that Talos formats and mounts as a
// user volume (proxmox.vm.disks with volume: user).
type UserVolume struct {
	// Name is the volume's name: Talos calls it u-<Name> and mounts it at
	// /var/mnt/<Name>.
	Name string
	// Serial is the serial Proxmox gives the disk (config.DiskSerial).
	Serial string
	// Bus is the disk's bus (scsi, virtio, sata), for messages.
	Bus string
}

// VolumeID is the ID of the volume's VolumeStatus: u-<name>
// (constants.UserVolumePrefix; volumeconfig/user_volumes.go at v1.12.0,
// v1.13.3 and v1.14.0-rc.1).
func (u UserVolume) VolumeID() string { return constants.UserVolumePrefix + u.Name }

// MountPath is where Talos mounts the volume
// (constants.UserVolumeMountPoint/<name>).
func (u UserVolume) MountPath() string { return constants.UserVolumeMountPoint + "/" + u.Name }

// DiskSelector is the CEL expression that selects exactly the volume's
// disk, by the serial Proxmox gave it. Talos' Disk resource takes its
// serial from /sys/block/<dev>/device/serial, and on a scsi or ata
// transport with none there from udev's scsi_id or ata_id
// (controllers/block/disks.go at v1.12.0, v1.13.3 and v1.14.0-rc.1;
// go-blockdevice block/device_linux.go GetProperties). Which of them a
// disk on Proxmox's VirtIO SCSI controller (transport virtio there) or
// virtio-blk reports is unverified here: the kernel's sysfs is not in the
// sources read. So the selector also takes the disk's udev by-id links
// (Disk.symlinks), which end in the serial for every bus udev names
// (virtio-<serial>, scsi-0QEMU_QEMU_HARDDISK_<serial>,
// ata-QEMU_HARDDISK_<serial>; the form of each link is unverified). The
// serial is long and random enough that no other disk's name ends in it.
func (u UserVolume) DiskSelector() string {
	return fmt.Sprintf(`disk.serial == %q || disk.symlinks.exists(l, l.endsWith(%q))`, u.Serial, u.Serial)
}

// userVolumeDocs are the UserVolumeConfig documents of a node's user
// volumes: the whole disk (volumeType disk, in Talos since v1.12.0:
// config/types/block/user_volume_config.go), formatted with Talos'
// default filesystem (xfs) and mounted at /var/mnt/<name>.
func userVolumeDocs(vols []UserVolume) ([]configdoc.Document, error) {
	var docs []configdoc.Document
	for _, u := range vols {
		// Kept as text: machinery writes a parsed expression back from
		// its syntax tree, which cannot print a macro such as exists
		// (cel-go's AstToString without macro call tracking); parsed
		// here only to check it.
		var expr cel.Expression
		if err := expr.UnmarshalText([]byte(u.DiskSelector())); err != nil {
			return nil, fmt.Errorf("user volume %s: disk selector: %w", u.Name, err)
		}
		if err := expr.ParseBool(celenv.DiskLocator()); err != nil {
			return nil, fmt.Errorf("user volume %s: disk selector: %w", u.Name, err)
		}
		doc := blockcfg.NewUserVolumeConfigV1Alpha1()
		doc.MetaName = u.Name
		doc.VolumeType = pointer.To(block.VolumeTypeDisk)
		doc.ProvisioningSpec.DiskSelectorSpec.Match = expr
		docs = append(docs, doc)
	}
	return docs, nil
}

// VolumeState is what a node says of one user volume: its VolumeStatus
// phase (ready, failed, waiting, …; "absent" while the node has no such
// volume, e.g. before its config is applied) and error message.
type VolumeState struct {
	Phase    string `json:"phase"`
	Error    string `json:"error,omitempty"`
	Location string `json:"location,omitempty"`
}

// Ready says whether the volume is ready (mounted at its path).
func (v VolumeState) Ready() bool { return v.Phase == block.VolumePhaseReady.String() }

// UserVolumeStates reads the VolumeStatus of each of vols on the node at
// ip (`talosctl get volumestatus u-<name>`); a volume the node does not
// have is "absent".
func (o *Ops) UserVolumeStates(ctx context.Context, ip string, vols []UserVolume) (map[string]VolumeState, error) {
	out := map[string]VolumeState{}
	err := o.callRetrying(ctx, ip, "reading the user volumes of "+ip, func(ctx context.Context, c *client.Client) error {
		for _, u := range vols {
			vs, err := safe.StateGetByID[*block.VolumeStatus](ctx, c.COSI, u.VolumeID())
			switch {
			case state.IsNotFoundError(err):
				out[u.Name] = VolumeState{Phase: "absent"}
			case err != nil:
				return err
			default:
				s := vs.TypedSpec()
				out[u.Name] = VolumeState{Phase: s.Phase.String(), Error: s.ErrorMessage, Location: s.Location}
			}
		}
		return nil
	})
	return out, err
}
