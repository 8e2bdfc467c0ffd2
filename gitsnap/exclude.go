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
)

// tokenRules are the token formats looked for in every inspected file: a
// small documented set instead of a detector library (the maintained ones,
// such as gitleaks, would add their rule engines and dependencies to the
// product binary). Each needs its literal prefix before the pattern runs.
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
	{"age secret key", "AGE-SECRET-KEY-1", regexp.MustCompile(`AGE-SECRET-KEY-1[0-9A-Z]{58}`)},
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
// as much as one at the top.
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
	base := path.Base(p)
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

// byEncryptedName returns the rule of a name that usually holds secrets
// (secrets.yaml, *.age, .env*) when the content is not encrypted, or "".
// Flux layouts keep SOPS-encrypted Secrets under exactly these names, so
// an encrypted one is served: kustomize-controller decrypts it.
func byEncryptedName(p string, data []byte) string {
	base := path.Base(p)
	switch {
	case base == "secrets.yaml" || base == "secrets.yml":
		if !sopsSealed(data) {
			return RuleSecretsBundle
		}
	case strings.HasSuffix(base, ".age"):
		if !isAgeCiphertext(data) {
			return RuleAgeKey
		}
	case base == ".env" || strings.HasPrefix(base, ".env."):
		if !sopsDotenvSealed(data) {
			return RuleDotEnv
		}
	}
	return ""
}

// byContent returns the rule that excludes a regular file with this content
// whatever its name, or "". Cheap byte checks come first so only likely
// candidates are parsed.
//
// Every file is inspected whatever its size: a credential appended to a
// large manifest leaks as much as a small one, and the snapshot holds the
// whole file in memory anyway.
func (x *excluder) byContent(data []byte) string {
	if isPrivateKey(data) {
		return RulePrivateKey
	}
	if bytes.Contains(data, []byte("users")) && bytes.Contains(data, []byte("Config")) && isKubeconfigWithCredentials(data) {
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
	if bytes.Contains(data, []byte("Secret")) && isUnencryptedSecret(data) {
		return RuleUnencryptedSecret
	}
	for _, t := range tokenRules {
		if bytes.Contains(data, []byte(t.prefix)) && t.re.Match(data) {
			return RuleTokenPrefix + t.name
		}
	}
	return ""
}

// isTalosMachineConfig: a document with version v1alpha1 and a machine
// section, the v1alpha1 config root (talos pkg/machinery/config/types/
// v1alpha1 Config: version, machine, cluster).
func isTalosMachineConfig(data []byte) bool {
	for _, doc := range yamlDocs(data) {
		if _, ok := doc["machine"].(map[string]any); ok && doc["version"] == "v1alpha1" {
			return true
		}
	}
	return false
}

// isUnencryptedSecret: a core/v1 Secret with data or stringData that is
// not fully SOPS-encrypted, at the top level or inside any *List's items.
// A document that does not parse but names kind Secret counts too: git
// serves its bytes whether or not kustomize could read them.
func isUnencryptedSecret(data []byte) bool {
	for _, chunk := range splitYAMLDocs(data) {
		if !bytes.Contains(chunk, []byte("Secret")) {
			continue
		}
		var doc map[string]any
		if err := yaml.Unmarshal(chunk, &doc); err != nil {
			if secretKindLine.Match(chunk) {
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

// plaintextSecret judges one decoded object: a Secret whose data or
// stringData holds a value that is not an ENC[...] string, or whose sops
// metadata has no MAC (what `sops --encrypt` always writes: getsops/sops
// v3.11.0 stores/stores.go Metadata.MessageAuthenticationCode, "mac").
// A value left in plaintext by encrypted_regex or an unencrypted suffix is
// plaintext once served. Lists (kind v1 List, or any *List) are searched
// through their items.
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
	d, _ := doc["data"].(map[string]any)
	sd, _ := doc["stringData"].(map[string]any)
	if len(d) == 0 && len(sd) == 0 {
		return false
	}
	if !sopsMetadataSealed(doc) {
		return true
	}
	return !allEncrypted(d) || !allEncrypted(sd)
}

// allEncrypted reports whether every leaf value of v is an ENC[...] string.
func allEncrypted(v any) bool {
	switch t := v.(type) {
	case map[string]any:
		for _, x := range t {
			if !allEncrypted(x) {
				return false
			}
		}
		return true
	case []any:
		for _, x := range t {
			if !allEncrypted(x) {
				return false
			}
		}
		return true
	case string:
		return strings.HasPrefix(t, "ENC[")
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
// value encrypted.
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
		if !strings.HasPrefix(value, "ENC[") {
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
// bundle. SOPS keeps key names in plaintext, so an encrypted bundle is
// recognised too.
func isTalosSecretsBundle(data []byte) bool {
	for _, doc := range yamlDocs(data) {
		_, certs := doc["certs"].(map[string]any)
		_, trustd := doc["trustdinfo"].(map[string]any)
		_, cluster := doc["cluster"].(map[string]any)
		if certs && trustd && cluster {
			return true
		}
	}
	return false
}

func isPrivateKey(data []byte) bool {
	i := bytes.Index(data, []byte("-----BEGIN "))
	if i < 0 {
		return false
	}
	line := data[i:]
	if j := bytes.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	return bytes.Contains(line, []byte("PRIVATE KEY-----"))
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

func isKubeconfigWithCredentials(data []byte) bool {
	for _, doc := range yamlDocs(data) {
		if doc["kind"] != "Config" {
			continue
		}
		users, _ := doc["users"].([]any)
		for _, u := range users {
			um, _ := u.(map[string]any)
			user, _ := um["user"].(map[string]any)
			for _, k := range []string{"client-key-data", "client-key", "token", "tokenFile", "password", "auth-provider", "exec"} {
				if v, ok := user[k]; ok && v != nil && v != "" {
					return true
				}
			}
		}
	}
	return false
}

func isTalosconfigWithKey(data []byte) bool {
	for _, doc := range yamlDocs(data) {
		contexts, _ := doc["contexts"].(map[string]any)
		for _, c := range contexts {
			cm, _ := c.(map[string]any)
			if k, _ := cm["key"].(string); k != "" {
				return true
			}
		}
	}
	return false
}
