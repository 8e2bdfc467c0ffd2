package talos

import (
	"testing"

	blockpb "github.com/siderolabs/talos/pkg/machinery/api/resource/definitions/block"
	"github.com/siderolabs/talos/pkg/machinery/cel"
	"github.com/siderolabs/talos/pkg/machinery/cel/celenv"
)

// TestUserVolumeSelectsOnlyItsDisk evaluates the selector the way Talos'
// volume manager does (EvalBool in the DiskLocator environment with the
// disk's protobuf spec, controllers/block/internal/volumes/locate.go at
// v1.13.3): the disk with the serial matches, by its serial field or by a
// by-id link, and no other disk does.
func TestUserVolumeSelectsOnlyItsDisk(t *testing.T) {
	u := UserVolume{Name: "data", Serial: "bs-0123456789abcdef"}
	var expr cel.Expression
	if err := expr.UnmarshalText([]byte(u.DiskSelector())); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		disk *blockpb.DiskSpec
		want bool
	}{
		{"serial", &blockpb.DiskSpec{DevPath: "/dev/sdb", Serial: u.Serial}, true},
		{"scsi by-id link", &blockpb.DiskSpec{DevPath: "/dev/sdb", Symlinks: []string{"/dev/disk/by-path/pci-0000:00:05.0-scsi-0:0:0:1", "/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_" + u.Serial}}, true},
		{"virtio by-id link", &blockpb.DiskSpec{DevPath: "/dev/vda", Symlinks: []string{"/dev/disk/by-id/virtio-" + u.Serial}}, true},
		{"install disk", &blockpb.DiskSpec{DevPath: "/dev/sda", Symlinks: []string{"/dev/disk/by-id/scsi-0QEMU_QEMU_HARDDISK_drive-scsi0"}}, false},
		{"another extra disk", &blockpb.DiskSpec{DevPath: "/dev/sdc", Serial: "bs-fedcba9876543210"}, false},
		{"no serial", &blockpb.DiskSpec{DevPath: "/dev/sdd"}, false},
	} {
		got, err := expr.EvalBool(celenv.DiskLocator(), map[string]any{"disk": tc.disk})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got != tc.want {
			t.Errorf("%s: selector says %v, want %v", tc.name, got, tc.want)
		}
	}
	if u.VolumeID() != "u-data" || u.MountPath() != "/var/mnt/data" {
		t.Errorf("volume %s at %s", u.VolumeID(), u.MountPath())
	}
}
