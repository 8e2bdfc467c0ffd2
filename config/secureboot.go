package config

import (
	"fmt"
	"strings"

	"github.com/homelab/bootstrap/factory"
)

// The values of cluster.encryption and nodes[].encryption.
const (
	// EncryptionNone leaves STATE and EPHEMERAL unencrypted (Talos'
	// default).
	EncryptionNone = "none"
	// EncryptionTPM encrypts STATE and EPHEMERAL with LUKS2, the key
	// sealed by the node's TPM 2.0.
	EncryptionTPM = "tpm"
)

// SecureBootOn says the VM boots the Secure Boot assets.
func (s VMShape) SecureBootOn() bool { return s.SecureBoot == On }

// TPMOn says the VM has a TPM 2.0: tpm as set, else on exactly when Secure
// Boot is (Talos' Trusted Boot pairs them: the Secure Boot docs seal the
// disk key with the TPM, PCR 7 being the Secure Boot state).
func (s VMShape) TPMOn() bool {
	if s.TPM == "" {
		return s.SecureBootOn()
	}
	return s.TPM == On
}

// EncryptionOf is node n's volume encryption: nodes[].encryption, else
// cluster.encryption, else none.
func (c *Config) EncryptionOf(n Node) string {
	switch {
	case n.Encryption != "":
		return n.Encryption
	case c.Cluster.Encryption != "":
		return c.Cluster.Encryption
	}
	return EncryptionNone
}

// SecureBootNodes are the nodes whose VM boots the Secure Boot assets.
func (c *Config) SecureBootNodes() []Node {
	var out []Node
	for _, n := range c.Nodes {
		if c.VMShapeOf(n).SecureBootOn() {
			out = append(out, n)
		}
	}
	return out
}

// security checks the Secure Boot, TPM and encryption settings of every
// node against what makes them work (run after nodes and proxmox):
//
//   - Secure Boot needs UEFI: OVMF (the Talos Secure Boot docs: "not
//     supported on x86 platforms in BIOS mode").
//   - Secure Boot takes the ISO: the factory builds a Secure Boot disk
//     image for nocloud (image-factory v1.5.0 internal/profile/profile.go
//     ParseFromPath reads nocloud-amd64-secureboot.qcow2), but only the
//     ISO carries the keys systemd-boot enrolls in setup mode (Talos
//     v1.13.3 pkg/imager/iso/uefi.go writes loader/keys/auto into the ISO
//     alone): an imported disk would boot with no keys enrolled, Secure
//     Boot never enforced. proxmox.boot image is refused, auto takes the
//     ISO for these nodes.
//   - Secure Boot takes the schematic's Secure Boot ISO and installer: an
//     explicit proxmox.iso.url or cluster.installImage is a plain one.
//   - encryption tpm needs a TPM, and the Secure Boot assets: Talos seals
//     the key with a policy on the PCR signing key that only a signed UKI
//     carries (internal/pkg/secureboot/tpm2/seal.go reads
//     constants.PCRPublicKey, /.extra/tpm2-pcr-public-key.pem, which
//     systemd-stub extracts from the UKI's .pcrpkey section, added by
//     internal/pkg/uki BuildSigned only, v1.12.0 to v1.14.0-rc.1). Without
//     it every volume fails "failed to read pcr signing public key", so
//     tpm without secureBoot is refused, not warned (that Talos does not
//     check Secure Boot itself, checkSecurebootStatusOnEnroll defaulting
//     to false in pkg/machinery/config/types/block/encryption.go, does
//     not make the seal work).
//
// VolumeConfig with encryption for STATE and EPHEMERAL came with Talos
// v1.12.0 (siderolabs/talos 5f442159b "feat: unify disk encryption
// configuration", first tagged v1.12.0-alpha.0; v1.12.0's
// pkg/machinery/config/types/block/volume_config.go allows both names and
// has the encryption field): the oldest version configs are generated for
// (talosVersions refuses older ones), so no further floor applies.
func (v *validator) security() {
	c := v.c
	switch c.Cluster.Encryption {
	case "", EncryptionNone, EncryptionTPM:
	default:
		v.errf("cluster.encryption", "%q is not offered: use none, tpm", c.Cluster.Encryption)
	}
	for i, n := range c.Nodes {
		p := fmt.Sprintf("nodes[%d]", i)
		switch n.Encryption {
		case "", EncryptionNone, EncryptionTPM:
		default:
			v.errf(p+".encryption", "%q is not offered: use none, tpm", n.Encryption)
			continue
		}
		s := c.VMShapeOf(n)
		// Name the field the user set: the node's, else its role's
		// (proxmox.roleVM), else proxmox.vm's.
		role, roleName := c.Proxmox.RoleVM.Worker, "worker"
		if n.Role == RoleControlPlane {
			role, roleName = c.Proxmox.RoleVM.ControlPlane, "controlplane"
		}
		where := func(nodeVal, field string) string {
			switch {
			case nodeVal != "":
				return p + ".vm." + field
			case field == "secureBoot" && role.SecureBoot != "":
				return "proxmox.roleVM." + roleName + "." + field
			}
			return "proxmox.vm." + field
		}
		if s.SecureBootOn() {
			if s.BIOS != "ovmf" {
				v.errf(where(n.VM.SecureBoot, "secureBoot"), "node %s: Secure Boot needs UEFI firmware, but its bios is %s: set bios ovmf, or secureBoot off", n.Name, s.BIOS)
			}
			if c.Proxmox.Boot == BootImage {
				v.errf(where(n.VM.SecureBoot, "secureBoot"), "node %s: a Secure Boot VM must boot the Secure Boot ISO (the factory's disk image carries no keys to enroll, so Secure Boot would never be enforced), but proxmox.boot is image: set proxmox.boot to auto or iso", n.Name)
			}
			if c.Proxmox.ISO.URL != "" {
				v.errf(where(n.VM.SecureBoot, "secureBoot"), "node %s: a Secure Boot VM boots the factory's Secure Boot ISO of cluster.schematic, but proxmox.iso.url names an ISO of its own: remove proxmox.iso.url", n.Name)
			}
			if c.Cluster.InstallImage != "" {
				v.errf(where(n.VM.SecureBoot, "secureBoot"), "node %s: a Secure Boot node installs the factory's Secure Boot installer of cluster.schematic, but cluster.installImage names an installer of its own: remove cluster.installImage", n.Name)
			}
		}
		if c.EncryptionOf(n) != EncryptionTPM {
			continue
		}
		field := p + ".encryption"
		if n.Encryption == "" {
			field = "cluster.encryption"
		}
		var missing []string
		if !s.TPMOn() {
			missing = append(missing, "a TPM (vm.tpm on)")
		}
		if !s.SecureBootOn() {
			missing = append(missing, "Secure Boot (vm.secureBoot on: Talos seals the key with the PCR signing key only the Secure Boot image carries)")
		}
		if len(missing) > 0 {
			v.errf(field, "node %s: encryption tpm needs %s: turn %s on in nodes[%d].vm, proxmox.roleVM or proxmox.vm, or set encryption none", n.Name, strings.Join(missing, " and "), map[bool]string{true: "it", false: "them"}[len(missing) == 1], i)
		}
	}
}

// ISOFileOf is the ISO a VM boots: the Secure Boot ISO for a Secure Boot
// node, else the cluster's.
func (im Images) ISOFileOf(secureBoot bool) string {
	if secureBoot {
		return im.SecureBootISOFile
	}
	return im.ISOFile
}

// InstallImageOf is the installer node n installs and upgrades with: the
// Secure Boot installer for a Secure Boot node (the plain one would
// install GRUB or an unsigned UKI the enrolled keys refuse), else the
// cluster's.
func (c *Config) InstallImageOf(n Node) string {
	im := c.Images()
	if c.VMShapeOf(n).SecureBootOn() {
		return im.SecureBootInstaller
	}
	return im.InstallImage
}

// InstallImageOfFor is InstallImageOf for another Talos version (an
// upgrade).
func (c *Config) InstallImageOfFor(n Node, version string) string {
	if !c.VMShapeOf(n).SecureBootOn() {
		return c.InstallImageFor(version)
	}
	im := c.Images()
	return factory.Images{Factory: im.Factory, ID: im.SchematicID, Version: version}.SecureBootInstaller()
}
