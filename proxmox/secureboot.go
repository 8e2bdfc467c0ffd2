package proxmox

import (
	"fmt"
	"strings"
)

// tpmstate0 is the TPM state volume a Secure Boot VM's swtpm keeps its
// TPM 2.0 in: version v2.0 named, as the schema's default is v1.2
// (qemu-server src/PVE/QemuServer/Drive.pm %tpmversion_fmt, master and
// stable-bookworm), which Talos cannot seal with (go-tpm's TPM 2.0
// commands). The size in the volume string is ignored: the create
// allocates TPMSTATE_DISK_SIZE, 4 MiB (src/PVE/API2/Qemu.pm $create_disks;
// stable-bookworm forces the raw format swtpm needs).
func (s VMSpec) tpmstate0() string {
	return s.DiskStorage + ":1,version=v2.0"
}

// reportSecurity compares an existing VM's Secure Boot and TPM with the
// spec's. A missing TPM is reported, never added: adding tpmstate0 is
// additive (a new 4 MiB volume, the disks untouched), but a VM keeps the
// hardware it was created with, and a TPM added under an installed node
// encrypts nothing: Talos encrypts a volume only when it formats it
// (internal/app/machined/pkg/controllers/block/internal/volumes/encrypt.go
// at v1.13.3 refuses a formatted one, "block dev type mismatch"). The
// report names the command that adds it. Secure Boot cannot change under
// an installed node (the Talos docs, secureboot.mdx: no upgrade from a
// GRUB install to UKI/Secure Boot, "a fresh installation is required"):
// a VM whose drives show it was made for the other mode is refused, with
// bootstrap node replace as the way on.
func reportSecurity(s VMSpec, cfg *VMConfig, report, refuse func(field, want, have, why string)) {
	e := cfg.Effective
	onOff := func(on bool) string {
		if on {
			return "on"
		}
		return "off"
	}
	if s.Hardware.TPM && e["tpmstate0"] == "" {
		report("TPM", "on", "off", fmt.Sprintf("add one with qm set %d --tpmstate0 %s (it applies at the VM's next start; Talos encrypts only volumes it has not formatted yet: an installed node needs bootstrap node replace %s for encryption)", s.VMID, s.tpmstate0(), s.Name))
	}
	replace := fmt.Sprintf("Secure Boot cannot be switched under an installed Talos (a fresh install is required): run bootstrap node replace %s", s.Name)
	iso, _, _ := strings.Cut(cfg.CDROM, ",")
	if iso != "" && iso != "none" && iso != "cdrom" {
		sbISO := strings.HasSuffix(iso, "-secureboot.iso")
		if sbISO != s.Hardware.SecureBoot {
			refuse("Secure Boot", onOff(s.Hardware.SecureBoot), onOff(sbISO)+" (its ISO is "+iso+")", replace)
		}
	}
	if s.Hardware.SecureBoot {
		efi := parseDriveString(e["efidisk0"])
		switch {
		case e["efidisk0"] == "":
			refuse("Secure Boot", "on", "off (no EFI disk)", replace)
		case efi.opts["pre-enrolled-keys"] == "1":
			// OVMF then holds Microsoft's keys, not in setup mode: the
			// Sidero-signed boot loader is refused (unverified on a real
			// host, see docs/fidelity.md).
			refuse("Secure Boot", "on", "off (its EFI disk has pre-enrolled Microsoft keys)", replace)
		}
	}
}
