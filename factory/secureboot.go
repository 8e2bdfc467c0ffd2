package factory

import (
	"fmt"
	"strings"
)

// The Secure Boot assets of a schematic. The factory builds them only
// where it holds Secure Boot signing keys (profile.EnhanceFromSchematic
// fails with secureboot.ErrDisabled otherwise, image-factory v1.5.0
// internal/profile/profile.go); the public factory signs with Sidero
// Labs' key (the Talos docs, bare-metal-platforms/secureboot.mdx).

// SecureBootISOURL is the nocloud Secure Boot ISO's download URL: the ISO
// route with path <platform>-<arch>-secureboot.iso, which the factory
// parses as an ISO with SecureBoot set (parsePlatformArch cuts the
// -secureboot suffix, image-factory v1.5.0 internal/profile/profile.go;
// the name is Talos' Platform.SecureBootISOPath, machinery
// platforms/platforms.go at v1.13.3, nocloud SecureBootSupported). Its
// systemd-boot enrolls the keys it carries into firmware in setup mode
// under virtualization (secure-boot-enroll if-safe, the imager's default,
// pkg/imager/profile/default.go at v1.13.3).
func (i Images) SecureBootISOURL() string {
	return fmt.Sprintf("%s/image/%s/%s/%s-%s-secureboot.iso", i.base(), i.ID, i.Version, Platform, Arch)
}

// SecureBootISOFile is the name the Secure Boot ISO is stored under on
// Proxmox: ISOFile's with -secureboot before the extension.
func (i Images) SecureBootISOFile() string {
	return strings.TrimSuffix(i.ISOFile(), ".iso") + "-secureboot.iso"
}

// SecureBootInstaller is the Secure Boot installer image for a nocloud
// node: Installer's name with -secureboot, the names the factory's
// registry reads as Secure Boot (getRequestedImage cuts
// "-installer-secureboot" first, and takes "installer-secureboot" before
// the unified installer, internal/frontend/http/registry.go at
// image-factory v1.5.0), e.g.
// factory.talos.dev/nocloud-installer-secureboot/<id>:v1.13.3.
func (i Images) SecureBootInstaller() string {
	plain := i.Installer()
	host, rest, _ := strings.Cut(plain, "/")
	name, ref, _ := strings.Cut(rest, "/")
	return host + "/" + name + "-secureboot/" + ref
}

// IsSecureBootInstaller says whether image is a factory Secure Boot
// installer (installer-secureboot or <platform>-installer-secureboot).
func IsSecureBootInstaller(image string) bool {
	ref, ok := ParseInstaller(image)
	return ok && strings.HasSuffix(ref.Name, "installer-secureboot")
}
