package config

import (
	"slices"

	"github.com/homelab/bootstrap/factory"
)

// Images is where the nodes' Talos comes from: the schematic declared in
// cluster.schematic, its ID (computed here, no call), and the ISO and the
// installer derived from it for cluster.talosVersion unless the config
// names them explicitly.
type Images struct {
	Schematic factory.Schematic
	// SchematicID is the schematic's Image Factory ID.
	SchematicID string
	// Factory is the Image Factory base URL.
	Factory string
	// ISOURL, ISOFile and ISOChecksum are the ISO to boot; ISOChecksum is
	// empty unless the config gives one (the factory may publish one).
	ISOURL, ISOFile, ISOChecksum string
	// InstallImage installs and upgrades the nodes.
	InstallImage string
	// ISODerived and InstallerDerived say the ISO URL and the installer
	// come from the schematic (not from proxmox.iso.url, cluster.installImage).
	ISODerived, InstallerDerived bool
	// DiskImageURL and DiskImageFile are the factory's nocloud disk image
	// of the schematic for cluster.talosVersion and its name on Proxmox's
	// import storage; empty when proxmox.iso.url names an ISO of its own
	// (the image of that ISO is not known), which rules proxmox.boot:
	// image out.
	DiskImageURL, DiskImageFile string
	// GuestAgent says the installed image runs the QEMU guest agent, so
	// the VMs get agent: 1. It follows the installer, not the ISO: the ISO
	// runs only until the install, the installer for the VM's life.
	GuestAgent bool
	// SecureBootISOURL, SecureBootISOFile and SecureBootInstaller are the
	// schematic's Secure Boot ISO and installer for cluster.talosVersion,
	// which Secure Boot nodes boot and install (see ISOFileOf,
	// InstallImageOf).
	SecureBootISOURL, SecureBootISOFile, SecureBootInstaller string
}

// Schematic is the declared schematic: the extensions sorted and without
// repeats, so that reordering the list is not a new schematic (which would
// roll every node through an upgrade), kernel arguments as written (their
// order can matter to the kernel).
func (s Schematic) Schematic() factory.Schematic {
	ext := slices.Clone(s.Extensions)
	slices.Sort(ext)
	return factory.New(slices.Compact(ext), s.ExtraKernelArgs)
}

// Images resolves the image sources for the configured Talos version.
func (c *Config) Images() Images {
	cl := c.Cluster
	s := cl.Schematic.Schematic()
	out := Images{Schematic: s, SchematicID: s.MustID(), Factory: cl.Factory}
	if out.Factory == "" {
		out.Factory = factory.DefaultURL
	}
	derived := factory.Images{Factory: out.Factory, ID: out.SchematicID, Version: cl.TalosVersion}
	iso := c.Proxmox.ISO
	out.ISOURL, out.ISOFile, out.ISOChecksum = iso.URL, iso.File, iso.Checksum
	if iso.URL == "" {
		out.ISOURL, out.ISODerived = derived.ISOURL(), true
		out.DiskImageURL, out.DiskImageFile = derived.DiskImageURL(), derived.DiskImageFile()
	}
	if iso.File == "" {
		out.ISOFile = derived.ISOFile()
	}
	out.InstallImage = cl.InstallImage
	if out.InstallImage == "" {
		out.InstallImage, out.InstallerDerived = derived.Installer(), true
	}
	out.SecureBootISOURL, out.SecureBootISOFile, out.SecureBootInstaller = derived.SecureBootISOURL(), derived.SecureBootISOFile(), derived.SecureBootInstaller()
	out.GuestAgent = slices.Contains(s.Extensions(), factory.GuestAgent) && out.installerFromFactory()
	return out
}

// installerFromFactory says whether the installer is an Image Factory
// build, and so carries a schematic's extensions. An explicit factory
// installer of another schematic than cluster.schematic is taken to carry
// the declared one's (config validate warns: its extensions are not known
// without asking the factory). Any other image, such as the stock
// ghcr.io/siderolabs/installer, carries no system extensions: Talos builds
// it with no --system-extension-image (talos v1.13.3 Makefile, target
// installer).
func (im Images) installerFromFactory() bool {
	if im.InstallerDerived {
		return true
	}
	_, ok := factory.ParseInstaller(im.InstallImage)
	return ok
}

// InstallImageFor is the installer for another Talos version (an upgrade):
// the schematic's installer at that version, or the explicit
// cluster.installImage as it stands.
func (c *Config) InstallImageFor(version string) string {
	im := c.Images()
	if !im.InstallerDerived {
		return im.InstallImage
	}
	return factory.Images{Factory: im.Factory, ID: im.SchematicID, Version: version}.Installer()
}
