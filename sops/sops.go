// Package sops encrypts and decrypts YAML files in the SOPS format with age
// keys, so what it writes is what the `sops` CLI reads and writes: the
// cluster's Talos secrets bundle at rest, and the Secrets Flux's
// kustomize-controller decrypts. The format (tree.go, cipher.go,
// metadata.go, rules.go) follows getsops/sops v3.13.2, the sops
// kustomize-controller v1.9.5 is built on (its go.mod, with filippo.io/age
// v1.3.1), and the data key is
// wrapped by that library's age package and split by its shamir package;
// the library's document and YAML store packages are not linked, because
// they import the key services of every cloud KMS and Vault. Tests hold
// both directions against the library itself and the `sops` CLI.
//
// Decryption takes the age identities explicitly (Identities) instead of
// letting the library search the environment on its own, so the caller
// says which file decrypts and a wrong key is an error naming it.
package sops

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"filippo.io/age"
	sopsage "github.com/getsops/sops/v3/age"
	"github.com/getsops/sops/v3/shamir"
	"github.com/google/shlex"
	"go.yaml.in/yaml/v3"
)

// The environment and file the sops CLI reads age identities from, all of
// them together (age/keysource.go loadIdentities at getsops/sops v3.13.2).
const (
	KeyFileEnv     = sopsage.SopsAgeKeyFileEnv
	KeyEnv         = sopsage.SopsAgeKeyEnv
	KeyCmdEnv      = sopsage.SopsAgeKeyCmdEnv
	UserConfigPath = sopsage.SopsAgeKeyUserConfigPath
	// RecipientEnv is set for KeyCmdEnv's command (and SSHKeyCmdEnv's) to
	// the recipient whose identity is wanted: sops v3.13.2 runs the
	// command for each age key of the file it decrypts.
	RecipientEnv = sopsage.SopsAgeRecipientEnv
	// SSHKeyFileEnv and SSHKeyCmdEnv name SSH private keys the sops CLI
	// also decrypts with (besides ~/.ssh/id_ed25519 and id_rsa). They are
	// not taken here: kustomize-controller v1.9.5 imports only age
	// identities from sops-age (internal/decryptor/decryptor.go, through
	// ParsedIdentities.Import), so an SSH key could not decrypt in the
	// cluster.
	SSHKeyFileEnv = sopsage.SopsAgeSshPrivateKeyFileEnv
	SSHKeyCmdEnv  = sopsage.SopsAgeSshPrivateKeyCmdEnv
)

// EncryptOptions say what Encrypt encrypts and to whom.
type EncryptOptions struct {
	// Recipients are age public keys (age1…); any one of their identities
	// decrypts.
	Recipients []string
	// EncryptedRegex, when set, limits encryption to the keys it matches
	// (as .sops.yaml's encrypted_regex; "^(data|stringData)$" for a
	// Kubernetes Secret keeps its kind and name readable). Empty encrypts
	// every value.
	EncryptedRegex string
	// Now stamps the file (sops.lastmodified, which the MAC is bound to).
	Now time.Time
	// Groups, when set, replace Recipients: one key group per entry, the
	// data key split among them with Shamir's secret sharing so that any
	// ShamirThreshold groups (all when 0) decrypt, as .sops.yaml's
	// key_groups and shamir_threshold make the sops CLI do.
	Groups          [][]string
	ShamirThreshold int
	// UnencryptedRegex, EncryptedSuffix and UnencryptedSuffix are
	// .sops.yaml's other ways to choose what is encrypted (at most one of
	// the four is set; none: every value but those ending _unencrypted).
	UnencryptedRegex, EncryptedSuffix, UnencryptedSuffix string
	// MACOnlyEncrypted binds the MAC to the encrypted values only.
	MACOnlyEncrypted bool
}

// IsEncrypted says whether a YAML document carries SOPS metadata (a
// top-level sops mapping with a MAC), as the sops CLI checks before
// refusing to encrypt twice.
func IsEncrypted(data []byte) bool {
	var doc struct {
		Sops *struct {
			MAC string `yaml:"mac"`
		} `yaml:"sops"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return false
	}
	return doc.Sops != nil && doc.Sops.MAC != ""
}

// Encrypt encrypts a plaintext YAML file for the recipients, the way
// `sops encrypt --age <recipients>` does: a fresh data key, wrapped for
// each recipient (X25519 age1… or post-quantum age1pq1…, each in an age
// file of its own, so the two kinds mix), every value encrypted with
// AES-GCM and a MAC over the plaintext (cmd/sops/encrypt.go and
// common.EncryptTree at v3.13.2).
func Encrypt(plain []byte, o EncryptOptions) ([]byte, error) {
	groups := o.Groups
	if len(groups) == 0 && len(o.Recipients) > 0 {
		groups = [][]string{o.Recipients}
	}
	if len(groups) == 0 || slices.ContainsFunc(groups, func(g []string) bool { return len(g) == 0 }) {
		return nil, errors.New("sops: no age recipients to encrypt to")
	}
	if IsEncrypted(plain) {
		return nil, errors.New("sops: the file is already encrypted")
	}
	docs, err := loadPlain(plain)
	if err != nil {
		return nil, fmt.Errorf("sops: reading the plaintext YAML: %w", err)
	}
	if len(docs) == 0 {
		return nil, errors.New("sops: the file holds no YAML document")
	}
	md := metadata{Version: Version, MACOnlyEncrypted: o.MACOnlyEncrypted,
		EncryptedRegex: o.EncryptedRegex, UnencryptedRegex: o.UnencryptedRegex, EncryptedSuffix: o.EncryptedSuffix, UnencryptedSuffix: o.UnencryptedSuffix}
	if setCount(o.EncryptedRegex, o.UnencryptedRegex, o.EncryptedSuffix, o.UnencryptedSuffix) == 0 {
		md.UnencryptedSuffix = unencryptedSuffix
	}
	for _, recipients := range groups {
		keys, err := sopsage.MasterKeysFromRecipients(strings.Join(recipients, ","))
		if err != nil {
			return nil, fmt.Errorf("sops: age recipients: %w", err)
		}
		md.Groups = append(md.Groups, keys)
	}
	// One group: every key wraps the whole data key. Several: each wraps
	// a Shamir share, threshold of them needed (all when unset), as
	// UpdateMasterKeysWithKeyServices does at v3.13.2.
	dataKey := make([]byte, 32)
	if _, err := rand.Read(dataKey); err != nil {
		return nil, err
	}
	parts := [][]byte{dataKey}
	if len(md.Groups) > 1 {
		md.ShamirThreshold = o.ShamirThreshold
		if md.ShamirThreshold <= 0 || md.ShamirThreshold > len(md.Groups) {
			md.ShamirThreshold = len(md.Groups)
		}
		if parts, err = shamir.Split(dataKey, len(md.Groups), md.ShamirThreshold); err != nil {
			return nil, fmt.Errorf("sops: splitting the data key among the key groups: %w", err)
		}
	}
	for i, group := range md.Groups {
		for _, k := range group {
			if err := k.Encrypt(parts[i]); err != nil {
				return nil, fmt.Errorf("sops: wrapping the data key for %s: %w", k.Recipient, err)
			}
		}
	}
	mac, err := encryptDocs(docs, md, dataKey)
	if err != nil {
		return nil, fmt.Errorf("sops: encrypting: %w", err)
	}
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	md.LastModified = now.UTC().Truncate(time.Second)
	if md.MAC, err = encryptValue(mac, dataKey, md.LastModified.Format(time.RFC3339)); err != nil {
		return nil, fmt.Errorf("sops: encrypting the MAC: %w", err)
	}
	out, err := emit(docs, item{key: metadataKey, value: md.stored()})
	if err != nil {
		return nil, fmt.Errorf("sops: writing the encrypted YAML: %w", err)
	}
	return out, nil
}

// Decrypt decrypts a SOPS-encrypted YAML file with the identities and
// verifies its MAC, as `sops decrypt` does (common.DecryptTree at v3.13.2),
// returning the plaintext YAML. A MAC that holds under the rule of every
// sops but v3.13.2 is accepted (decryptDocs); DecryptAsFlux is the
// stricter check.
func Decrypt(data []byte, ids Identities) ([]byte, error) {
	return decrypt(data, ids, false)
}

// DecryptAsFlux is Decrypt as kustomize-controller v1.9.5 decrypts, with
// sops v3.13.2's MAC rule: a file that holds an encrypted comment inside
// a list fails there (decryptDocs), and the error names where.
func DecryptAsFlux(data []byte, ids Identities) ([]byte, error) {
	return decrypt(data, ids, true)
}

func decrypt(data []byte, ids Identities, strict bool) ([]byte, error) {
	md, docs, err := loadEncrypted(data)
	if err != nil {
		return nil, fmt.Errorf("sops: reading the encrypted YAML: %w", err)
	}
	dataKey, err := dataKey(md, ids)
	if err != nil {
		return nil, err
	}
	computed, strictMAC, listComments, err := decryptDocs(docs, md, dataKey)
	if err != nil {
		return nil, fmt.Errorf("sops: decrypting: %w", err)
	}
	stored, err := decryptValue(md.MAC, dataKey, md.LastModified.Format(time.RFC3339))
	if err != nil {
		return nil, fmt.Errorf("sops: decrypting the MAC: %w", err)
	}
	switch {
	case stored == strictMAC:
	case stored != computed:
		return nil, errors.New("sops: MAC mismatch: the file was changed without its key")
	case strict:
		return nil, fmt.Errorf("sops: the file holds an encrypted comment inside a list (under %s): sops v3.13.2, which kustomize-controller v1.9.5 decrypts with, counts it in the MAC when decrypting but not when encrypting, so Flux fails this file with \"Failed to verify data integrity\"; move the comment out of the list (or keep it in clear with unencrypted_comment_regex) and encrypt the file again",
			strings.Join(listComments, ", "))
	}
	return emit(docs)
}

// dataKey unwraps the file's data key. With one key group the first age
// recipient the identities open gives it; with several (Shamir's secret
// sharing, .sops.yaml key_groups) each group the identities open gives a
// share, and shamir_threshold shares are combined, as the sops CLI does
// (Metadata.GetDataKeyWithKeyServices at v3.13.2).
func dataKey(md metadata, ids Identities) ([]byte, error) {
	if len(md.Groups) == 0 {
		return nil, errors.New("sops: the file has no key groups")
	}
	var parts [][]byte
	var recipients, failures []string
	for i, group := range md.Groups {
		part, rs, err := groupKey(group, ids)
		recipients = append(recipients, rs...)
		switch {
		case err != nil:
			return nil, err
		case part != nil:
			parts = append(parts, part)
		case len(md.Groups) > 1:
			failures = append(failures, fmt.Sprintf("group %d (%s)", i+1, strings.Join(rs, ", ")))
		}
	}
	if len(md.Groups) == 1 {
		if len(parts) == 1 {
			return parts[0], nil
		}
		if len(recipients) == 0 {
			return nil, errors.New("sops: the file is not encrypted to any age recipient")
		}
		return nil, fmt.Errorf("sops: no identity in %s opens the file: it is encrypted to %s; the identities are for %s",
			ids.Source, strings.Join(recipients, ", "), strings.Join(ids.Recipients, ", "))
	}
	threshold := groupsNeeded(len(md.Groups), md.ShamirThreshold)
	if len(parts) < threshold {
		return nil, fmt.Errorf("sops: the file splits its key among %d key groups and needs %d of them; the identities in %s (for %s) open %d: not %s",
			len(md.Groups), threshold, ids.Source, strings.Join(ids.Recipients, ", "), len(parts), strings.Join(failures, ", "))
	}
	key, err := shamir.Combine(parts)
	if err != nil {
		return nil, fmt.Errorf("sops: combining the key groups' shares: %w", err)
	}
	return key, nil
}

// groupsNeeded is how many of groups key groups must be opened to get the
// data key: one when there is one group (every key wraps the whole key),
// else shamir_threshold, all of them when it is 0 (sops' rule in
// GetDataKeyWithKeyServices and UpdateMasterKeysWithKeyServices).
func groupsNeeded(groups, threshold int) int {
	switch {
	case groups <= 1:
		return 1
	case threshold <= 0:
		return groups
	}
	return threshold
}

// GroupsNeeded is how many of the options' key groups open what Encrypt
// writes with them.
func (o EncryptOptions) GroupsNeeded() int {
	return groupsNeeded(max(1, len(o.Groups)), o.ShamirThreshold)
}

// groupKey unwraps the group's key (the data key, or its share) with the
// first age recipient the identities open; nil when none does. Keys of
// other kinds (PGP, KMS) are not tried: only age identities are taken.
func groupKey(group []*sopsage.MasterKey, ids Identities) ([]byte, []string, error) {
	var recipients []string
	for _, ak := range group {
		recipients = append(recipients, ak.Recipient)
		if !ids.opens(ak.Recipient) {
			continue
		}
		ids.parsed.ApplyToMasterKey(ak)
		key, err := ak.Decrypt()
		if err != nil {
			return nil, recipients, fmt.Errorf("sops: unwrapping the data key for %s with %s: %w", ak.Recipient, ids.Source, err)
		}
		return key, recipients, nil
	}
	return nil, recipients, nil
}

// Identities are age identities that decrypt, and where they came from.
type Identities struct {
	parsed sopsage.ParsedIdentities
	// Recipients are the public keys of the identities: X25519 (age1…)
	// and post-quantum hybrid (age1pq1…, age v1.3.1 `age-keygen -pq`).
	Recipients []string
	// Source names the file or variable they were read from, for messages.
	Source string
	// Data is the identity file as read, for a Kubernetes Secret that hands
	// it to Flux. It is secret: never log it.
	Data []byte
}

// Age returns the identities for age itself (whole files sealed to the
// same recipients as the SOPS files they sit beside).
func (i Identities) Age() []age.Identity { return i.parsed }

func (i Identities) opens(recipient string) bool {
	return slices.Contains(i.Recipients, recipient)
}

// identityKeys returns an identity's recipient and its own text (the line
// of a key file that holds it); ok is false for kinds that have no
// recipient here (plugins), which neither this tool nor Flux can use.
func identityKeys(id age.Identity) (recipient, line string, ok bool) {
	switch x := id.(type) {
	case *age.X25519Identity:
		return x.Recipient().String(), x.String(), true
	case *age.HybridIdentity:
		return x.Recipient().String(), x.String(), true
	}
	return "", "", false
}

// ParseIdentities reads age identities (an age key file: one identity per
// line, AGE-SECRET-KEY-1… or the post-quantum AGE-SECRET-KEY-PQ-1…, and #
// comments), as sops v3.13.2 and kustomize-controller v1.9.5 read them
// (age/keysource.go parseIdentity).
func ParseIdentities(data []byte, source string) (Identities, error) {
	ids := Identities{Source: source, Data: data}
	if err := ids.parsed.Import(string(data)); err != nil {
		return Identities{}, fmt.Errorf("age identities in %s: %w", source, err)
	}
	for _, id := range ids.parsed {
		if r, _, ok := identityKeys(id); ok {
			ids.Recipients = append(ids.Recipients, r)
		}
	}
	if len(ids.Recipients) == 0 {
		return Identities{}, fmt.Errorf("%s holds no age identity (AGE-SECRET-KEY-1… or AGE-SECRET-KEY-PQ-1…)", source)
	}
	return ids, nil
}

// splitWords puts each whitespace-separated word of the non-comment lines
// on a line of its own: $SOPS_AGE_KEY may hold several identities on one
// line since sops v3.12.0 (parseIdentities with allowMultipleKeysPerLine
// at v3.13.2); a key file, a command's output and keys.txt may not.
func splitWords(data []byte) []byte {
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, strings.Fields(line)...)
	}
	return []byte(strings.Join(out, "\n"))
}

// LoadIdentities finds the age identities: the file when set (the
// config's secrets.age.keyFile, alone), else every source the sops CLI
// reads, together (age/keysource.go loadIdentities at getsops/sops
// v3.13.2): $SOPS_AGE_KEY (several identities to a line allowed), the file
// $SOPS_AGE_KEY_FILE names, the output of $SOPS_AGE_KEY_CMD, and <user
// config dir>/sops/age/keys.txt. recipients are the age recipients the
// caller needs opened (a file's, the repository's): the key command runs
// once for each with $SOPS_AGE_RECIPIENT set to it, as sops runs it for
// each age key it tries; without recipients it runs once with the
// variable unset. A source that fails is reported only when none yields
// an identity, as the CLI does. SSH identities, which the CLI also reads,
// are left out (SSHKeyFileEnv).
func LoadIdentities(file string, lookupEnv func(string) (string, bool), recipients ...string) (Identities, error) {
	if lookupEnv == nil {
		lookupEnv = os.LookupEnv
	}
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			// %v, not %w: a missing identity must never read as a missing
			// file to a caller that creates what is missing.
			return Identities{}, fmt.Errorf("age identity file: %v", err)
		}
		return ParseIdentities(bytes.TrimSpace(data), file)
	}
	type source struct {
		name string
		data []byte
	}
	var sources []source
	var problems, unused []string
	if k, ok := lookupEnv(KeyEnv); ok {
		sources = append(sources, source{"$" + KeyEnv, splitWords([]byte(k))})
	} else {
		unused = append(unused, "$"+KeyEnv)
	}
	if f, ok := lookupEnv(KeyFileEnv); ok {
		if data, err := os.ReadFile(f); err != nil {
			problems = append(problems, fmt.Sprintf("$%s: %v", KeyFileEnv, err))
		} else {
			sources = append(sources, source{f, data})
		}
	} else {
		unused = append(unused, "$"+KeyFileEnv)
	}
	if c, ok := lookupEnv(KeyCmdEnv); ok {
		out, errs := keyCommand(c, recipients)
		problems = append(problems, errs...)
		if len(out) > 0 {
			sources = append(sources, source{"$" + KeyCmdEnv, out})
		}
	} else {
		unused = append(unused, "$"+KeyCmdEnv)
	}
	if dir, err := os.UserConfigDir(); err == nil {
		path := filepath.Join(dir, filepath.FromSlash(UserConfigPath))
		data, err := os.ReadFile(path)
		switch {
		case err == nil:
			sources = append(sources, source{path, data})
		case errors.Is(err, fs.ErrNotExist):
			unused = append(unused, path)
		default:
			problems = append(problems, err.Error())
		}
	}
	var all Identities
	var names []string
	seen := map[string]bool{}
	for _, src := range sources {
		ids, err := ParseIdentities(bytes.TrimSpace(src.data), src.name)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		names = append(names, src.name)
		all.parsed = append(all.parsed, ids.parsed...)
		for _, r := range ids.Recipients {
			if !seen[r] {
				seen[r] = true
				all.Recipients = append(all.Recipients, r)
			}
		}
		if len(all.Data) > 0 {
			all.Data = append(all.Data, '\n')
		}
		all.Data = append(all.Data, bytes.TrimSpace(src.data)...)
	}
	if len(all.Recipients) == 0 {
		msg := "no age identity in any place the sops CLI reads"
		if len(unused) > 0 {
			msg += " (unset or missing: " + strings.Join(unused, ", ") + ")"
		}
		for _, env := range []string{SSHKeyFileEnv, SSHKeyCmdEnv} {
			if _, ok := lookupEnv(env); ok {
				problems = append(problems, fmt.Sprintf("$%s is set, but an SSH key is not an age identity kustomize-controller can decrypt with", env))
			}
		}
		if len(problems) > 0 {
			msg += ": " + strings.Join(problems, "; ")
		}
		return Identities{}, errors.New(msg)
	}
	all.Source = strings.Join(names, " + ")
	return all, nil
}

// keyCommand runs $SOPS_AGE_KEY_CMD's command c once for each recipient
// with $SOPS_AGE_RECIPIENT set to it (once without it when there is none)
// and returns every output, one after the other, and what failed.
func keyCommand(c string, recipients []string) (out []byte, problems []string) {
	args, err := shlex.Split(c)
	if err != nil || len(args) == 0 {
		return nil, []string{fmt.Sprintf("$%s %q does not parse as a command: %v", KeyCmdEnv, c, err)}
	}
	runs := recipients
	if len(runs) == 0 {
		runs = []string{""}
	}
	for _, r := range runs {
		cmd := exec.Command(args[0], args[1:]...)
		if r != "" {
			cmd.Env = append(os.Environ(), RecipientEnv+"="+r)
		}
		b, err := cmd.Output()
		if err != nil {
			what := fmt.Sprintf("$%s %q failed", KeyCmdEnv, c)
			if r != "" {
				what += fmt.Sprintf(" for $%s=%s", RecipientEnv, r)
			}
			problems = append(problems, fmt.Sprintf("%s: %v", what, err))
			continue
		}
		out = append(append(out, bytes.TrimSpace(b)...), '\n')
	}
	return out, problems
}

// GenerateIdentity returns a new age identity and its recipient, as
// `age-keygen` prints them.
func GenerateIdentity() (identity, recipient string, err error) {
	id, err := age.GenerateX25519Identity()
	if err != nil {
		return "", "", err
	}
	return id.String(), id.Recipient().String(), nil
}

// CreationRule is the .sops.yaml creation rule that governs a file: how
// the sops CLI encrypts it (`sops encrypt`, `updatekeys`), and so how
// Seal encrypts it too, or the next `sops updatekeys` would rewrite it.
type CreationRule struct {
	// Config is the .sops.yaml the rule is in.
	Config string
	// Options are the rule's key groups, threshold and what to encrypt.
	Options EncryptOptions
}

// RuleFor finds the .sops.yaml nearest the file (its directory, then up;
// the sops CLI searches up from where it runs: configFileName) and the first of its creation rules whose path_regex matches
// the file's path relative to it. ok is false when there is no
// .sops.yaml or no rule matches (the file then keeps the tool's own
// recipients). A rule naming keys other than age (PGP, KMS, Vault) is an
// error: only age identities decrypt here.
func RuleFor(file string) (rule CreationRule, ok bool, err error) {
	abs, err := filepath.Abs(file)
	if err != nil {
		return CreationRule{}, false, err
	}
	conf := findConfig(abs)
	if conf == "" {
		return CreationRule{}, false, nil
	}
	r, err := ruleFor(conf, abs)
	if err != nil {
		return CreationRule{}, false, fmt.Errorf("sops: %s: %w", conf, err)
	}
	if r == nil {
		return CreationRule{}, false, nil
	}
	o, err := r.options(conf, file)
	if err != nil {
		return CreationRule{}, false, err
	}
	return CreationRule{Config: conf, Options: o}, true, nil
}

// FileSealer stores YAML SOPS-encrypted to Recipients and opens encrypted
// YAML with the identities LoadIdentities finds from KeyFile, read once on
// first use. With no recipients it stores plaintext; plaintext it opens as
// is (a bundle written before encryption was configured).
type FileSealer struct {
	Recipients []string
	// Path, when set, is where the sealed file lives: a .sops.yaml
	// creation rule for it (RuleFor) then decides its key groups and what
	// is encrypted, as the sops CLI would.
	Path      string
	KeyFile   string
	LookupEnv func(string) (string, bool)
	Now       func() time.Time

	ids    *Identities
	idsErr error
}

// Encrypting says whether Seal encrypts.
func (s *FileSealer) Encrypting() bool { return len(s.Recipients) > 0 }

// Seal implements talos.Sealer.
func (s *FileSealer) Seal(plain []byte) ([]byte, error) {
	if !s.Encrypting() {
		return plain, nil
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	o := EncryptOptions{Recipients: s.Recipients}
	if s.Path != "" {
		rule, ok, err := RuleFor(s.Path)
		if err != nil {
			return nil, err
		}
		if ok {
			o = rule.Options
		}
	}
	o.Now = now()
	return Encrypt(plain, o)
}

// Open implements talos.Sealer.
func (s *FileSealer) Open(stored []byte) ([]byte, error) {
	if !IsEncrypted(stored) {
		return stored, nil
	}
	ids, err := s.identities(FileRecipients(stored))
	if err != nil {
		return nil, err
	}
	return Decrypt(stored, ids)
}

// Identities returns the identities that open what Seal stored.
func (s *FileSealer) Identities() (Identities, error) {
	return s.identities(s.Recipients)
}

// identities loads the identities once, asking a key command for
// recipients (LoadIdentities).
func (s *FileSealer) identities(recipients []string) (Identities, error) {
	if s.ids == nil && s.idsErr == nil {
		ids, err := LoadIdentities(s.KeyFile, s.LookupEnv, recipients...)
		s.ids, s.idsErr = &ids, err
	}
	if s.idsErr != nil {
		return Identities{}, s.idsErr
	}
	return *s.ids, nil
}

// FileRecipients returns the age recipients a SOPS-encrypted YAML or JSON
// file is sealed to (every document's metadata, key groups included), as
// stored in its sops.age entries.
func FileRecipients(data []byte) []string {
	var out []string
	seen := map[string]bool{}
	add := func(keys []storedAgeKey) {
		for _, k := range keys {
			if k.Recipient != "" && !seen[k.Recipient] {
				seen[k.Recipient] = true
				out = append(out, k.Recipient)
			}
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var holder struct {
			Metadata *storedMetadata `yaml:"sops"`
		}
		if err := dec.Decode(&holder); err != nil {
			break
		}
		if holder.Metadata == nil {
			continue
		}
		add(holder.Metadata.Age)
		for _, g := range holder.Metadata.KeyGroups {
			add(g.Age)
		}
	}
	return out
}

// Only returns the identities that open one of recipients, with Data made
// of exactly those identities (what a cluster Secret should hold: not
// every key of the machine it was read on). ok is false when none does.
func (i Identities) Only(recipients []string) (Identities, bool) {
	want := map[string]bool{}
	for _, r := range recipients {
		want[r] = true
	}
	out := Identities{Source: i.Source}
	var lines []string
	for _, id := range i.parsed {
		r, line, ok := identityKeys(id)
		if !ok || !want[r] {
			continue
		}
		// Each identity once, however many sources held it.
		delete(want, r)
		out.parsed = append(out.parsed, id)
		out.Recipients = append(out.Recipients, r)
		lines = append(lines, line)
	}
	out.Data = []byte(strings.Join(lines, "\n"))
	return out, len(lines) > 0
}
