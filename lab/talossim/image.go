package talossim

import (
	"context"
	"fmt"
	"slices"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/imager/quirks"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"

	"github.com/homelab/bootstrap/lab/imagefactory"
)

// A VM whose disk was created from the Image Factory's nocloud disk image
// boots Talos from it, as read at siderolabs/talos v1.13.3:
//
//   - The image holds the boot partitions and META, nothing else: the
//     installer in image mode adds STATE and EPHEMERAL only for Talos
//     before 1.8 (cmd/installer/pkg/install/install.go, legacyImage and
//     quirks SkipDataPartitions). Its size depends on the Talos version
//     (factory.DiskImageBytes: 4247 MiB from 1.11 on).
//   - META found makes Installed() true (internal/app/machined/pkg/
//     runtime/v1alpha1/v1alpha1_state.go: the META volume's phase ready),
//     and the SystemDisk resource names the disk META is on
//     (internal/app/machined/pkg/controllers/block/system_disk.go).
//   - Without a config the node waits in maintenance mode as from the
//     ISO. A maintenance apply then runs the Install sequence, which has
//     no phases when Installed() (v1alpha1_sequencer.go Install), and the
//     Boot sequence follows: no install, no reboot; apid restarts with the
//     config's CA as after any maintenance apply.
//   - STATE and EPHEMERAL are created on that first configured boot on the
//     system disk (internal/app/machined/pkg/controllers/block/internal/
//     volumes/volumeconfig/system_volumes.go: STATE 100 MiB, EPHEMERAL at
//     least 2 GiB and Grow, so it takes the rest of the disk); the boot
//     sequence's diskSizeCheck waits until EPHEMERAL exists
//     (v1alpha1_sequencer_tasks.go DiskSizeCheck), so on a disk left at the
//     image's size the boot never gets further.
//   - The network settings still come from the NoCloud cloud-init drive.

// DiskImage is what a VM's disk imported from the factory's disk image
// carries: the Talos version of the image and its system extensions
// (those of the schematic it was built from).
type DiskImage struct {
	Version    string
	Extensions []imagefactory.Extension
}

// imageDiskTooSmall says why a disk created from the image cannot hold
// STATE and EPHEMERAL next to the image's partitions ("" when it can).
func imageDiskTooSmall(disks []Disk, imageBytes uint64) string {
	ps := quirks.New("").PartitionSizes()
	need := imageBytes + ps.StateSize() + ps.EphemeralMinSize()
	if len(disks) == 0 || disks[0].Size >= need {
		return ""
	}
	return fmt.Sprintf("system disk %s is %d MiB, the image's partitions, STATE and a 2 GiB EPHEMERAL need %d MiB: waiting for EPHEMERAL (diskSizeCheck) forever (grow the disk before the first boot)",
		devPathFor(disks, 0), disks[0].Size>>20, need>>20)
}

// publishImageEphemeral is EPHEMERAL on a disk created from the image: the
// disk less the image and STATE (GPT overhead left out).
func publishImageEphemeral(st state.State, diskSize, imageBytes uint64, location string) {
	publishEphemeralBeside(st, diskSize, imageBytes+quirks.New("").PartitionSizes().StateSize(), location)
}

// publishSystemDisk publishes the SystemDisk resource (block namespace,
// ID system-disk) of the disk holding META, readable in maintenance mode.
func publishSystemDisk(st state.State, devPath string) {
	_ = safe.StateModify(context.Background(), st, block.NewSystemDisk(block.NamespaceName, block.SystemDiskID), func(d *block.SystemDisk) error {
		d.TypedSpec().DiskID = devPath[len("/dev/"):]
		d.TypedSpec().DevPath = devPath
		return nil
	})
}

// configureInPlaceLocked is a maintenance apply on a node booted from the
// disk image: apid restarts with the config's CA, the (empty) install
// sequence passes, and the Boot sequence runs on the same boot, with the
// config written to the new STATE. n.mu is held.
func (n *Node) configureInPlaceLocked(cfg []byte, parsed config.Provider) {
	n.leaveMaintenanceLocked(cfg, parsed, PhaseBooting)
	sys := n.imageSys.clone()
	sys.config = slices.Clone(cfg)
	n.afterLocked(n.sim.scaled(n.sim.opts.Profile.ApidRestart), func() {
		n.counters.ImageBoots++
		n.sim.persist(n.ip, sys)
		n.bootLocked(sys)
	})
}

// BootedFromImage says whether the node's current boot runs Talos from a
// disk created from the factory's disk image.
func (n *Node) BootedFromImage() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.fromImage
}

// BootBlocked says why the node's configured boot cannot go on ("" when
// it can).
func (n *Node) BootBlocked() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.bootBlocked
}
