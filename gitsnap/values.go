package gitsnap

import (
	"regexp"
	"strings"
)

// A value in a manifest holds a secret unless it is one of the things
// GitOps repositories keep in place of a secret: nothing at all, a SOPS
// ciphertext, a template the value is rendered from, a variable Flux
// substitutes after the build, or a reference a secret store resolves.
// The guard judges values, not keys: a Secret whose every value is such a
// placeholder is served, one with a literal value is not.

// templateAction matches one template action: Go templates as Helm renders
// charts ({{ … }}, with the trim markers {{- … -}}), Jinja expressions and
// statements ({{ … }}, {% … %}, {# … #}), and makejinja's delimiters as
// onedr0p/cluster-template configures them (#{ … }#, #% … %#).
var templateAction = regexp.MustCompile(`\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}|#\{.*?\}#|#%.*?%#`)

// actionWritesLiteral reports whether a template action writes a string
// literal kept in the template itself: in Go templates (text/template, as
// Helm renders them) and Jinja a literal is written wherever it stands in
// the pipeline ({{ "x" | b64enc }}, {{ b64enc "x" }}, {{ .Values.pw |
// default "x" }}, {{ printf "%s" "x" }}, {{ pw | default("x") }}). A
// quoted string does not count when it names something instead of being
// written: a template (include, template), a message (required, fail), a
// key (index, hasKey, lookup), an operand of a comparison, printf's
// format; nor when it holds no letter or digit (a separator). Control
// actions, assignments, comments and Jinja statements write nothing.
func actionWritesLiteral(a string) bool {
	inner := a
	switch {
	case strings.HasPrefix(a, "{{"):
		inner = strings.TrimSuffix(strings.TrimPrefix(a, "{{"), "}}")
	case strings.HasPrefix(a, "#{"):
		inner = strings.TrimSuffix(strings.TrimPrefix(a, "#{"), "}#")
	default: // {% %}, {# #}, #% %#: statements and comments
		return false
	}
	inner = strings.TrimSpace(strings.Trim(strings.TrimSpace(inner), "-"))
	if controlAction.MatchString(inner) || assignment.MatchString(inner) {
		return false
	}
	inner = namingCall.ReplaceAllStringFunc(inner, func(m string) string { return quoted.ReplaceAllString(m, "") })
	inner = printfFormat.ReplaceAllString(inner, "printf ")
	for _, q := range quoted.FindAllString(inner, -1) {
		if strings.IndexFunc(q, func(r rune) bool { return r >= '0' && r <= '9' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' }) >= 0 {
			return true
		}
	}
	return false
}

var (
	quoted        = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'[^']*'|` + "`[^`]*`")
	controlAction = regexp.MustCompile(`^(?:if|else|end|with|range|define|block|template|break|continue|/\*|#)\b|^/\*`)
	assignment    = regexp.MustCompile(`^\$[A-Za-z0-9_]*\s*:?=`)
	// namingCall is a call whose quoted arguments name things (up to the
	// next pipe or closing parenthesis).
	namingCall   = regexp.MustCompile(`\b(?:include|template|required|fail|index|hasKey|lookup|eq|ne|lt|le|gt|ge|hasPrefix|hasSuffix|contains|semverCompare|regexMatch|tpl|env|getenv|expandenv)\b[^|)]*`)
	printfFormat = regexp.MustCompile(`\bprintf\s*\(?\s*(?:"(?:[^"\\]|\\.)*"|'[^']*')`)
)

// substitution matches Flux's post-build variables, ${NAME} with an
// optional default (${NAME:=default}, ${NAME:-default}, ${NAME=default}):
// fluxcd/pkg/kustomize v1.35.6 kustomize_varsub.go (varsubRegex for the
// name, SubstituteWithAlways's "${MYFOO:=bar}" for defaults), as
// kustomize-controller v1.9.5 runs it; talhelper's envsubst files use the
// same form, and other renderers use dotted names (${cluster.ca.key}),
// taken too. The bare $NAME form is not: Flux leaves it as written.
var substitution = regexp.MustCompile(`\$\{([_A-Za-z][_A-Za-z0-9.]*)(?::?[-=]([^}]*))?\}`)

// storeReference matches references a secret store resolves at deploy
// time: 1Password's secret references (op://vault/item[/section]/field,
// what `op inject` and the 1Password operators resolve) and vals'
// ref+<backend>:// references (helmfile, the vals CLI).
var storeReference = regexp.MustCompile(`\bop://[^\s"']+|\bref\+[a-z0-9]+://[^\s"']+`)

// grafanaReference matches Grafana's variable expansion in its
// configuration (grafana.ini and its GF_ environment; Grafana docs,
// "Configure Grafana", Variable expansion): $__env{NAME} is read from
// Grafana's environment, $__file{/path} from a file, $__vault{…} from a
// secret store, when Grafana starts. Like ${NAME}, what git holds is the
// reference. Flux leaves it alone (it substitutes only ${NAME}).
var grafanaReference = regexp.MustCompile(`\$__(?:env|file|vault)\{[^}]*\}`)

// urlPassword finds a literal password in a URL's user information
// (scheme://user:password@host) left after the placeholders are removed.
var urlPassword = regexp.MustCompile(`://[^/\s:@]*:[^/\s@]+@`)

// holdsNoSecret reports whether a scalar value holds no secret: it is
// empty (sops itself leaves "" unencrypted), a SOPS ciphertext (ENC[…]),
// or every line of it is blank, structural punctuation, or holds a
// template action, a substitution, a secret-store reference or a
// Grafana reference ($__env{NAME}, grafanaReference). A line that
// mixes a placeholder with literal text ("postgres://app:${DB_PASSWORD}@db")
// holds no secret unless the literal part holds one itself
// (literalBesidePlaceholder); a line of literal text only (token = "abc")
// does. A template that writes a string literal (actionWritesLiteral) is
// literal text, and so is a substitution's non-empty default. A bare $NAME
// is literal too: Flux substitutes only ${NAME} (fluxcd/pkg envsubst
// README, "expanding variables in a string using ${var} syntax"), so
// "$Passw0rd" is the password applied.
func holdsNoSecret(v string) bool {
	t := strings.TrimSpace(v)
	if t == "" || isSOPSValue(t) {
		return true
	}
	for _, line := range strings.Split(t, "\n") {
		if !lineHoldsNoSecret(line) {
			return false
		}
	}
	return true
}

func lineHoldsNoSecret(line string) bool {
	l := strings.TrimSpace(line)
	if l == "" || isSOPSValue(unquote(l)) || strings.Trim(l, `{}[](),;"'`) == "" {
		return true
	}
	placeholder := false
	for _, a := range templateAction.FindAllString(l, -1) {
		if actionWritesLiteral(a) {
			return false
		}
		placeholder = true
	}
	rest := templateAction.ReplaceAllString(l, "")
	for _, m := range substitution.FindAllStringSubmatch(rest, -1) {
		if def := strings.TrimSpace(m[2]); def != "" && !holdsNoSecret(def) {
			return false
		}
		placeholder = true
	}
	rest = substitution.ReplaceAllString(rest, "")
	for _, re := range []*regexp.Regexp{storeReference, grafanaReference} {
		if re.MatchString(rest) {
			placeholder = true
			rest = re.ReplaceAllString(rest, "")
		}
	}
	return placeholder && !literalBesidePlaceholder(rest)
}

// literalBesidePlaceholder reports whether what is left of a line once its
// placeholders are taken out still holds a secret: Flux substitutes
// ${VAR} and leaves the rest of the string as written (fluxcd/pkg
// envsubst), so a password beside a host variable is in git as it is
// applied. It looks for a URL password (scheme://user:pass@), a
// credential assignment (password=…, "password":"…", Password=…; as JDBC,
// ADO.NET and docker config JSON write them) and a token-shaped run (16 or
// more letters and digits, both present, as webhook tokens are), not a
// digest.
func literalBesidePlaceholder(rest string) bool {
	if urlPassword.MatchString(rest) || credentialAssignment.MatchString(rest) {
		return true
	}
	for _, m := range tokenRun.FindAllStringIndex(rest, -1) {
		run := rest[m[0]:m[1]]
		if strings.ContainsAny(run, "0123456789") && strings.IndexFunc(run, func(r rune) bool { return r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' }) >= 0 && !digestPrefix.MatchString(rest[:m[0]]) {
			return true
		}
	}
	return false
}

var (
	credentialAssignment = regexp.MustCompile(`(?i)(?:pass(?:word|wd)?|pwd|secret|token|api[_-]?key)["']?\s*[:=]\s*["']?[^\s"';&,}]{3,}`)
	tokenRun             = regexp.MustCompile(`[A-Za-z0-9]{16,}`)
	digestPrefix         = regexp.MustCompile(`(?i)sha(?:1|256|512):$`)
)

// isSOPSValue: a value as sops encrypts it (ENC[AES256_GCM,data:…]).
func isSOPSValue(s string) bool { return strings.HasPrefix(s, "ENC[") }

func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '"' || s[0] == '\'') && s[len(s)-1] == s[0] {
		return s[1 : len(s)-1]
	}
	return s
}

// leavesHoldNoSecret reports whether every leaf of a decoded YAML value
// holds no secret. Numbers and booleans are literal data.
func leavesHoldNoSecret(v any) bool {
	switch t := v.(type) {
	case map[string]any:
		for _, x := range t {
			if !leavesHoldNoSecret(x) {
				return false
			}
		}
		return true
	case []any:
		for _, x := range t {
			if !leavesHoldNoSecret(x) {
				return false
			}
		}
		return true
	case string:
		return holdsNoSecret(t)
	case nil:
		return true
	default:
		return false
	}
}

// leafIsKeyMaterial reports whether a leaf of a Talos file holds key
// material. Unlike holdsNoSecret a SOPS ciphertext counts: the keys of a
// whole cluster are not served even encrypted.
func leafIsKeyMaterial(v any) bool {
	s, ok := v.(string)
	if !ok {
		return v != nil
	}
	return isSOPSValue(strings.TrimSpace(s)) || !holdsNoSecret(s)
}
