package talossim

import (
	"context"
	"fmt"
	"strings"

	"github.com/cosi-project/runtime/pkg/state"
	"github.com/cosi-project/runtime/pkg/state/impl/inmem"
	"github.com/cosi-project/runtime/pkg/state/impl/namespaced"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
)

// devPathFor names disk i the way Linux does on a Proxmox VM: SCSI, SATA
// and IDE disks share the sd* sequence, virtio-blk disks get vd*.
func devPathFor(disks []Disk, i int) string {
	prefix := "sd"
	if strings.EqualFold(disks[i].Bus, "virtio") {
		prefix = "vd"
	}
	idx := 0
	for j := 0; j < i; j++ {
		if (strings.EqualFold(disks[j].Bus, "virtio")) == (prefix == "vd") {
			idx++
		}
	}
	return "/dev/" + prefix + string(rune('a'+idx))
}

// newDiskState is the node's COSI state with one Disk resource per VM disk
// plus, with cdrom, the Talos ISO as a read-only CD-ROM, as `talosctl get
// disks` shows on a Proxmox VM booted from the ISO (a VM created from the
// disk image has no CD-ROM drive).
func newDiskState(disks []Disk, cdrom bool) (state.State, error) {
	st := state.WrapCore(namespaced.NewState(inmem.Build))
	ctx := context.Background()
	for i, d := range disks {
		dev := devPathFor(disks, i)
		r := block.NewDisk(block.NamespaceName, strings.TrimPrefix(dev, "/dev/"))
		spec := r.TypedSpec()
		spec.DevPath = dev
		spec.SetSize(d.Size)
		spec.IOSize, spec.SectorSize = 512, 512
		spec.Model = d.Model
		if spec.Model == "" {
			spec.Model = "QEMU HARDDISK"
		}
		if d.Serial != "" {
			// Which of the serial field and the by-id link a real
			// Proxmox disk shows Talos is unverified (see byIDLink).
			spec.Serial = d.Serial
			spec.Symlinks = []string{byIDLink(d.Bus, d.Serial)}
		}
		switch {
		case strings.EqualFold(d.Bus, "virtio"):
			spec.Transport = "virtio"
		case strings.EqualFold(d.Bus, "sata"), strings.EqualFold(d.Bus, "ide"):
			spec.Transport = "ata"
		default:
			spec.Transport = "scsi"
		}
		if err := st.Create(ctx, r); err != nil {
			return nil, fmt.Errorf("talossim: disk %s: %w", dev, err)
		}
	}
	if !cdrom {
		return st, nil
	}
	iso := block.NewDisk(block.NamespaceName, "sr0")
	iso.TypedSpec().DevPath = "/dev/sr0"
	iso.TypedSpec().SetSize(300 << 20)
	iso.TypedSpec().Readonly = true
	iso.TypedSpec().CDROM = true
	iso.TypedSpec().Model = "QEMU DVD-ROM"
	iso.TypedSpec().Transport = "ata"
	if err := st.Create(ctx, iso); err != nil {
		return nil, fmt.Errorf("talossim: cdrom: %w", err)
	}
	return st, nil
}
