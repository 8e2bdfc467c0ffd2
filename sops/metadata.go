package sops

// A file's sops metadata as the CLI writes and reads it (stores/stores.go
// at getsops/sops v3.11.0): the same keys in the same order, so a file we
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
const Version = "3.11.0"

// unencryptedSuffix is what stays in clear when a file names no rule.
const unencryptedSuffix = "_unencrypted"

type storedAgeKey struct {
	Recipient string `yaml:"recipient"`
	Enc       string `yaml:"enc"`
}

// otherKeys are keys of kinds this tool does not open (KMS, Vault, PGP…).
type otherKeys []map[string]any

type storedGroup struct {
	PGP     otherKeys `yaml:"pgp,omitempty"`
	KMS     otherKeys `yaml:"kms,omitempty"`
	GCPKMS  otherKeys `yaml:"gcp_kms,omitempty"`
	AzureKV otherKeys `yaml:"azure_kv,omitempty"`
	// The CLI writes hc_vault and age in every group, empty or not.
	HCVault otherKeys      `yaml:"hc_vault"`
	Age     []storedAgeKey `yaml:"age"`
}

func (g storedGroup) others() int {
	return len(g.PGP) + len(g.KMS) + len(g.GCPKMS) + len(g.AzureKV) + len(g.HCVault)
}

type storedMetadata struct {
	ShamirThreshold         int            `yaml:"shamir_threshold,omitempty"`
	KeyGroups               []storedGroup  `yaml:"key_groups,omitempty"`
	KMS                     otherKeys      `yaml:"kms,omitempty"`
	GCPKMS                  otherKeys      `yaml:"gcp_kms,omitempty"`
	AzureKV                 otherKeys      `yaml:"azure_kv,omitempty"`
	HCVault                 otherKeys      `yaml:"hc_vault,omitempty"`
	Age                     []storedAgeKey `yaml:"age,omitempty"`
	LastModified            string         `yaml:"lastmodified"`
	MAC                     string         `yaml:"mac"`
	PGP                     otherKeys      `yaml:"pgp,omitempty"`
	UnencryptedSuffix       string         `yaml:"unencrypted_suffix,omitempty"`
	EncryptedSuffix         string         `yaml:"encrypted_suffix,omitempty"`
	UnencryptedRegex        string         `yaml:"unencrypted_regex,omitempty"`
	EncryptedRegex          string         `yaml:"encrypted_regex,omitempty"`
	UnencryptedCommentRegex string         `yaml:"unencrypted_comment_regex,omitempty"`
	EncryptedCommentRegex   string         `yaml:"encrypted_comment_regex,omitempty"`
	MACOnlyEncrypted        bool           `yaml:"mac_only_encrypted,omitempty"`
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
	top := storedGroup{PGP: m.PGP, KMS: m.KMS, GCPKMS: m.GCPKMS, AzureKV: m.AzureKV, HCVault: m.HCVault, Age: m.Age}
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
