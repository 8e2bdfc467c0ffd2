package talos

import (
	"cmp"

	configdoc "github.com/siderolabs/talos/pkg/machinery/config/config"
	"github.com/siderolabs/talos/pkg/machinery/config/types/block"
	blockres "github.com/siderolabs/talos/pkg/machinery/resources/block"
)

// tpmEncryptedVolumes are the VolumeConfig documents that encrypt a node's
// STATE and EPHEMERAL with LUKS2 and one key in slot 0 sealed by the TPM,
// as the Talos docs write them (public/talos/v1.14/platform-specific-
// installations/bare-metal-platforms/secureboot.mdx, "tpm-disk-encryption.yaml";
// the same in v1.12 and v1.13): tpm: {} keeps Talos' defaults (PCR 7
// bound, the signed PCR 11 policy, no Secure Boot check on enroll). Both
// names and the encryption field exist in every generated version
// (pkg/machinery/config/types/block/volume_config.go at v1.12.0).
func tpmEncryptedVolumes() []configdoc.Document {
	var docs []configdoc.Document
	for _, name := range []string{"STATE", "EPHEMERAL"} {
		vc := block.NewVolumeConfigV1Alpha1()
		vc.MetaName = name
		vc.EncryptionSpec = block.EncryptionSpec{
			EncryptionProvider: blockres.EncryptionProviderLUKS2,
			EncryptionKeys:     []block.EncryptionKey{{KeySlot: 0, KeyTPM: &block.EncryptionKeyTPM{}}},
		}
		docs = append(docs, vc)
	}
	return docs
}

// installImageOf is node n's installer: its own (a Secure Boot node's
// Secure Boot installer), else the cluster's.
func (o GenerateOptions) installImageOf(n Node) string {
	return cmp.Or(n.InstallImage, o.InstallImage)
}

// imageOf is the installer node name upgrades with: its own in Images,
// else Image.
func (o RollOutOptions) imageOf(name string) string {
	return cmp.Or(o.Images[name], o.Image)
}
