package lab

import (
	"github.com/homelab/bootstrap/lab/pvesim"
	"github.com/homelab/bootstrap/lab/talossim"
)

// firmware is what a VM's firmware means to the Talos it boots: UEFI
// with an EFI disk, Microsoft's keys or setup mode, a TPM 2.0, and
// whether its ISO is the lab factory's Secure Boot ISO (the URL pvesim
// downloaded it from).
func (l *Lab) firmware(fw pvesim.Firmware) talossim.Firmware {
	return talossim.Firmware{
		UEFI:            fw.UEFI && fw.EFIDisk,
		PreEnrolledKeys: fw.PreEnrolledKeys,
		TPM2:            fw.TPM == "v2.0",
		SecureBootISO:   fw.CDROMURL != "" && l.Factory.SecureBootISO(fw.CDROMURL),
	}
}
