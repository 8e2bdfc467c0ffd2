package gitsnap

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/go-git/go-git/v5/plumbing/format/gitignore"
	"go.yaml.in/yaml/v3"
)

// Exclusion rules, as counted in Exclusions. The built-in ones always apply.
const (
	RuleTalosDir          = ".talos/"
	RuleStateDir          = "ai/state/"
	RuleKubeconfig        = "kubeconfig"
	RuleTalosconfig       = "talosconfig"
	RuleSecretsBundle     = "secrets.yaml"
	RuleAgeKey            = "age key"
	RuleDotEnv            = ".env"
	RulePrivateKey        = "private key"
	RuleConfiguredExclude = "configured exclude"
	// RuleTalosMachineConfig: a Talos v1alpha1 machine config carries the
	// machine CA key, the cluster secret and the bootstrap token wherever
	// it sits in the tree (rendered_configs/, backups/, ...).
	RuleTalosMachineConfig = "talos machine config"
	// RuleUnencryptedSecret: a Kubernetes Secret manifest with data and no
	// sops block. Flux repositories keep Secrets SOPS-encrypted; a
	// plaintext one is a leak once served.
	RuleUnencryptedSecret = "unencrypted Secret"
	// RuleTokenPrefix starts the rule of a well-known token format found in
	// a text file: "token: github", "token: aws access key", ...
	RuleTokenPrefix = "token: "
	// RuleTalosSecretsBundle: a Talos secrets bundle (cluster, secrets,
	// trustdinfo and certs, talos pkg/machinery/config/generate/secrets
	// Bundle), plaintext or SOPS-encrypted, wherever it sits: the keys of
	// the whole cluster are never served, not even encrypted.
	RuleTalosSecretsBundle = "talos secrets bundle"
	// RuleProtected: a path the cluster's config keeps its state, keys or
	// backups in (state.dir, state.talosDir, the kubeconfig, backup.copyDir,
	// every credential file it names, and their "<file>.bak-*" backups),
	// when that path lies inside the served tree.
	RuleProtected = "bootstrap state or credential"
	// RuleSecretGenerator: a kustomization whose secretGenerator holds
	// literals, or a plaintext file or env file such a generator reads.
	// kustomize-controller decrypts SOPS-encrypted generator files, so
	// those are served.
	RuleSecretGenerator = "kustomize secretGenerator"
	// RuleFiltered: a file with a git filter attribute (LFS, git-crypt)
	// whose work-tree content is not what git holds (changed since it was
	// added, or never added): the smudged content may be the plaintext
	// the filter exists to keep out of the repository.
	RuleFiltered = "filtered file not as git holds it"
	// RuleAWSCredentials: an AWS-style shared credentials file (INI with
	// aws_secret_access_key), what every S3 client reads. Self-hosted S3
	// servers (MinIO, Garage, SeaweedFS, B2) issue keys without AWS's
	// AKIA prefix, so the file is known by its key name, not its value.
	RuleAWSCredentials = "AWS shared credentials"
	// RuleHelmValues: a Flux HelmRelease whose spec.values hold a literal
	// under a key that names a secret (password, token, apiKey, …), where
	// Flux's way is valuesFrom a (SOPS-encrypted) Secret.
	RuleHelmValues = "plaintext secret in HelmRelease values"
)

// tokenRules are the token formats looked for in every inspected file: a
// small documented set instead of a detector library. Measured against
// gitleaks v8.30.1's default rules (README, "The guard's rules are its
// own"): no real secret found that these rules and the structural ones
// miss on five public homelab trees, two false positives that would each
// refuse a snapshot, 6 MB and 34 modules more in the binary. Each needs
// its literal prefix before the pattern runs.
var tokenRules = []struct {
	name, prefix string
	re           *regexp.Regexp
}{
	// GitHub personal, OAuth, user-to-server, server-to-server and refresh
	// tokens (ghp_, gho_, ghu_, ghs_, ghr_ + 36), fine-grained PATs.
	{"github", "gh", regexp.MustCompile(`\bgh[pousr]_[A-Za-z0-9]{36}\b`)},
	{"github", "github_pat_", regexp.MustCompile(`\bgithub_pat_[A-Za-z0-9_]{82}\b`)},
	{"gitlab", "glpat-", regexp.MustCompile(`\bglpat-[A-Za-z0-9_-]{20,}`)},
	{"aws access key", "A", regexp.MustCompile(`\b(AKIA|ASIA)[0-9A-Z]{16}\b`)},
	{"slack", "xox", regexp.MustCompile(`\bxox[abprs]-[A-Za-z0-9-]{10,}`)},
	// Incoming-webhook URLs carry their token in the path: Slack's
	// hooks.slack.com/services/T…/B…/<token>, Discord's
	// /api/webhooks/<id>/<token>.
	{"slack webhook", "hooks.slack.com/services/", regexp.MustCompile(`hooks\.slack\.com/services/T[A-Z0-9]+/B[A-Z0-9]+/[A-Za-z0-9]{16,}`)},
	{"discord webhook", "/api/webhooks/", regexp.MustCompile(`discord(?:app)?\.com/api/webhooks/[0-9]+/[A-Za-z0-9_-]{16,}`)},
	{"age secret key", "AGE-SECRET-KEY-1", regexp.MustCompile(`AGE-SECRET-KEY-1[0-9A-Z]{58}`)},
	// Post-quantum hybrid identities (age v1.3.0 age-keygen -pq; sops
	// v3.12.0 and later parse them: getsops/sops v3.13.2 age/keysource.go
	// parseIdentity's "AGE-SECRET-KEY-PQ-1" case).
	{"age secret key", "AGE-SECRET-KEY-PQ-1", regexp.MustCompile(`AGE-SECRET-KEY-PQ-1[0-9A-Z]{40,}`)},
}

// Exclusions counts excluded files by rule. It carries no names or content,
// so it can be logged as is.
type Exclusions map[string]int

// Total is the number of excluded files.
func (e Exclusions) Total() int {
	n := 0
	for _, c := range e {
		n += c
	}
	return n
}

// String renders "3 (.env: 1, kubeconfig: 2)", rules sorted.
func (e Exclusions) String() string {
	rules := make([]string, 0, len(e))
	for r := range e {
		rules = append(rules, r)
	}
	sort.Strings(rules)
	parts := make([]string, 0, len(rules))
	for _, r := range rules {
		parts = append(parts, fmt.Sprintf("%s: %d", r, e[r]))
	}
	if len(parts) == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%s)", e.Total(), strings.Join(parts, ", "))
}

type excluder struct {
	configured gitignore.Matcher
	// protected are slash-separated paths relative to the work tree root.
	protected []string
}

// newExcluder takes the configured patterns and the protected paths
// (absolute, or relative to root); protected paths outside root are
// dropped, as no snapshot can reach them.
func newExcluder(root string, patterns, protected []string) (*excluder, error) {
	var ps []gitignore.Pattern
	for _, p := range patterns {
		if strings.TrimSpace(p) == "" {
			return nil, errors.New("snapshot exclude patterns: empty pattern")
		}
		ps = append(ps, gitignore.ParsePattern(p, nil))
	}
	x := &excluder{configured: gitignore.NewMatcher(ps)}
	for _, p := range protected {
		if p == "" {
			continue
		}
		if !filepath.IsAbs(p) {
			p = filepath.Join(root, p)
		}
		rel, err := filepath.Rel(root, filepath.Clean(p))
		if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			continue
		}
		if rel == "." {
			return nil, fmt.Errorf("the snapshot source %s is itself a protected path (state, Talos files or credentials): serve a directory that does not hold them", root)
		}
		x.protected = append(x.protected, filepath.ToSlash(rel))
	}
	return x, nil
}

// byPath returns the rule that excludes the slash-separated path p, or "".
// The built-in rules match at any depth: a kubeconfig in clusters/x/ leaks
// as much as one at the top. A "<name>.bak-<suffix>" backup (what bootstrap
// and many editors and tools write before replacing a file) goes by the
// name it backs up.
func (x *excluder) byPath(p string) string {
	parts := strings.Split(p, "/")
	for i, c := range parts[:len(parts)-1] {
		if c == ".talos" {
			return RuleTalosDir
		}
		if c == "ai" && i+1 < len(parts)-1 && parts[i+1] == "state" {
			return RuleStateDir
		}
	}
	for _, prot := range x.protected {
		if p == prot || strings.HasPrefix(p, prot+"/") || strings.HasPrefix(p, prot+".bak-") {
			return RuleProtected
		}
	}
	base := backedUp(path.Base(p))
	// A kubeconfig or talosconfig kept age-encrypted (name.age, as
	// bootstrap keeps them beside an encrypted bundle) goes by its name too.
	client := strings.TrimSuffix(base, ".age")
	switch {
	case client == "kubeconfig" || strings.HasSuffix(client, ".kubeconfig"):
		return RuleKubeconfig
	case client == "talosconfig" || strings.HasSuffix(client, ".talosconfig"):
		return RuleTalosconfig
	case strings.HasSuffix(base, ".agekey"):
		return RuleAgeKey
	}
	if x.configured.Match(parts, false) {
		return RuleConfiguredExclude
	}
	return ""
}

// backedUp returns the name a "<name>.bak-<suffix>" backup backs up, or
// name itself.
func backedUp(name string) string {
	if i := strings.Index(name, ".bak-"); i > 0 {
		return name[:i]
	}
	return name
}

// byEncryptedName returns the rule of a name that usually holds secrets
// (secrets.yaml, *.age, .env*, and their .bak-* backups) when the content
// holds one in plaintext, or "". Flux layouts keep SOPS-encrypted Secrets
// under exactly these names, so an encrypted one is served (kustomize-
// controller decrypts it), and so is one whose values are all placeholders
// (an .env.sample with empty values, Kubernetes objects beside a SOPS
// document).
func byEncryptedName(p string, data []byte) string {
	base := backedUp(path.Base(p))
	switch {
	case base == "secrets.yaml" || base == "secrets.yml":
		if !secretsFileHoldsNoSecret(data) {
			return RuleSecretsBundle
		}
	case strings.HasSuffix(base, ".age"):
		if !isAgeCiphertext(data) {
			return RuleAgeKey
		}
	case base == ".env" || strings.HasPrefix(base, ".env."):
		if !sopsDotenvSealed(data) && !dotenvHoldsNoSecret(data) {
			return RuleDotEnv
		}
	}
	return ""
}

// secretsFileHoldsNoSecret: every document of a secrets.yaml is sealed by
// sops, a Kubernetes object holding no plaintext Secret, or holds only
// placeholders. A document that does not parse counts as a secret.
func secretsFileHoldsNoSecret(data []byte) bool {
	for _, chunk := range splitYAMLDocs(data) {
		var doc map[string]any
		if err := yaml.Unmarshal(chunk, &doc); err != nil {
			return false
		}
		switch {
		case doc == nil || sopsMetadataSealed(doc):
		case doc["apiVersion"] != nil && doc["kind"] != nil:
			if plaintextSecret(doc, 0) {
				return false
			}
		case !leavesHoldNoSecret(doc):
			return false
		}
	}
	return true
}

// dotenvAssignment is one line of a dotenv file: [export ]NAME=value.
var dotenvAssignment = regexp.MustCompile(`^(?:export\s+)?[A-Za-z_][A-Za-z0-9_.-]*\s*=\s*(.*)$`)

// dotenvHoldsNoSecret: a dotenv file whose every value is a placeholder
// (empty, as .env.sample files keep them, a template, a substitution or a
// secret-store reference).
func dotenvHoldsNoSecret(data []byte) bool {
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := dotenvAssignment.FindStringSubmatch(line)
		if m == nil || !holdsNoSecret(unquote(strings.TrimSpace(m[1]))) {
			return false
		}
	}
	return true
}

// fileKind says how a file's content is read: as Kubernetes manifests
// (what kustomize and Flux's generator read: .yaml, .yml, .json), as a
// Helm chart's template, or as anything else (documentation, templates of
// other tools, scripts).
type fileKind int

const (
	otherFile fileKind = iota
	manifestFile
	chartTemplate
)

// kindOf classifies p; charts are the directories holding a Chart.yaml.
func kindOf(p string, charts map[string]bool) fileKind {
	for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
		if path.Base(d) == "templates" && charts[path.Dir(d)] {
			return chartTemplate
		}
	}
	switch strings.ToLower(path.Ext(p)) {
	case ".yaml", ".yml", ".json":
		return manifestFile
	}
	return otherFile
}

// byContent returns the rule that excludes a regular file with this content
// whatever its name, or "". Cheap byte checks come first so only likely
// candidates are parsed. Credentials are looked for in every file; a
// plaintext Secret only where something applies it as a manifest (a
// Secret shown in a README or in another tool's template is not one).
//
// Every file is inspected whatever its size: a credential appended to a
// large manifest leaks as much as a small one, and the snapshot holds the
// whole file in memory anyway.
func (x *excluder) byContent(data []byte, kind fileKind) string {
	if isPrivateKey(data) {
		return RulePrivateKey
	}
	if bytes.Contains(data, []byte("users")) && isKubeconfigWithCredentials(data) {
		return RuleKubeconfig
	}
	if bytes.Contains(data, []byte("contexts")) && bytes.Contains(data, []byte("key")) && isTalosconfigWithKey(data) {
		return RuleTalosconfig
	}
	if bytes.Contains(data, []byte("v1alpha1")) && bytes.Contains(data, []byte("machine")) && isTalosMachineConfig(data) {
		return RuleTalosMachineConfig
	}
	if bytes.Contains(data, []byte("trustdinfo")) && isTalosSecretsBundle(data) {
		return RuleTalosSecretsBundle
	}
	if bytes.Contains(bytes.ToLower(data), []byte("aws_secret_access_key")) && isAWSSharedCredentials(data) {
		return RuleAWSCredentials
	}
	if kind != otherFile && bytes.Contains(data, []byte("Secret")) && isUnencryptedSecret(data, kind == chartTemplate) {
		return RuleUnencryptedSecret
	}
	if kind == manifestFile && bytes.Contains(data, []byte("patch")) && bytes.Contains(data, []byte("Secret")) && inlinePatchSecret(data) {
		return RuleUnencryptedSecret
	}
	if kind == manifestFile && bytes.Contains(data, []byte("helm.toolkit.fluxcd.io")) && helmValuesHoldSecret(data) {
		return RuleHelmValues
	}
	for _, t := range tokenRules {
		if bytes.Contains(data, []byte(t.prefix)) && t.re.Match(data) {
			return RuleTokenPrefix + t.name
		}
	}
	return ""
}

// awsSecretKeyLine is the secret key of an AWS shared credentials file as
// the AWS SDK reads it (aws-sdk-go-v2 config v1.32.17 internal/ini: keys
// case-insensitive, '=' or ':' between key and value). The value is what
// stands on the key's own line: a YAML key whose value is a mapping on the
// next lines (an env entry with valueFrom.secretKeyRef) holds none.
var awsSecretKeyLine = regexp.MustCompile(`(?mi)^[ \t]*aws_secret_access_key[ \t]*[=:][ \t]*(.*)$`)

// isAWSSharedCredentials: a file with an aws_secret_access_key line whose
// value is not a placeholder.
func isAWSSharedCredentials(data []byte) bool {
	for _, m := range awsSecretKeyLine.FindAllSubmatch(data, -1) {
		v, _, _ := strings.Cut(string(m[1]), " #")
		v, _, _ = strings.Cut(v, " ;")
		if !holdsNoSecret(unquote(strings.TrimSpace(v))) {
			return true
		}
	}
	return false
}

// talosSecretKeys are the keys under which Talos files keep secrets: the
// machine and cluster tokens, every CA's and the service account's key,
// the cluster secret and the encryption secrets (talos
// pkg/machinery/config/types/v1alpha1 Config; the secrets bundle's
// secrets.Bundle).
var talosSecretKeys = map[string]bool{"key": true, "token": true, "secret": true, "bootstraptoken": true,
	"secretboxencryptionsecret": true, "aescbcencryptionsecret": true}

// holdsTalosKeys reports whether any value under a Talos secret key holds
// key material (encrypted or not).
func holdsTalosKeys(v any, depth int) bool {
	m, ok := v.(map[string]any)
	if !ok || depth > 8 {
		return false
	}
	for k, x := range m {
		if talosSecretKeys[strings.ToLower(k)] {
			if _, nested := x.(map[string]any); !nested && leafIsKeyMaterial(x) {
				return true
			}
		}
		if holdsTalosKeys(x, depth+1) {
			return true
		}
	}
	return false
}

// isTalosMachineConfig: a document with version v1alpha1 and a machine
// section, the v1alpha1 config root (talos pkg/machinery/config/types/
// v1alpha1 Config: version, machine, cluster), that holds key material.
// A config whose secrets are all placeholders (op:// references, ${…}) is
// a template of one and is served.
func isTalosMachineConfig(data []byte) bool {
	for _, doc := range yamlDocs(data) {
		if _, ok := doc["machine"].(map[string]any); ok && doc["version"] == "v1alpha1" && holdsTalosKeys(doc, 0) {
			return true
		}
	}
	return false
}

// isUnencryptedSecret: a core/v1 Secret with data or stringData holding a
// value that is neither a placeholder nor sealed by sops, at the top level
// or inside any *List's items. A document that does not parse is parsed
// again with its template actions taken out (a Helm chart's or Jinja
// template), and failing that its data lines are judged one by one: git
// serves its bytes whether or not kustomize could read them.
func isUnencryptedSecret(data []byte, chartTemplate bool) bool {
	for _, chunk := range splitYAMLDocs(data) {
		if !bytes.Contains(chunk, []byte("Secret")) {
			continue
		}
		var doc map[string]any
		err := yaml.Unmarshal(chunk, &doc)
		if err != nil || chartTemplate {
			doc = nil
			if yaml.Unmarshal(withoutTemplateActions(chunk), &doc) != nil {
				doc = nil
			}
		}
		if doc == nil {
			if secretKindLine.Match(chunk) && plaintextDataLines(chunk) {
				return true
			}
			continue
		}
		if plaintextSecret(doc, 0) {
			return true
		}
	}
	return false
}

// secretKindLine finds "kind: Secret" in a document that does not parse.
var secretKindLine = regexp.MustCompile(`(?m)^\s*"?kind"?\s*:\s*["']?Secret["']?\s*,?\s*$`)

// templatePlaceholder stands in for a template action so the document
// parses: a substitution, which holdsNoSecret takes as a placeholder.
const templatePlaceholder = "${template}"

// withoutTemplateActions drops lines that hold only template actions
// ({{- if … }}, {% for … %}, #% endif %#) and replaces the other actions
// by a placeholder; an action that writes a string literal is replaced by
// literal text, so its value still reads as plaintext.
func withoutTemplateActions(chunk []byte) []byte {
	lines := strings.Split(string(chunk), "\n")
	out := lines[:0]
	for _, line := range lines {
		if t := strings.TrimSpace(line); t != "" && strings.TrimSpace(templateAction.ReplaceAllString(t, "")) == "" && !writesLiteral(t) {
			continue
		}
		out = append(out, templateAction.ReplaceAllStringFunc(line, func(a string) string {
			if actionWritesLiteral(a) {
				return "literal"
			}
			return templatePlaceholder
		}))
	}
	return []byte(strings.Join(out, "\n"))
}

// writesLiteral reports whether any template action of line writes a
// string literal.
func writesLiteral(line string) bool {
	for _, a := range templateAction.FindAllString(line, -1) {
		if actionWritesLiteral(a) {
			return true
		}
	}
	return false
}

// dataBlock starts a Secret's data or stringData block in a document
// that does not parse.
var dataBlock = regexp.MustCompile(`^(\s*)"?(?:data|stringData)"?\s*:\s*(.*)$`)

// simpleKey is a "key: value" line inside a data block.
var simpleKey = regexp.MustCompile(`^\s*"?[^\s:"]+"?\s*:(?:\s+(.*))?$`)

// plaintextDataLines judges a Secret document that does not parse, line
// by line: any line inside a data or stringData block whose value is not
// a placeholder or a sops value is plaintext.
func plaintextDataLines(chunk []byte) bool {
	inBlock, blockIndent := false, 0
	for _, line := range strings.Split(string(chunk), "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		indent := len(line) - len(strings.TrimLeft(line, " \t"))
		if inBlock && indent <= blockIndent {
			inBlock = false
		}
		if m := dataBlock.FindStringSubmatch(line); m != nil && !inBlock {
			inBlock, blockIndent = true, len(m[1])
			if rest := strings.TrimSpace(m[2]); rest != "" && strings.Trim(rest, "{}") != "" {
				if !lineHoldsNoSecret(rest) {
					return true
				}
			}
			continue
		}
		if !inBlock {
			continue
		}
		value := t
		if m := simpleKey.FindStringSubmatch(line); m != nil {
			value = strings.TrimSpace(m[1])
		}
		if value == "" || strings.Trim(value, "|>-+0123456789") == "" {
			continue
		}
		if !lineHoldsNoSecret(unquote(value)) {
			return true
		}
	}
	return false
}

// plaintextSecret judges one decoded object: a Secret whose data or
// stringData holds a value that is not a placeholder (holdsNoSecret) or,
// when sops sealed the document, an ENC[...] string. A ciphertext without
// sops metadata carrying a MAC (what `sops --encrypt` always writes:
// getsops/sops v3.11.0 stores/stores.go Metadata.MessageAuthenticationCode,
// "mac") is not decrypted by kustomize-controller, and a value left in
// plaintext by encrypted_regex or an unencrypted suffix is plaintext once
// served; an empty value is not (sops leaves "" unencrypted). Lists (kind
// v1 List, or any *List) are searched through their items.
func plaintextSecret(doc map[string]any, depth int) bool {
	kind, _ := doc["kind"].(string)
	if items, ok := doc["items"].([]any); ok && strings.HasSuffix(kind, "List") && depth < 8 {
		for _, it := range items {
			if m, ok := it.(map[string]any); ok && plaintextSecret(m, depth+1) {
				return true
			}
		}
		return false
	}
	if kind != "Secret" || (doc["apiVersion"] != "v1" && doc["apiVersion"] != nil) {
		return false
	}
	sealed := sopsMetadataSealed(doc)
	for _, field := range []string{"data", "stringData"} {
		if !secretValuesHoldNoSecret(doc[field], sealed) {
			return true
		}
	}
	return false
}

// secretValuesHoldNoSecret judges a Secret's data or stringData.
func secretValuesHoldNoSecret(v any, sealed bool) bool {
	switch t := v.(type) {
	case map[string]any:
		for _, x := range t {
			if !secretValuesHoldNoSecret(x, sealed) {
				return false
			}
		}
		return true
	case []any:
		for _, x := range t {
			if !secretValuesHoldNoSecret(x, sealed) {
				return false
			}
		}
		return true
	case string:
		if isSOPSValue(strings.TrimSpace(t)) {
			return sealed
		}
		return holdsNoSecret(t)
	case nil:
		return true
	default:
		return false
	}
}

// sopsMetadataSealed: the document carries sops metadata with an
// encrypted MAC.
func sopsMetadataSealed(doc map[string]any) bool {
	m, _ := doc["sops"].(map[string]any)
	mac, _ := m["mac"].(string)
	return strings.HasPrefix(mac, "ENC[")
}

// sopsSealed: a YAML or JSON file (sops' yaml, json and binary formats)
// every document of which parses and carries sealed sops metadata.
func sopsSealed(data []byte) bool {
	n := 0
	for _, chunk := range splitYAMLDocs(data) {
		var doc map[string]any
		if err := yaml.Unmarshal(chunk, &doc); err != nil {
			return false
		}
		if doc == nil {
			continue
		}
		if !sopsMetadataSealed(doc) {
			return false
		}
		n++
	}
	return n > 0
}

// sopsDotenvSealed: a dotenv file as sops writes it (stores/dotenv: the
// metadata as sops_-prefixed keys, sops_mac among them) with every other
// value encrypted or empty.
func sopsDotenvSealed(data []byte) bool {
	mac := false
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			return false
		}
		if key == "sops_mac" {
			mac = strings.HasPrefix(value, "ENC[")
			continue
		}
		if strings.HasPrefix(key, "sops_") {
			continue
		}
		if value != "" && !strings.HasPrefix(value, "ENC[") {
			return false
		}
	}
	return mac
}

// sopsINISealed: an INI file as sops writes it (a [sops] section with an
// encrypted mac).
func sopsINISealed(data []byte) bool {
	return bytes.Contains(data, []byte("[sops]")) && iniMAC.Match(data)
}

var iniMAC = regexp.MustCompile(`(?m)^mac\s*=\s*ENC\[`)

// isAgeCiphertext: an age-encrypted file, binary or armored (the age
// format's header line, C2SP age.md).
func isAgeCiphertext(data []byte) bool {
	return bytes.HasPrefix(data, []byte("age-encryption.org/v1\n")) ||
		bytes.HasPrefix(bytes.TrimSpace(data), []byte("-----BEGIN AGE ENCRYPTED FILE-----"))
}

// isTalosSecretsBundle: a document with the sections of a Talos secrets
// bundle holding key material. SOPS keeps key names in plaintext, so an
// encrypted bundle is recognised too; one whose values are all
// placeholders (talhelper's talsecret with ${…}) is a template and served.
func isTalosSecretsBundle(data []byte) bool {
	for _, doc := range yamlDocs(data) {
		_, certs := doc["certs"].(map[string]any)
		_, trustd := doc["trustdinfo"].(map[string]any)
		_, cluster := doc["cluster"].(map[string]any)
		if certs && trustd && cluster && holdsTalosKeys(doc, 0) {
			return true
		}
	}
	return false
}

// pemBody is a line of a PEM or armored body (base64, RFC 7468), at any
// indent: a key inside a YAML block scalar counts too.
var pemBody = regexp.MustCompile(`^[A-Za-z0-9+/=]{16,}$`)

// isPrivateKey: a "-----BEGIN … PRIVATE KEY…-----" block (PEM, OpenSSH,
// PGP armor) with a body of key material: at least 64 base64 characters
// before its END line. A documentation example with "..." for a body is no
// key.
func isPrivateKey(data []byte) bool {
	for rest := data; ; {
		i := bytes.Index(rest, []byte("-----BEGIN "))
		if i < 0 {
			return false
		}
		rest = rest[i:]
		nl := bytes.IndexByte(rest, '\n')
		if nl < 0 {
			return false
		}
		header := rest[:nl]
		rest = rest[nl+1:]
		if !bytes.Contains(header, []byte("PRIVATE KEY")) {
			continue
		}
		n := 0
		for _, line := range strings.Split(string(rest), "\n") {
			t := strings.TrimSpace(line)
			if strings.HasPrefix(t, "-----END ") {
				break
			}
			if pemBody.MatchString(t) {
				n += len(t)
			}
		}
		if n >= 64 {
			return true
		}
	}
}

// yamlDocs decodes every YAML (or JSON) document in data that parses as a
// mapping; one that does not is skipped, so a broken first document does
// not hide the ones after it.
func yamlDocs(data []byte) []map[string]any {
	var docs []map[string]any
	for _, chunk := range splitYAMLDocs(data) {
		var m map[string]any
		if err := yaml.Unmarshal(chunk, &m); err == nil && m != nil {
			docs = append(docs, m)
		}
	}
	return docs
}

// splitYAMLDocs splits data at document markers ("---" at the start of a
// line, alone or before a comment or a value). A marker inside a block
// scalar is indented, so a marker in column 0 always starts a document.
func splitYAMLDocs(data []byte) [][]byte {
	var out [][]byte
	start := 0
	for i := 0; i <= len(data); {
		end := bytes.IndexByte(data[i:], '\n')
		if end < 0 {
			end = len(data)
		} else {
			end += i
		}
		line := data[i:end]
		if bytes.HasPrefix(line, []byte("---")) && (len(line) == 3 || line[3] == ' ' || line[3] == '\t' || line[3] == '\r') {
			if i > start {
				out = append(out, data[start:i])
			}
			start = i + 3
		}
		i = end + 1
	}
	if start < len(data) {
		out = append(out, data[start:])
	}
	return out
}

// isKubeconfigWithCredentials: a kubeconfig one of whose users holds a
// credential that is not a placeholder. kubectl loads a file without
// kind and apiVersion (client-go tools/clientcmd's loader decodes into
// clientcmdapi.Config whatever the kind says), so a document with users
// and clusters or contexts lists counts as one too.
func isKubeconfigWithCredentials(data []byte) bool {
	for _, doc := range yamlDocs(data) {
		_, clusters := doc["clusters"].([]any)
		_, contexts := doc["contexts"].([]any)
		if doc["kind"] != "Config" && (doc["kind"] != nil || !clusters && !contexts) {
			continue
		}
		users, _ := doc["users"].([]any)
		for _, u := range users {
			um, _ := u.(map[string]any)
			user, _ := um["user"].(map[string]any)
			for _, k := range []string{"client-key-data", "client-key", "token", "tokenFile", "password", "auth-provider", "exec"} {
				if v, ok := user[k]; ok && v != nil && !leavesHoldNoSecret(v) {
					return true
				}
			}
		}
	}
	return false
}

// isTalosconfigWithKey: a talosconfig whose context holds a client key
// (encrypted or not) that is not a placeholder.
func isTalosconfigWithKey(data []byte) bool {
	for _, doc := range yamlDocs(data) {
		contexts, _ := doc["contexts"].(map[string]any)
		for _, c := range contexts {
			cm, _ := c.(map[string]any)
			if k, ok := cm["key"]; ok && leafIsKeyMaterial(k) {
				return true
			}
		}
	}
	return false
}

// inlinePatchSecret: a kustomization (kustomize's, or a Flux
// Kustomization's spec) whose inline patches write a plaintext Secret
// value: a strategic-merge patch holding a Secret (patches[].patch,
// patchesStrategicMerge entries written inline, Flux's
// patchesStrategicMerge objects), or a JSON 6902 patch targeting a Secret
// that adds a data or stringData value. kustomize applies the patch, so
// the value is in the built Secret as written here.
func inlinePatchSecret(data []byte) bool {
	for _, doc := range yamlDocs(data) {
		k := doc
		if api, _ := doc["apiVersion"].(string); doc["kind"] == "Kustomization" && strings.HasPrefix(api, "kustomize.toolkit.fluxcd.io/") {
			k, _ = doc["spec"].(map[string]any)
		}
		var patches []any
		for _, field := range []string{"patches", "patchesStrategicMerge", "patchesJson6902"} {
			if l, ok := k[field].([]any); ok {
				patches = append(patches, l...)
			}
		}
		for _, p := range patches {
			if patchWritesSecret(p) {
				return true
			}
		}
	}
	return false
}

func patchWritesSecret(p any) bool {
	switch t := p.(type) {
	case string:
		return strings.Contains(t, "\n") && isUnencryptedSecret([]byte(t), false)
	case map[string]any:
		if _, ok := t["kind"]; ok {
			return plaintextSecret(t, 0)
		}
		body, _ := t["patch"].(string)
		if body == "" {
			return false
		}
		if isUnencryptedSecret([]byte(body), false) {
			return true
		}
		target, _ := t["target"].(map[string]any)
		if target["kind"] != "Secret" {
			return false
		}
		var ops []map[string]any
		if yaml.Unmarshal([]byte(body), &ops) != nil {
			return false
		}
		for _, op := range ops {
			at, _ := op["path"].(string)
			if (strings.HasPrefix(at, "/data") || strings.HasPrefix(at, "/stringData")) && !secretValuesHoldNoSecret(op["value"], false) {
				return true
			}
		}
	}
	return false
}

// helmValuesHoldSecret: a Flux HelmRelease whose spec.values hold a
// credential: a secret-named key with a literal string (helmCredential),
// or an env entry {name: <secret-named>, value: <literal>}. A key whose
// value is a mapping (valueFrom.secretKeyRef) or a placeholder holds none,
// and neither does metadata (metadataMap, qualifiedKey).
func helmValuesHoldSecret(data []byte) bool {
	for _, doc := range yamlDocs(data) {
		api, _ := doc["apiVersion"].(string)
		if doc["kind"] != "HelmRelease" || !strings.HasPrefix(api, "helm.toolkit.fluxcd.io/") {
			continue
		}
		spec, _ := doc["spec"].(map[string]any)
		if valuesHoldSecret(spec["values"], false, 0) {
			return true
		}
	}
	return false
}

// valuesHoldSecret walks values; meta is set for the entries of a map of
// annotations or labels, whose keys say nothing about their values.
func valuesHoldSecret(v any, meta bool, depth int) bool {
	if depth > 32 {
		return false
	}
	switch t := v.(type) {
	case map[string]any:
		if name, ok := t["name"].(string); ok && !meta {
			if s, ok := t["value"].(string); ok && helmCredential(name, s) {
				return true
			}
		}
		for k, x := range t {
			if s, ok := x.(string); ok && !meta && !qualifiedKey.MatchString(k) && helmCredential(k, s) {
				return true
			}
			if valuesHoldSecret(x, metadataMap(k), depth+1) {
				return true
			}
		}
	case []any:
		for _, x := range t {
			if valuesHoldSecret(x, false, depth+1) {
				return true
			}
		}
	}
	return false
}

// helmCredential reports whether a values key and its string value are a
// credential written in git: the key names a secret (secretNamedKey) and
// the value is a literal (not a placeholder, holdsNoSecret) that is
// neither a boolean nor a Secret's name under a key that names a Secret.
//
// A boolean ("true", "false": OIDC_USE_ACCESS_TOKEN: "true") switches
// something on or off; no credential is a bare truth value. Numbers are
// not relaxed: "12345678" under password is a numeric password. A Secret's
// name is taken only where the key says it names a Secret object
// (secretObjectKey) and the value has a Kubernetes object name's shape
// (objectName): under clientSecret or secret the same lower-case string
// may be the credential itself, so those stay withheld.
func helmCredential(key, value string) bool {
	if !secretNamedKey(key) || holdsNoSecret(value) {
		return false
	}
	if v := strings.TrimSpace(value); strings.EqualFold(v, "true") || strings.EqualFold(v, "false") {
		return false
	}
	return !(secretObjectKey(key) && objectName(value))
}

// metadataMap reports whether a values key holds Kubernetes annotations
// or labels (annotations, podAnnotations, deploymentAnnotations, labels,
// podLabels, commonLabels): the chart writes them into an object's
// metadata, readable by anyone who can read the object, and their keys
// name what they configure, not what the value is. Reloader's
// secret.reloader.stakater.com/reload holds the name of the Secret to
// watch. A token in a known format is still withheld there by the token
// rules, which read the whole file.
func metadataMap(k string) bool {
	l := strings.ToLower(k)
	return strings.HasSuffix(l, "annotations") || strings.HasSuffix(l, "labels")
}

// qualifiedKey is a Kubernetes qualified name with a DNS prefix
// (prefix/name, the prefix a DNS subdomain with at least one dot), the
// shape of an annotation or label key (k8s.io/apimachinery
// validation.IsQualifiedName): secret.reloader.stakater.com/reload,
// nginx.ingress.kubernetes.io/auth-secret. Such a key in values is
// metadata wherever the chart takes it (bjw-s app-template takes
// annotations under controllers.<name>.annotations, others under
// maps of their own); chart settings are plain names.
var qualifiedKey = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

// secretObjectKey reports whether a key ending in Secret names a Secret
// object by what the Secret holds: githubConfigSecret (actions-runner-
// controller), configSecret (kube-prometheus-stack's alertmanagerSpec),
// envFromSecret (grafana), pullSecret (flux-operator's FluxInstance
// sync, as onedr0p/cluster-template renders it), imagePullSecret,
// tlsSecret, credentialsSecret, kubeconfigSecret. Keys that name a Secret by their form (existingSecret,
// secretName, secretRef) are not secret-named at all (secretNamedKey).
// The list is closed on purpose: clientSecret, jwtSecret, sharedSecret,
// cookieSecret, tunnelSecret and a bare secret hold the secret itself.
func secretObjectKey(k string) bool {
	l := strings.ToLower(strings.Map(func(r rune) rune {
		if r == '_' || r == '-' || r == '.' {
			return -1
		}
		return r
	}, k))
	what, ok := strings.CutSuffix(l, "secret")
	if !ok {
		return false
	}
	for _, s := range []string{"config", "envfrom", "tls", "cert", "certificate", "credentials", "creds", "kubeconfig", "pull"} {
		if strings.HasSuffix(what, s) {
			return true
		}
	}
	return false
}

// objectName reports whether a value has the shape of a Secret's name: a
// DNS-1123 subdomain (lower-case letters, digits, '-' and '.', at most 253
// characters, as the API server requires of a Secret's name) with no
// token-shaped run in it (literalBesidePlaceholder: 16 or more letters and
// digits, both present). A random credential of mixed case, symbols or a
// long hex run does not pass; a short lower-case word does, which is why
// only secretObjectKey keys take it.
func objectName(v string) bool {
	return len(v) <= 253 && dns1123Subdomain.MatchString(v) && !literalBesidePlaceholder(v)
}

var dns1123Subdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)

// secretNamedKey reports whether a values or env key names a secret
// itself (postgresPassword, adminPassword, apiToken, AWS_SECRET_ACCESS_KEY,
// clientSecret), not a reference to one (existingSecret, passwordKey,
// secretName, tokenSecretRef, passwordFile).
func secretNamedKey(k string) bool {
	l := strings.Map(func(r rune) rune {
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return -1
	}, k)
	for _, ref := range []string{"existing", "ref", "name", "file", "path", "enabled", "enable", "create", "mount", "length", "policy", "type", "selector", "passwordkey", "tokenkey", "userkey", "usernamekey", "secretkeyref"} {
		if strings.Contains(l, ref) {
			return false
		}
	}
	for _, s := range []string{"password", "passwd", "secret", "token", "apikey", "accesskey", "privatekey"} {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// dotenvNamedSecret: a file named *.env (a compose or app env file, a
// generator's env source) with an assignment whose key names a secret
// and whose value is a literal. Other values (LOG_LEVEL=debug) are
// configuration.
func dotenvNamedSecret(p string, data []byte) string {
	if !strings.HasSuffix(backedUp(path.Base(p)), ".env") || sopsDotenvSealed(data) {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := dotenvAssignment.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		key, _, _ := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if secretNamedKey(strings.TrimSpace(key)) && !holdsNoSecret(unquote(strings.TrimSpace(m[1]))) {
			return RuleDotEnv
		}
	}
	return ""
}
