package talossim

import (
	"context"
	"fmt"
	"strings"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
)

// Firmware is what the node's VM gives the guest for Secure Boot and
// TPM sealing, as the lab reads it from the VM's config.
type Firmware struct {
	// UEFI: OVMF firmware (bios ovmf) with an EFI vars disk.
	UEFI bool
	// PreEnrolledKeys: the EFI disk was created with Microsoft's keys
	// (pre-enrolled-keys=1): not in setup mode, Secure Boot enforced
	// with keys that did not sign Talos.
	PreEnrolledKeys bool
	// TPM2 is a TPM 2.0 (tpmstate0 version v2.0).
	TPM2 bool
	// SecureBootISO: the ISO in the VM's drive is the factory's Secure
	// Boot ISO (signed systemd-boot and UKI, the keys to enroll).
	SecureBootISO bool
}

// secureBootImage says whether an installer reference is a Secure Boot
// installer: the image name (the path's second element, also in a
// digest-pinned reference) ends in installer-secureboot, the names the
// factory's registry reads as Secure Boot (getRequestedImage,
// image-factory v1.5.0 internal/frontend/http/registry.go).
func secureBootImage(image string) bool {
	parts := strings.Split(image, "/")
	return len(parts) >= 3 && strings.HasSuffix(parts[1], "installer-secureboot")
}

// labPCRSigningKeyFingerprint stands for the fingerprint of the PCR
// signing key a signed UKI carries (the lab's factory signs nothing).
const labPCRSigningKeyFingerprint = "lab-factory-pcr-signing-key"

// bootsSigned says whether this boot runs a signed UKI: the Secure Boot
// ISO in maintenance, a Secure Boot installer's system once installed.
func (n *Node) bootsSigned(installed installedSystem) bool {
	if installed.config != nil || installed.fromImage {
		return installed.secureBoot
	}
	return n.spec.Firmware.SecureBootISO
}

// firmwareRefusalLocked is why the VM's firmware never starts Talos this
// boot ("" when it does). A Sidero-signed boot loader under Microsoft's
// pre-enrolled keys is refused: the Talos docs (secureboot.mdx) have the
// firmware enroll Sidero Labs' key in setup mode and Talos' Proxmox guide
// creates the EFI disk without pre-enrolled keys for that reason; what
// OVMF shows then is unverified here (the node never answers). An
// unsigned system once the Secure Boot ISO has enrolled its keys fails
// the same way (an install with the plain installer after a Secure Boot
// ISO; unverified likewise). The plain ISO under pre-enrolled keys is not
// modelled.
func (n *Node) firmwareRefusalLocked(installed installedSystem) string {
	fw := n.spec.Firmware
	signed := n.bootsSigned(installed)
	switch {
	case signed && fw.UEFI && fw.PreEnrolledKeys:
		return "the firmware's pre-enrolled Microsoft keys refuse the Sidero Labs-signed boot loader"
	case !signed && fw.UEFI && n.sim.keysEnrolled(n.ip):
		return "Secure Boot is enforced with the enrolled Sidero Labs keys and the installed boot loader is unsigned"
	}
	return ""
}

// publishSecurityStateLocked sets the SecurityState resource (runtime
// namespace, ID securitystate) as machined's SecurityStateController
// does once per boot (internal/app/machined/pkg/controllers/runtime/
// security_state.go at v1.13.3; the resource in
// pkg/machinery/resources/runtime/security_status.go): secureBoot when
// the firmware reports Secure Boot on and not in setup mode, which after
// the Secure Boot ISO's systemd-boot enrolled its keys (if-safe under
// virtualization, pkg/imager/profile/default.go) holds for every signed
// boot of the VM; bootedWithUKI from systemd-boot's LoaderEntryDefault or
// StubImageIdentifier naming a Talos- UKI; the PCR signing key's
// fingerprint from the UKI's /.extra/tpm2-pcr-public-key.pem, which only
// a signed UKI carries (internal/pkg/uki BuildSigned). A plain boot's
// bootedWithUKI (amd64's sd-boot under UEFI from 1.10) is unverified and
// published false. The UKI signing key's fingerprint is not set by that
// controller.
func (n *Node) publishSecurityStateLocked(installed installedSystem) {
	fw := n.spec.Firmware
	signed := n.bootsSigned(installed)
	if signed && fw.UEFI && !fw.PreEnrolledKeys {
		// systemd-boot enrolls the ISO's keys in setup mode and resets.
		n.sim.enrollKeys(n.ip)
	}
	_ = safe.StateModify(context.Background(), n.cosi, runtime.NewSecurityStateSpec(runtime.NamespaceName), func(s *runtime.SecurityState) error {
		s.TypedSpec().SecureBoot = signed && fw.UEFI && n.sim.keysEnrolled(n.ip)
		s.TypedSpec().BootedWithUKI = signed
		s.TypedSpec().PCRSigningKeyFingerprint = ""
		if signed {
			s.TypedSpec().PCRSigningKeyFingerprint = labPCRSigningKeyFingerprint
		}
		return nil
	})
}

// SecureBoot is what the node's SecurityState says of Secure Boot.
func (n *Node) SecureBoot() bool {
	ss, err := safe.StateGetByID[*runtime.SecurityState](context.Background(), n.cosi, runtime.SecurityStateID)
	return err == nil && ss.TypedSpec().SecureBoot
}

// EncryptionOf is the encryption provider of the node's volume (STATE,
// EPHEMERAL) as its VolumeStatus says, and its error message.
func (n *Node) EncryptionOf(volume string) (provider, errMsg string) {
	vs, err := safe.StateGetByID[*block.VolumeStatus](context.Background(), n.cosi, volume)
	if err != nil {
		return "", ""
	}
	return vs.TypedSpec().EncryptionProvider.String(), vs.TypedSpec().ErrorMessage
}

// encryptedVolumes are the system volumes a config encrypts, by name,
// and whether with a TPM key.
func encryptedVolumes(cfg config.Provider) map[string]bool {
	out := map[string]bool{}
	if cfg == nil || cfg.Volumes() == nil {
		return out
	}
	for _, name := range []string{"STATE", "EPHEMERAL"} {
		vc, ok := cfg.Volumes().ByName(name)
		if !ok || vc.Encryption() == nil || vc.Encryption().Provider() != block.EncryptionProviderLUKS2 {
			continue
		}
		tpm := false
		for _, k := range vc.Encryption().Keys() {
			if k.TPM() != nil {
				tpm = true
			}
		}
		out[name] = tpm
	}
	return out
}

// tpmSealError is why Talos cannot seal a volume's key with the TPM on
// this boot ("" when it can). tpm2.Seal (internal/pkg/secureboot/tpm2/
// seal.go at v1.13.3) opens /dev/tpmrm0, then /dev/tpm0 (internal/pkg/tpm/
// tpm_linux.go): without a TPM the open fails; it then needs the PCR
// signing public key only a signed UKI carries (constants.PCRPublicKey,
// read by ParsePCRSigningPubKey in keys.go). The key handler's error is
// gathered by tryHandlers with multierror and wrapped by
// HandleEncryptionWithHandler (internal/pkg/encryption/encryption.go,
// internal/app/machined/pkg/controllers/block/internal/volumes/
// encrypt.go); the open's own wording is the OS's.
func (n *Node) tpmSealError(installed installedSystem) string {
	var cause string
	switch {
	case !n.spec.Firmware.TPM2:
		cause = "open /dev/tpm0: no such file or directory"
	case !n.bootsSigned(installed):
		cause = "failed to calculate sealing policy digest: failed to read pcr signing public key: open /.extra/tpm2-pcr-public-key.pem: no such file or directory"
	default:
		return ""
	}
	return "error formatting and encrypting volume: 1 error occurred:\n\t* " + cause + "\n\n"
}

// publishVolumesLocked sets the STATE and EPHEMERAL VolumeStatus
// encryption of a configured boot from the config's VolumeConfig
// documents: provider luks2 once the TPM sealed the key, or phase failed
// with the error, as the volume manager records a failed
// HandleEncryption (volume_manager.go: PreFailPhase, Phase failed,
// ErrorMessage). It returns the failure ("" when none): the boot goes no
// further without STATE (what apid does meanwhile is unverified; it
// answers, as for a disk too small for EPHEMERAL).
func (n *Node) publishVolumesLocked(installed installedSystem) string {
	want := encryptedVolumes(n.parsed)
	failure := ""
	for _, name := range []string{"STATE", "EPHEMERAL"} {
		tpm, encrypted := want[name]
		msg := ""
		if encrypted && tpm {
			msg = n.tpmSealError(installed)
		}
		_ = safe.StateModify(context.Background(), n.cosi, block.NewVolumeStatus(block.NamespaceName, name), func(v *block.VolumeStatus) error {
			s := v.TypedSpec()
			s.ErrorMessage = msg
			switch {
			case msg != "":
				s.PreFailPhase, s.Phase = block.VolumePhaseProvisioned, block.VolumePhaseFailed
				s.EncryptionProvider = block.EncryptionProviderNone
			case encrypted:
				s.Phase = block.VolumePhaseReady
				s.EncryptionProvider = block.EncryptionProviderLUKS2
			default:
				s.Phase = block.VolumePhaseReady
				s.EncryptionProvider = block.EncryptionProviderNone
			}
			return nil
		})
		if msg != "" && failure == "" {
			failure = fmt.Sprintf("volume %s failed: %s", name, strings.TrimSpace(msg))
		}
	}
	return failure
}

// keysEnrolled says whether the VM at ip has Sidero Labs' Secure Boot
// keys in its EFI vars; enrollKeys records that the Secure Boot ISO
// enrolled them. The EFI disk goes with the VM: WipeDisk (a destroyed
// VM) forgets them.
func (s *Sim) keysEnrolled(ip string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.installed[ip].keysEnrolled
}

func (s *Sim) enrollKeys(ip string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sys := s.installed[ip]
	sys.keysEnrolled = true
	s.installed[ip] = sys
}
