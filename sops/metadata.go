package sops

// A file's sops metadata as the CLI writes and reads it (stores/stores.go
// and stores/metadata.go at getsops/sops v3.13.2): the same keys in the same order, so a file we
// write diffs cleanly against one `sops updatekeys` rewrites. Only age
// keys are ever opened here; keys of other kinds are read so that the
// rules for where groups come from hold, and are otherwise left alone.

import (
	"errors"
	"fmt"
	"time"

	sopsage "github.com/getsops/sops/v3/age"
)

// Version is the sops version written into files (sops.version), that of
// the library whose format this package follows; a test holds it equal to
// github.com/getsops/sops/v3/version.
const Version = "3.13.2"

// unencryptedSuffix is what stays in clear when a file names no rule.
const unencryptedSuffix = "_unencrypted"

// The metadata is written with its keys in byte order at every level: sops
// v3.13.2 turns it into a map and sorts the keys (stores/metadata.go
// goToSops), where v3.11.0 wrote the struct's field order. Reading does
// not depend on the order.
type storedAgeKey struct {
	Enc       string `yaml:"enc"`
	Recipient string `yaml:"recipient"`
}

// otherKeys are keys of kinds this tool does not open (KMS, Vault, PGP…).
type otherKeys []map[string]any

type storedGroup struct {
	// The CLI writes age and hc_vault in every group, empty or not.
	Age     []storedAgeKey `yaml:"age"`
	AzureKV otherKeys      `yaml:"azure_kv,omitempty"`
	GCPKMS  otherKeys      `yaml:"gcp_kms,omitempty"`
	HCVault otherKeys      `yaml:"hc_vault"`
	HCKMS   otherKeys      `yaml:"hckms,omitempty"`
	KMS     otherKeys      `yaml:"kms,omitempty"`
	PGP     otherKeys      `yaml:"pgp,omitempty"`
}

func (g storedGroup) others() int {
	return len(g.PGP) + len(g.KMS) + len(g.GCPKMS) + len(g.AzureKV) + len(g.HCVault) + len(g.HCKMS)
}

type storedMetadata struct {
	Age                     []storedAgeKey `yaml:"age,omitempty"`
	AzureKV                 otherKeys      `yaml:"azure_kv,omitempty"`
	EncryptedCommentRegex   string         `yaml:"encrypted_comment_regex,omitempty"`
	EncryptedRegex          string         `yaml:"encrypted_regex,omitempty"`
	EncryptedSuffix         string         `yaml:"encrypted_suffix,omitempty"`
	GCPKMS                  otherKeys      `yaml:"gcp_kms,omitempty"`
	HCVault                 otherKeys      `yaml:"hc_vault,omitempty"`
	HCKMS                   otherKeys      `yaml:"hckms,omitempty"`
	KeyGroups               []storedGroup  `yaml:"key_groups,omitempty"`
	KMS                     otherKeys      `yaml:"kms,omitempty"`
	LastModified            string         `yaml:"lastmodified"`
	MAC                     string         `yaml:"mac"`
	MACOnlyEncrypted        bool           `yaml:"mac_only_encrypted,omitempty"`
	PGP                     otherKeys      `yaml:"pgp,omitempty"`
	ShamirThreshold         int            `yaml:"shamir_threshold,omitempty"`
	UnencryptedCommentRegex string         `yaml:"unencrypted_comment_regex,omitempty"`
	UnencryptedRegex        string         `yaml:"unencrypted_regex,omitempty"`
	UnencryptedSuffix       string         `yaml:"unencrypted_suffix,omitempty"`
	Version                 string         `yaml:"version"`
}

// metadata is a file's metadata as this package works with it.
type metadata struct {
	LastModified time.Time
	// At most one of the six rules is set; a file that names none keeps
	// values under keys ending _unencrypted in clear.
	UnencryptedSuffix, EncryptedSuffix             string
	UnencryptedRegex, EncryptedRegex               string
	UnencryptedCommentRegex, EncryptedCommentRegex string
	MAC                                            string
	MACOnlyEncrypted                               bool
	Version                                        string
	// Groups are the key groups' age keys; ShamirThreshold of them open
	// the data key when there are several.
	Groups          [][]*sopsage.MasterKey
	ShamirThreshold int
	// OtherKeys counts keys of kinds this tool does not open.
	OtherKeys int
}

func ageKeys(stored []storedAgeKey) []*sopsage.MasterKey {
	keys := make([]*sopsage.MasterKey, 0, len(stored))
	for _, k := range stored {
		keys = append(keys, &sopsage.MasterKey{Recipient: k.Recipient, EncryptedKey: k.Enc})
	}
	return keys
}

// internal checks what the CLI checks when it reads metadata: a valid
// lastmodified, some key, at most one encryption rule.
func (m *storedMetadata) internal() (metadata, error) {
	last, err := time.Parse(time.RFC3339, m.LastModified)
	if err != nil {
		return metadata{}, fmt.Errorf("sops.lastmodified: %w", err)
	}
	md := metadata{
		LastModified: last, MAC: m.MAC, MACOnlyEncrypted: m.MACOnlyEncrypted, Version: m.Version, ShamirThreshold: m.ShamirThreshold,
		UnencryptedSuffix: m.UnencryptedSuffix, EncryptedSuffix: m.EncryptedSuffix, UnencryptedRegex: m.UnencryptedRegex,
		EncryptedRegex: m.EncryptedRegex, UnencryptedCommentRegex: m.UnencryptedCommentRegex, EncryptedCommentRegex: m.EncryptedCommentRegex,
	}
	// Keys at the top level make one group, and then key_groups is not
	// read (internalKeygroups).
	top := storedGroup{PGP: m.PGP, KMS: m.KMS, GCPKMS: m.GCPKMS, AzureKV: m.AzureKV, HCVault: m.HCVault, HCKMS: m.HCKMS, Age: m.Age}
	switch {
	case top.others() > 0 || len(top.Age) > 0:
		md.Groups, md.OtherKeys = [][]*sopsage.MasterKey{ageKeys(top.Age)}, top.others()
	case len(m.KeyGroups) > 0:
		for _, g := range m.KeyGroups {
			md.Groups = append(md.Groups, ageKeys(g.Age))
			md.OtherKeys += g.others()
		}
	default:
		return metadata{}, errors.New("no keys found in the file")
	}
	switch setCount(md.UnencryptedSuffix, md.EncryptedSuffix, md.UnencryptedRegex, md.EncryptedRegex, md.UnencryptedCommentRegex, md.EncryptedCommentRegex) {
	case 0:
		md.UnencryptedSuffix = unencryptedSuffix
	case 1:
	default:
		return metadata{}, errors.New("the file uses more than one of encrypted_suffix, unencrypted_suffix, encrypted_regex, unencrypted_regex, encrypted_comment_regex and unencrypted_comment_regex")
	}
	return md, nil
}

// setCount is how many of the encryption rules given are set: the CLI
// takes at most one per file and per creation rule.
func setCount(rules ...string) int {
	n := 0
	for _, r := range rules {
		if r != "" {
			n++
		}
	}
	return n
}

// stored is the metadata as it is written: one group at the top level,
// several under key_groups.
func (md metadata) stored() storedMetadata {
	m := storedMetadata{
		ShamirThreshold: md.ShamirThreshold, LastModified: md.LastModified.Format(time.RFC3339), MAC: md.MAC,
		UnencryptedSuffix: md.UnencryptedSuffix, EncryptedSuffix: md.EncryptedSuffix, UnencryptedRegex: md.UnencryptedRegex,
		EncryptedRegex: md.EncryptedRegex, UnencryptedCommentRegex: md.UnencryptedCommentRegex, EncryptedCommentRegex: md.EncryptedCommentRegex,
		MACOnlyEncrypted: md.MACOnlyEncrypted, Version: md.Version,
	}
	toStored := func(keys []*sopsage.MasterKey) []storedAgeKey {
		var out []storedAgeKey
		for _, k := range keys {
			out = append(out, storedAgeKey{Recipient: k.Recipient, Enc: k.EncryptedKey})
		}
		return out
	}
	if len(md.Groups) == 1 {
		m.Age = toStored(md.Groups[0])
		return m
	}
	for _, g := range md.Groups {
		m.KeyGroups = append(m.KeyGroups, storedGroup{Age: toStored(g)})
	}
	return m
}
