package talossim

import (
	"context"
	"net/netip"
	"testing"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	"github.com/siderolabs/talos/pkg/machinery/resources/network"
)

const userVolumes = `apiVersion: v1alpha1
kind: UserVolumeConfig
name: data
volumeType: disk
provisioning:
    diskSelector:
        match: disk.serial == "bs-0123456789abcdef" || disk.symlinks.exists(l, l.endsWith("bs-0123456789abcdef"))
---
apiVersion: v1alpha1
kind: UserVolumeConfig
name: gone
volumeType: disk
provisioning:
    diskSelector:
        match: disk.serial == "bs-ffffffffffffffff"
`

// TestUserVolumeStatus: the volume whose selector matches the extra disk
// is ready on it, the one matching nothing failed with Talos' message;
// the install disk and the CD-ROM are never taken.
func TestUserVolumeStatus(t *testing.T) {
	st, err := newDiskState([]Disk{{Bus: "scsi", Size: 20 << 30}, {Bus: "scsi", Size: 20 << 30, Serial: "bs-0123456789abcdef"}}, true)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := configloader.NewFromBytes([]byte(userVolumes))
	if err != nil {
		t.Fatal(err)
	}
	publishUserVolumes(st, cfg)
	ctx := context.Background()
	data, err := safe.StateGetByID[*block.VolumeStatus](ctx, st, "u-data")
	if err != nil {
		t.Fatal(err)
	}
	if s := data.TypedSpec(); s.Phase != block.VolumePhaseReady || s.Location != "/dev/sdb" || s.Size != 20<<30 {
		t.Errorf("u-data: %s at %q, %d bytes", s.Phase, s.Location, s.Size)
	}
	gone, err := safe.StateGetByID[*block.VolumeStatus](ctx, st, "u-gone")
	if err != nil {
		t.Fatal(err)
	}
	if s := gone.TypedSpec(); s.Phase != block.VolumePhaseFailed || s.ErrorMessage != NoDiskMatched {
		t.Errorf("u-gone: %s %q", s.Phase, s.ErrorMessage)
	}
	// A config without the documents withdraws them.
	publishUserVolumes(st, nil)
	if list, _ := safe.StateListAll[*block.VolumeStatus](ctx, st); list.Len() != 0 {
		t.Errorf("%d volume statuses left", list.Len())
	}

	publishAddresses(st, []Address{{Link: "eth1", Prefix: netip.MustParsePrefix("10.0.30.21/24")}})
	a, err := safe.StateGetByID[*network.AddressStatus](ctx, st, "eth1/10.0.30.21/24")
	if err != nil || a.TypedSpec().LinkName != "eth1" {
		t.Errorf("address: %v %+v", err, a)
	}
}
