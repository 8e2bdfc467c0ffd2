package pvesim

import (
	"fmt"
	"strings"
)

// tpmStateBytes is qemu-server's TPMSTATE_DISK_SIZE, the fixed size of a
// TPM state volume whatever size the request names (src/PVE/QemuServer/
// Drive.pm and src/PVE/API2/Qemu.pm $create_disks, master and
// stable-bookworm alike).
const tpmStateBytes = 4 * mib

// allocTPMStateLocked allocates the TPM state volume of a new tpmstate0
// drive: 4 MiB on its storage, raw on PVE 8 (stable-bookworm's
// $create_disks passes "raw" to vdisk_alloc, as swtpm needs), the
// requested or the storage's default format on PVE 9 (master passes
// $disk->{format} || storage_default_format). s.mu must be held.
func (s *Server) allocTPMStateLocked(id int, d drive) (string, int64, error) {
	m := newDiskRE.FindStringSubmatch(d.file)
	st := s.storageByName(m[2])
	if st == nil {
		return "", 0, fmt.Errorf("storage '%s' does not exist", m[2])
	}
	format := d.get("format")
	if strings.HasPrefix(s.version, "8.") {
		format = "raw"
	}
	size := volumeSize(st.spec.Type, tpmStateBytes)
	volid, err := s.allocLocked(m[2], id, "", size, format)
	return volid, size, err
}

// firmwareOf is what a VM's firmware holds for the guest, from its
// config: UEFI (bios ovmf) with an EFI disk, whether that disk was
// created with Microsoft's keys (pre-enrolled-keys, qemu-server's
// efidisk option: 1 copies OVMF's vars with the keys enrolled, 0 or
// absent leaves them in setup mode, src/PVE/QemuServer/OVMF.pm
// get_ovmf_files at 9.2.6), and a TPM of which version.
func firmwareOf(conf map[string]string) Firmware {
	fw := Firmware{UEFI: conf["bios"] == "ovmf"}
	if v, ok := conf["efidisk0"]; ok {
		if d, err := parseDrive(v); err == nil {
			fw.EFIDisk = true
			fw.PreEnrolledKeys = d.get("pre-enrolled-keys") == "1"
		}
	}
	if v, ok := conf["tpmstate0"]; ok {
		if d, err := parseDrive(v); err == nil {
			fw.TPM = d.get("version")
			if fw.TPM == "" {
				fw.TPM = "v1.2" // the schema's default
			}
		}
	}
	if v, ok := conf["ide2"]; ok {
		if d, err := parseDrive(v); err == nil && d.isCDROM() && d.file != "none" && d.file != "cdrom" {
			fw.CDROM = d.file
		}
	}
	return fw
}
