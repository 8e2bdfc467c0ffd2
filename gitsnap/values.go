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

// templateLiteral finds an action whose pipeline starts with a quoted
// string ({{ "hunter2" | b64enc }}): the value is then written in the
// template itself, not taken from values or a variable.
var templateLiteral = regexp.MustCompile(`^(\{\{|\{%|#\{)-?\s*("[^"]*"|'[^']*'|` + "`[^`]*`" + `)`)

// substitution matches Flux's post-build variables, ${NAME} with an
// optional default (${NAME:=default}, ${NAME:-default}, ${NAME=default}):
// fluxcd/pkg/kustomize v1.35.6 kustomize_varsub.go (varsubRegex for the
// name, SubstituteWithAlways's "${MYFOO:=bar}" for defaults), as
// kustomize-controller v1.9.5 runs it; talhelper's envsubst files use the
// same form, and other renderers use dotted names (${cluster.ca.key}),
// taken too. The bare $NAME form is not: a password may hold '$'.
var substitution = regexp.MustCompile(`\$\{([_A-Za-z][_A-Za-z0-9.]*)(?::?[-=]([^}]*))?\}`)

// shellVariable is a value that is wholly $NAME, as envsubst and shell
// templates write a variable; only the whole value counts (a password
// may hold '$').
var shellVariable = regexp.MustCompile(`^\$[A-Za-z_][A-Za-z0-9_]*$`)

// storeReference matches references a secret store resolves at deploy
// time: 1Password's secret references (op://vault/item[/section]/field,
// what `op inject` and the 1Password operators resolve) and vals'
// ref+<backend>:// references (helmfile, the vals CLI).
var storeReference = regexp.MustCompile(`\bop://[^\s"']+|\bref\+[a-z0-9]+://[^\s"']+`)

// urlPassword finds a literal password in a URL's user information
// (scheme://user:password@host) left after the placeholders are removed.
var urlPassword = regexp.MustCompile(`://[^/\s:@]*:[^/\s@]+@`)

// holdsNoSecret reports whether a scalar value holds no secret: it is
// empty (sops itself leaves "" unencrypted), a SOPS ciphertext (ENC[…]),
// or every line of it is blank, structural punctuation, or holds a
// template action, a substitution or a secret-store reference. A line that
// mixes a placeholder with literal text ("postgres://app:${DB_PASSWORD}@db")
// holds no secret unless the literal part is itself a URL password; a line
// of literal text only (token = "abc") does. A template that writes a
// string literal ({{ "x" | b64enc }}) is literal text, and so is a
// substitution's non-empty default.
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
	if l == "" || isSOPSValue(unquote(l)) || strings.Trim(l, `{}[](),;"'`) == "" || shellVariable.MatchString(unquote(l)) {
		return true
	}
	placeholder := false
	for _, a := range templateAction.FindAllString(l, -1) {
		if templateLiteral.MatchString(a) {
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
	if storeReference.MatchString(rest) {
		placeholder = true
		rest = storeReference.ReplaceAllString(rest, "")
	}
	return placeholder && !urlPassword.MatchString(rest)
}

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
