package config

import (
	"regexp"
	"strings"
)

// unsafeFilenameChar is what download-url replaces with '_' in the file
// name it stores (normalize_content_filename in pve-storage
// src/PVE/Storage.pm at 9.1.7, which also drops any directory part).
var unsafeFilenameChar = regexp.MustCompile(`[^a-zA-Z0-9_.-]`)

// isoExt is download-url's check for content iso: a name ending in .iso or
// .img, any case ($ISO_EXT_RE_0 in src/PVE/Storage.pm).
var isoExt = regexp.MustCompile(`(?i)^[^/]+\.(iso|img)$`)

// isoFile checks proxmox.iso.file against Proxmox's own rules: PVE would
// store the download under another name (so the next run would not find it
// and download again, failing with "refusing to override existing file"),
// or refuse the extension.
func (v *validator) isoFile(file string) {
	switch {
	case strings.ContainsAny(file, `/\`):
		v.errf("proxmox.iso.file", "%q must be a file name without a directory: Proxmox stores downloads under the base name only", file)
	case unsafeFilenameChar.MatchString(file):
		v.errf("proxmox.iso.file", "%q has characters Proxmox replaces with '_' when it stores a download (only letters, digits, '_', '.' and '-' stay): use %q", file, unsafeFilenameChar.ReplaceAllString(file, "_"))
	case !isoExt.MatchString(file):
		v.errf("proxmox.iso.file", "%q must end in .iso or .img (Proxmox refuses other names for ISO downloads)", file)
	}
}

// The boot modes of proxmox.boot.
const (
	// BootAuto takes the disk image where the host allows it, else the ISO.
	BootAuto = "auto"
	// BootImage imports the factory's disk image as each new VM's disk, or
	// refuses the run naming why it cannot.
	BootImage = "image"
	// BootISO boots the ISO and installs Talos to the disk.
	BootISO = "iso"
)

// CPUHost is proxmox.cpu's default: the host's own CPU.
const CPUHost = "host"

// cpuTypes are the CPU types proxmox.cpu offers: host, and qemu-server's
// built-in generic x86-64 levels (qemu-server 9.2.6
// src/PVE/QemuServer/CPUConfig.pm $builtin_models_by_arch; x86-64-v2-AES
// is the Proxmox GUI's default for new VMs). QEMU's named models and
// custom ones are not offered.
var cpuTypes = []string{CPUHost, "x86-64-v2", "x86-64-v2-AES", "x86-64-v3", "x86-64-v4"}

// cpu checks proxmox.cpu against the offered types.
func (v *validator) cpu(cpu string) {
	for _, t := range cpuTypes {
		if cpu == t {
			return
		}
	}
	v.errf("proxmox.cpu", "%q is not a CPU type this tool offers: use %s", cpu, strings.Join(cpuTypes, ", "))
}

// boot checks proxmox.boot: one of the modes, and image only where the
// config lets the run know the image (an explicit proxmox.iso.url names an
// ISO whose disk image is unknown).
func (v *validator) boot(p Proxmox) {
	switch p.Boot {
	case BootAuto, BootISO:
	case BootImage:
		if p.ISO.URL != "" {
			v.errf("proxmox.boot", "image boots the Image Factory's disk image of cluster.schematic, but proxmox.iso.url names an ISO of its own (its disk image is not known): remove proxmox.iso.url, or set proxmox.boot to iso")
		}
	default:
		v.errf("proxmox.boot", "%q must be auto, image or iso", p.Boot)
	}
}
