package pvesim

import (
	"fmt"
	"net/url"
	"testing"
)

// tpmstate0 is allocated after the EFI disk with qemu-server's fixed
// 4 MiB whatever size is asked, raw on PVE 8 (a qcow2 default on a
// directory storage notwithstanding), the storage's default format on
// PVE 9; the guest sees no disk for it, and the VM's firmware facts name
// the TPM's version, the EFI disk's keys and the ISO.
func TestTPMStateVolume(t *testing.T) {
	for _, tc := range []struct {
		version, storage, want string
	}{
		{"8.2.4", "local-lvm", "local-lvm:vm-701-disk-2,size=4M,version=v2.0"},
		// A file storage numbers disks per format suffix
		// (get_next_vm_diskname's pattern ends in ".$fmt", pve-storage
		// src/PVE/Storage/Plugin.pm at 0c56bad8): the first raw is disk-0
		// beside the qcow2 disk-0 and disk-1.
		{"8.2.4", "local", "local:701/vm-701-disk-0.raw,size=4M,version=v2.0"},
		{"9.1.19", "local", "local:701/vm-701-disk-2.qcow2,size=4M,version=v2.0"},
	} {
		t.Run(tc.version+"-"+tc.storage, func(t *testing.T) {
			s := newSim(t, Options{Version: tc.version, ISOs: []ISOSpec{{Storage: "local", Name: "talos.iso", Size: 100 << 20}}, Storages: []StorageSpec{
				{Name: "local", Type: "dir", Content: []string{"iso", "images"}, TotalBytes: 100 << 30},
				{Name: "local-lvm", Type: "lvmthin", Content: []string{"images"}, TotalBytes: 100 << 30},
			}})
			c := newClient(t, s)
			vm := url.Values{}
			for k, v := range talosVM {
				vm[k] = v
			}
			vm.Set("scsi0", tc.storage+":32,discard=on")
			vm.Set("bios", "ovmf")
			vm.Set("efidisk0", tc.storage+":1,efitype=4m,pre-enrolled-keys=1")
			vm.Set("tpmstate0", tc.storage+":1,version=v2.0")
			if st := c.waitTask(c.ok("POST", "/nodes/pve/qemu", vm).(string)); st["exitstatus"] != "OK" {
				t.Fatalf("create: %v", st)
			}
			conf := c.ok("GET", "/nodes/pve/qemu/701/config", nil).(map[string]any)
			if conf["tpmstate0"] != tc.want {
				t.Errorf("tpmstate0 %v, want %s", conf["tpmstate0"], tc.want)
			}
			info, _ := s.VM(701)
			if len(info.Event.Disks) != 1 || info.Event.Disks[0].Slot != "scsi0" {
				t.Errorf("the guest sees %+v, want only scsi0", info.Event.Disks)
			}
			fw := info.Event.Firmware
			if !fw.UEFI || !fw.EFIDisk || !fw.PreEnrolledKeys || fw.TPM != "v2.0" || fw.CDROM != fmt.Sprint("local:iso/talos.iso") {
				t.Errorf("firmware %+v", fw)
			}
		})
	}
}
