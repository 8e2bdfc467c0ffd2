package imagefactory

import (
	"errors"
	"path"
	"strings"
)

// errSecureBootDisabled is the factory's answer for a Secure Boot asset
// when it holds no signing keys: secureboot.ErrDisabled, tagged invalid
// (a 400) by EnhanceFromSchematic (image-factory v1.5.0
// internal/secureboot/secureboot.go, internal/profile/profile.go).
var errSecureBootDisabled = errors.New("error enhancing profile from schematic: secure boot is disabled")

// secureBootAsset refuses a Secure Boot asset (an ISO, disk image or
// installer whose name ends in -secureboot) when the factory has no
// Secure Boot keys; nil otherwise.
func (s *Server) secureBootAsset(file string) error {
	if s.opts.NoSecureBoot && isSecureBoot(file) {
		return errSecureBootDisabled
	}
	return nil
}

// isSecureBoot says whether a factory path names a Secure Boot asset: the
// factory cuts "-secureboot" from <platform>-<arch>[-secureboot] before
// the extension (parsePlatformArch, ParseFromPath), and from an installer
// name (getRequestedImage).
func isSecureBoot(file string) bool {
	base := strings.TrimSuffix(path.Base(file), path.Ext(file))
	return strings.HasSuffix(base, "-secureboot") || strings.HasSuffix(path.Base(file), "-secureboot")
}

// SecureBootISO says whether url is a Secure Boot ISO this factory serves
// (…/image/<id>/<version>/nocloud-amd64-secureboot.iso): what a VM that
// boots it runs is Talos' signed UKI, with the keys its systemd-boot
// enrolls (pkg/imager/iso/uefi.go at Talos v1.13.3).
func (s *Server) SecureBootISO(url string) bool {
	return strings.HasPrefix(url, s.url+"/") && path.Ext(url) == ".iso" && isSecureBoot(url)
}
