package gitsnap

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
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

// sniffLimit bounds the files whose content is inspected for credentials:
// kubeconfigs, talosconfigs and keys are small, and reading past this would
// only slow snapshots of large assets.
const sniffLimit = 1 << 20

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
}

func newExcluder(patterns []string) (*excluder, error) {
	var ps []gitignore.Pattern
	for _, p := range patterns {
		if strings.TrimSpace(p) == "" {
			return nil, errors.New("snapshot exclude patterns: empty pattern")
		}
		ps = append(ps, gitignore.ParsePattern(p, nil))
	}
	return &excluder{configured: gitignore.NewMatcher(ps)}, nil
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
	base := path.Base(p)
	switch {
	case base == "kubeconfig" || strings.HasSuffix(base, ".kubeconfig"):
		return RuleKubeconfig
	case base == "talosconfig" || strings.HasSuffix(base, ".talosconfig"):
		return RuleTalosconfig
	case base == "secrets.yaml" || base == "secrets.yml":
		return RuleSecretsBundle
	case strings.HasSuffix(base, ".age") || strings.HasSuffix(base, ".agekey"):
		return RuleAgeKey
	case base == ".env" || strings.HasPrefix(base, ".env."):
		return RuleDotEnv
	}
	if x.configured.Match(parts, false) {
		return RuleConfiguredExclude
	}
	return ""
}

// byContent returns the rule that excludes a regular file with this content
// whatever its name, or "". Cheap byte checks come first so only likely
// candidates are parsed.
func (x *excluder) byContent(data []byte) string {
	if len(data) > sniffLimit {
		return ""
	}
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

// isUnencryptedSecret: a core/v1 Secret with data or stringData and no
// top-level sops metadata (what `sops --encrypt` adds).
func isUnencryptedSecret(data []byte) bool {
	for _, doc := range yamlDocs(data) {
		if doc["kind"] != "Secret" || doc["apiVersion"] != "v1" {
			continue
		}
		if _, encrypted := doc["sops"]; encrypted {
			continue
		}
		d, _ := doc["data"].(map[string]any)
		sd, _ := doc["stringData"].(map[string]any)
		if len(d) > 0 || len(sd) > 0 {
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

// yamlDocs decodes every YAML (or JSON) document in data as a generic map;
// anything that does not parse ends the list.
func yamlDocs(data []byte) []map[string]any {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []map[string]any
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) || err != nil {
			return docs
		}
		if m != nil {
			docs = append(docs, m)
		}
	}
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
