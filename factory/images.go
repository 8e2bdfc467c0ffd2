package factory

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/blang/semver/v4"
	"github.com/siderolabs/talos/pkg/machinery/imager/quirks"
)

// DefaultURL is the public Image Factory.
const DefaultURL = "https://factory.talos.dev"

// Platform and architecture of the images this tool asks for: Proxmox VMs
// boot Talos' nocloud image (cloud-init for the static address) on amd64.
const (
	Platform = "nocloud"
	Arch     = "amd64"
)

// Images are the artifacts the factory builds from one schematic for one
// Talos version.
type Images struct {
	// Factory is the factory's base URL, e.g. https://factory.talos.dev.
	Factory string
	// ID is the schematic ID.
	ID string
	// Version is the Talos version, e.g. v1.13.3.
	Version string
}

func (i Images) base() string { return strings.TrimSuffix(i.Factory, "/") }

// ISOURL is the nocloud ISO's download URL: GET
// /image/:schematic/:version/:path with path <platform>-<arch>.iso
// (internal/frontend/http/http.go and image.go at image-factory v1.5.0).
func (i Images) ISOURL() string {
	return fmt.Sprintf("%s/image/%s/%s/%s-%s.iso", i.base(), i.ID, i.Version, Platform, Arch)
}

// ISOFile is the name the ISO is stored under on Proxmox. It carries the
// schematic ID's first 12 hex digits so that another schematic is another
// file (a file that exists is never downloaded again).
func (i Images) ISOFile() string {
	return fmt.Sprintf("talos-%s-%s-%s-%s.iso", i.Version, ShortID(i.ID), Platform, Arch)
}

// DiskImageURL is the nocloud disk image's download URL: the same route
// as the ISO with path <platform>-<arch>.qcow2, which the factory parses as
// a disk image in qcow2 format (ParseFromPath in internal/profile/profile.go
// at image-factory v1.5.0) of the platform's default size (talos
// pkg/imager/profile/default.go: nocloud is MinRAWDiskSize; the imager
// then enlarges it, see DiskImageBytes). A qcow2 file holds only the clusters written, so it is a smaller download
// than the .raw of the same image; Proxmox imports it as it is (download-url
// decompresses ISOs only, and a .raw.xz is no name it accepts for import).
func (i Images) DiskImageURL() string {
	return fmt.Sprintf("%s/image/%s/%s/%s-%s.qcow2", i.base(), i.ID, i.Version, Platform, Arch)
}

// DiskImageFile is the name the disk image is stored under on Proxmox's
// import content, named like ISOFile (download-url keeps names of
// [a-zA-Z0-9_.-] ending in .qcow2 as they are).
func (i Images) DiskImageFile() string {
	return fmt.Sprintf("talos-%s-%s-%s-%s.qcow2", i.Version, ShortID(i.ID), Platform, Arch)
}

// DiskImageBytes is the nocloud amd64 disk image's virtual size for a
// Talos version: the disk a VM imports it to has this size until it is
// grown. ParseFromPath (image-factory v1.5.0 internal/profile/profile.go)
// starts from MinRAWDiskSize, 1246 MiB, and the imager's FillDefaults
// (talos pkg/imager/profile/output.go) adds to it: a larger GRUB boot
// partition from Talos 1.11 on, and the dual-boot loader's partitions from
// 1.10 on, amd64's default without secure boot. Talos' own expected
// profiles at v1.13.3 and v1.14.0-rc.1 (pkg/imager/profile/testdata/
// nocloud-amd64-*.yaml, diskSize) give 1246 MiB for 1.9, 2247 MiB for 1.10
// and 4247 MiB for 1.11 to 1.14 (earlier versions: 1.9's, unverified); a
// version that does not parse gets the newest.
func DiskImageBytes(version string) int64 {
	v, err := semver.ParseTolerant(strings.TrimPrefix(version, "v"))
	switch {
	case err != nil || v.Major > 1 || v.Minor >= 11:
		return 4247 << 20
	case v.Minor == 10:
		return 2247 << 20
	}
	return 1246 << 20
}

// Installer is the installer image for a nocloud node, as the factory's UI
// names it (internal/frontend/http/ui.go at image-factory v1.5.0): from
// Talos 1.10 on, which unified the installer (machinery
// imager/quirks SupportsUnifiedInstaller), the platform's own
// <host>/nocloud-installer/<id>:<version>; before, <host>/installer/<id>:<version>.
// The factory's registry serves both names (registry.go getRequestedImage).
func (i Images) Installer() string {
	host := i.Factory
	if u, err := url.Parse(i.Factory); err == nil && u.Host != "" {
		host = u.Host
	}
	name := "installer"
	if quirks.New(i.Version).SupportsUnifiedInstaller() {
		name = Platform + "-installer"
	}
	return fmt.Sprintf("%s/%s/%s:%s", host, name, i.ID, i.Version)
}

// ShortID is the first 12 hex digits of a schematic ID, for names and
// messages.
func ShortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// InstallerRef is an installer image reference taken apart: the registry
// host, the image name (installer, nocloud-installer, …), the schematic
// ID and the Talos version.
type InstallerRef struct {
	Host, Name, ID, Version string
}

// ParseInstaller reads a factory installer reference
// (<host>/[<platform>-]installer[-secureboot]/<id>:<version>, the names the
// factory's registry accepts); ok is false for anything else, such as
// ghcr.io/siderolabs/installer:v1.13.3.
func ParseInstaller(image string) (InstallerRef, bool) {
	image, _, _ = strings.Cut(image, "@")
	parts := strings.Split(image, "/")
	if len(parts) != 3 {
		return InstallerRef{}, false
	}
	name := parts[1]
	if name != "installer" && name != "installer-secureboot" && !strings.HasSuffix(name, "-installer") && !strings.HasSuffix(name, "-installer-secureboot") {
		return InstallerRef{}, false
	}
	id, version, ok := strings.Cut(parts[2], ":")
	if !ok || !isID(id) || version == "" {
		return InstallerRef{}, false
	}
	return InstallerRef{Host: parts[0], Name: name, ID: id, Version: version}, true
}

// ParseISOURL reads a factory image URL (…/image/<id>/<version>/<file>);
// ok is false for any other URL.
func ParseISOURL(raw string) (id, version string, ok bool) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", false
	}
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	n := len(parts)
	if n < 4 || parts[n-4] != "image" || !isID(parts[n-3]) {
		return "", "", false
	}
	return parts[n-3], parts[n-2], true
}

func isID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, r := range s {
		if !strings.ContainsRune("0123456789abcdef", r) {
			return false
		}
	}
	return true
}
