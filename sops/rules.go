package sops

// .sops.yaml creation rules, read as the sops CLI reads them (config/
// config.go at getsops/sops v3.13.2: LookupConfigFile, creationRule,
// keyGroup, parseCreationRuleForFile), for the age keys only.

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	sopsage "github.com/getsops/sops/v3/age"
	"go.yaml.in/yaml/v3"
)

// configFileName is the file looked for, at most configSearchDepth levels
// up. The CLI starts from its working directory (cmd/sops/main.go
// findConfigFile calls config.LookupConfigFile(".") at v3.13.2); this
// tool starts from the encrypted file's directory, which the CLI agrees
// with when it runs there, or when no .sops.yaml sits between the file
// and the directory it runs in. A nested .sops.yaml nearer the file than
// where `sops updatekeys` runs is where the two differ (docs/fidelity.md).
const (
	configFileName    = ".sops.yaml"
	configSearchDepth = 100
)

// keyList is a list of keys written as a list or as one comma-separated
// string, as the CLI accepts both.
type keyList []string

func (l *keyList) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		var s string
		if err := n.Decode(&s); err != nil {
			return err
		}
		*l = nil
		for _, k := range strings.Split(s, ",") {
			if k = strings.TrimSpace(k); k != "" {
				*l = append(*l, k)
			}
		}
		return nil
	case yaml.SequenceNode:
		var s []string
		if err := n.Decode(&s); err != nil {
			return err
		}
		*l = s
		return nil
	}
	return fmt.Errorf("line %d: expected a key or a list of keys", n.Line)
}

type ruleGroup struct {
	Merge   []ruleGroup `yaml:"merge"`
	Age     []string    `yaml:"age"`
	PGP     []string    `yaml:"pgp"`
	KMS     []yaml.Node `yaml:"kms"`
	GCPKMS  []yaml.Node `yaml:"gcp_kms"`
	AzureKV []yaml.Node `yaml:"azure_keyvault"`
	Vault   []string    `yaml:"hc_vault"`
}

type creationRule struct {
	PathRegex               string      `yaml:"path_regex"`
	Age                     keyList     `yaml:"age"`
	PGP                     keyList     `yaml:"pgp"`
	KMS                     keyList     `yaml:"kms"`
	GCPKMS                  keyList     `yaml:"gcp_kms"`
	AzureKeyVault           keyList     `yaml:"azure_keyvault"`
	VaultURI                keyList     `yaml:"hc_vault_transit_uri"`
	KeyGroups               []ruleGroup `yaml:"key_groups"`
	ShamirThreshold         int         `yaml:"shamir_threshold"`
	UnencryptedSuffix       string      `yaml:"unencrypted_suffix"`
	EncryptedSuffix         string      `yaml:"encrypted_suffix"`
	UnencryptedRegex        string      `yaml:"unencrypted_regex"`
	EncryptedRegex          string      `yaml:"encrypted_regex"`
	UnencryptedCommentRegex string      `yaml:"unencrypted_comment_regex"`
	EncryptedCommentRegex   string      `yaml:"encrypted_comment_regex"`
	MACOnlyEncrypted        bool        `yaml:"mac_only_encrypted"`
}

// otherKind names the first kind of key other than age the rule or
// group asks for, or "".
func otherKind(kinds map[string]int) string {
	for _, k := range []string{"pgp", "kms", "gcp_kms", "azure_keyvault", "hc_vault"} {
		if kinds[k] > 0 {
			return k
		}
	}
	return ""
}

// recipients returns the group's age recipients (merged groups first, as
// the CLI orders them), without repeats, or the kind of another key in it.
func (g ruleGroup) recipients() ([]string, string) {
	var out []string
	for _, m := range g.Merge {
		rs, other := m.recipients()
		if other != "" {
			return nil, other
		}
		out = append(out, rs...)
	}
	if other := otherKind(map[string]int{"pgp": len(g.PGP), "kms": len(g.KMS), "gcp_kms": len(g.GCPKMS), "azure_keyvault": len(g.AzureKV), "hc_vault": len(g.Vault)}); other != "" {
		return nil, other
	}
	return append(out, g.Age...), ""
}

// findConfig is the .sops.yaml the CLI would use for file (an absolute
// path), or "".
func findConfig(file string) string {
	dir := path.Dir(filepath.ToSlash(file))
	for range configSearchDepth {
		p := path.Join(dir, configFileName)
		if _, err := os.Stat(filepath.FromSlash(p)); err == nil {
			return filepath.FromSlash(p)
		}
		dir = path.Join(dir, "..")
	}
	return ""
}

// ruleFor finds the creation rule of the config at conf for file: the
// first whose path_regex matches the file's path relative to the config's
// directory, or that has no path_regex.
func ruleFor(conf, file string) (*creationRule, error) {
	data, err := os.ReadFile(conf)
	if err != nil {
		return nil, err
	}
	var parsed struct {
		CreationRules []creationRule `yaml:"creation_rules"`
	}
	if err := yaml.Unmarshal(data, &parsed); err != nil {
		return nil, fmt.Errorf("reading the config: %w", err)
	}
	dir, err := filepath.Abs(filepath.Dir(conf))
	if err != nil {
		return nil, err
	}
	rel := strings.TrimPrefix(file, dir+string(filepath.Separator))
	for i, r := range parsed.CreationRules {
		if r.PathRegex == "" {
			return &parsed.CreationRules[i], nil
		}
		re, err := regexp.Compile(r.PathRegex)
		if err != nil {
			return nil, fmt.Errorf("path_regex %q: %w", r.PathRegex, err)
		}
		if re.MatchString(rel) {
			return &parsed.CreationRules[i], nil
		}
	}
	return nil, nil
}

// options turns a rule into what Encrypt takes, refusing what this tool
// cannot honour: keys other than age, and choosing values by comment.
func (r *creationRule) options(conf, file string) (EncryptOptions, error) {
	o := EncryptOptions{ShamirThreshold: r.ShamirThreshold, EncryptedRegex: r.EncryptedRegex, UnencryptedRegex: r.UnencryptedRegex,
		EncryptedSuffix: r.EncryptedSuffix, UnencryptedSuffix: r.UnencryptedSuffix, MACOnlyEncrypted: r.MACOnlyEncrypted}
	if setCount(r.UnencryptedSuffix, r.EncryptedSuffix, r.UnencryptedRegex, r.EncryptedRegex, r.UnencryptedCommentRegex, r.EncryptedCommentRegex) > 1 {
		return o, fmt.Errorf("sops: %s: the creation rule for %s uses more than one of encrypted_suffix, unencrypted_suffix, encrypted_regex, unencrypted_regex, encrypted_comment_regex and unencrypted_comment_regex", conf, file)
	}
	if r.EncryptedCommentRegex != "" || r.UnencryptedCommentRegex != "" {
		return o, fmt.Errorf("sops: %s: the creation rule for %s chooses values by comment (encrypted_comment_regex), which this tool does not write: use encrypted_regex for it", conf, file)
	}
	groups := r.KeyGroups
	if len(groups) == 0 {
		other := otherKind(map[string]int{"pgp": len(r.PGP), "kms": len(r.KMS), "gcp_kms": len(r.GCPKMS), "azure_keyvault": len(r.AzureKeyVault), "hc_vault": len(r.VaultURI)})
		if other != "" {
			return o, nonAge(conf, file, other)
		}
		groups = []ruleGroup{{Age: r.Age}}
	}
	for _, g := range groups {
		rs, other := g.recipients()
		if other != "" {
			return o, nonAge(conf, file, other)
		}
		var unique []string
		seen := map[string]bool{}
		for _, rec := range rs {
			keys, err := sopsage.MasterKeysFromRecipients(rec)
			if err != nil {
				return o, fmt.Errorf("sops: %s: the creation rule for %s: %w", conf, file, err)
			}
			for _, k := range keys {
				if !seen[k.Recipient] {
					seen[k.Recipient] = true
					unique = append(unique, k.Recipient)
				}
			}
		}
		if len(unique) > 0 {
			o.Groups = append(o.Groups, unique)
		}
	}
	if len(o.Groups) == 0 {
		return o, fmt.Errorf("sops: %s: the creation rule for %s names no age recipient", conf, file)
	}
	return o, nil
}

func nonAge(conf, file, kind string) error {
	return fmt.Errorf("sops: %s: the creation rule for %s names a %s key; this tool encrypts and decrypts with age only: give the file a rule of age recipients (path_regex)", conf, file, kind)
}
