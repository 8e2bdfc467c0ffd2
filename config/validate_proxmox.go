package config

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
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

// The values of proxmox.vm's on/off fields.
const (
	On  = "on"
	Off = "off"
)

// cpuFlags are the CPU flags Proxmox lets a VM's own config set (qemu-server
// 9.2.6 src/PVE/QemuServer/CPUFlags.pm $supported_vm_specific_cpu_flags_by_arch;
// the same twelve at 8.4.10 src/PVE/QemuServer/CPUConfig.pm
// @supported_cpu_flags): validate_vm_cpu_conf refuses any other
// ("VM-specific CPU flags must be a subset of"). nested-virt came with
// qemu-server 9.0.27 (commit 9e319737), first shipped in Proxmox VE 9.1:
// the precheck refuses it on an older host.
var cpuFlags = []string{"aes", "amd-no-ssb", "amd-ssbd", "hv-evmcs", "hv-tlbflush", "ibpb", "md-clear", "nested-virt", "pcid", "pdpe1gb", "spec-ctrl", "ssbd", "virt-ssbd"}

// cpuFlags checks a cpuFlags list: each +flag or -flag from the set
// Proxmox allows per VM, each flag once.
func (v *validator) cpuFlags(path string, flags []string) {
	seen := map[string]bool{}
	for i, f := range flags {
		name := strings.TrimLeft(f, "+-")
		switch {
		case len(f) < 2 || (f[0] != '+' && f[0] != '-') || len(name) != len(f)-1:
			v.errf(fmt.Sprintf("%s[%d]", path, i), "%q must be +flag to enable or -flag to disable, e.g. +aes", f)
		case !slices.Contains(cpuFlags, name):
			v.errf(fmt.Sprintf("%s[%d]", path, i), "%q is not a flag Proxmox lets a VM set: use one of %s", name, strings.Join(cpuFlags, ", "))
		case seen[name]:
			v.errf(fmt.Sprintf("%s[%d]", path, i), "%s is given twice: keep one", name)
		}
		seen[name] = true
	}
}

// BaselineVM is proxmox.vm's default: the baseline VM of Talos' Proxmox
// guide (the Talos docs at v1.13 and v1.14,
// public/talos/v1.14/platform-specific-installations/virtualized-platforms/proxmox.mdx,
// "VM resource requirements"): OVMF with an EFI disk, q35, VirtIO SCSI
// (not single), write-through cache, ballooning disabled; the optional
// VirtIO RNG left off.
func BaselineVM() VMShape {
	return VMShape{BIOS: "ovmf", Machine: "q35", SCSIHW: "virtio-scsi-pci", Cache: "writethrough", Ballooning: Off, RNG: Off, SecureBoot: Off}
}

// machineRE is qemu-server's machine type pattern (the published API
// schema of POST /nodes/{node}/qemu, machine's type, the same in every
// release from PVE 8.2 to 9.1), without the ARM-only virt types.
var machineRE = regexp.MustCompile(`^(pc|pc(-i440fx)?-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?|q35|pc-q35-\d+(\.\d+)+(\+pve\d+)?(\.pxe)?)$`)

// vmShape checks proxmox.vm, or a node's vm (node true: empty fields
// inherit), against the values offered.
func (v *validator) vmShape(path string, s VMShape, node bool) {
	one := func(field, val string, allowed ...string) {
		if val == "" && node {
			return
		}
		for _, a := range allowed {
			if val == a {
				return
			}
		}
		v.errf(path+"."+field, "%q is not offered: use %s", val, strings.Join(allowed, ", "))
	}
	one("bios", s.BIOS, "ovmf", "seabios")
	one("scsihw", s.SCSIHW, "virtio-scsi-pci", "virtio-scsi-single")
	one("cache", s.Cache, "writethrough", "none", "writeback", "directsync", "unsafe")
	one("ballooning", s.Ballooning, Off, On)
	one("rng", s.RNG, Off, On)
	one("secureBoot", s.SecureBoot, Off, On)
	if s.TPM != "" { // empty: on with Secure Boot (VMShape.TPMOn)
		one("tpm", s.TPM, Off, On)
	}
	if s.CPU != "" {
		one("cpu", s.CPU, cpuTypes...)
	}
	v.cpuFlags(path+".cpuFlags", s.CPUFlags)
	v.vmExtras(path, s, node)
	if s.Machine != "" || !node {
		if !machineRE.MatchString(s.Machine) {
			v.errf(path+".machine", "%q is not an x86 machine type Proxmox knows: use q35, pc, or a versioned type such as pc-q35-9.2+pve1", s.Machine)
		}
	}
}

// VMShapeOf is node n's VM hardware: proxmox.vm, then the fields its
// role's proxmox.roleVM sets, then the fields n.VM sets; the CPU type is
// proxmox.cpu unless one of those sets it.
func (c *Config) VMShapeOf(n Node) VMShape {
	s := c.Proxmox.VM
	s.CPU = cmp.Or(s.CPU, c.Proxmox.CPU)
	role := c.Proxmox.RoleVM.Worker
	if n.Role == RoleControlPlane {
		role = c.Proxmox.RoleVM.ControlPlane
	}
	for _, over := range []VMShape{role, n.VM} {
		for _, f := range []struct {
			dst *string
			src string
		}{
			{&s.BIOS, over.BIOS}, {&s.Machine, over.Machine}, {&s.SCSIHW, over.SCSIHW},
			{&s.Cache, over.Cache}, {&s.Ballooning, over.Ballooning}, {&s.RNG, over.RNG},
			{&s.CPU, over.CPU}, {&s.SecureBoot, over.SecureBoot}, {&s.TPM, over.TPM},
		} {
			if f.src != "" {
				*f.dst = f.src
			}
		}
		// A list set on a narrower level replaces the wider one's: the
		// user writes a node's flags whole, as Proxmox's cpu option holds them.
		if over.CPUFlags != nil {
			s.CPUFlags = over.CPUFlags
		}
		extrasOf(&s, over)
		// pci likewise (pci: [] clears the wider level's devices).
		if over.PCI != nil {
			s.PCI = over.PCI
		}
	}
	return s
}
