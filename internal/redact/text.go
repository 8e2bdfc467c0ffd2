package redact

import (
	"math"
	"regexp"
	"strings"
)

// Text returns s with every secret recognised by its shape masked, wherever
// it stands in the text: a URL's user information (scheme://user:pass@,
// scheme://token@, and user:pass@host without a scheme, as image
// references and NFS servers are written), the value of a query or
// fragment parameter whose name says it carries a credential (SecretParam),
// age identities in any case (classic and post-quantum), the token formats
// of the services our users run (GitHub, GitLab, Slack, ntfy, Matrix,
// AWS access keys, JWTs, PEM private key blocks) and a Proxmox API token
// in its header form (user@realm!name=secret). It is what every output
// applies (validate's messages, the logs, the console, state, reports and
// notifications): a value is masked by what it looks like, not by which
// field it came from, so a new field needs nothing to be covered.
func Text(s string) string {
	if s == "" {
		return s
	}
	s = pemBlock.ReplaceAllString(s, Mask)
	s = schemeUserinfo.ReplaceAllStringFunc(s, maskSchemeUserinfo)
	s = bareUserinfo.ReplaceAllString(s, "${1}${2}:"+Mask+"@${4}")
	s = pveToken.ReplaceAllString(s, "${1}="+Mask)
	s = param.ReplaceAllStringFunc(s, maskParam)
	s = authHeader.ReplaceAllString(s, "${1}"+Mask)
	for _, re := range tokenShapes {
		s = re.ReplaceAllString(s, Mask)
	}
	return s
}

// Value returns v masked for quoting in a message about a value that was
// supposed to be a name, a path, a host or a reference: Text, and then
// every long high-entropy word (a pasted API secret, an S3 key, a UUID
// token) masked too. A name or a path never holds one; a secret typed in
// the wrong place usually is one.
func Value(v string) string {
	v = Text(v)
	return entropyWord.ReplaceAllStringFunc(v, func(w string) string {
		// An age recipient is a public key, quoted to say which.
		if HighEntropy(w) && !strings.HasPrefix(strings.ToLower(w), "age1") {
			return Mask
		}
		return w
	})
}

// HighEntropy reports whether w looks random rather than written: a UUID,
// or at least 16 characters mixing letters and digits with a high
// per-character entropy (words, version strings and dates stay below it).
func HighEntropy(w string) bool {
	if uuidShape.MatchString(w) {
		return true
	}
	if len(w) < 16 {
		return false
	}
	var letters, digits int
	for _, r := range w {
		switch {
		case r >= '0' && r <= '9':
			digits++
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
			letters++
		}
	}
	if letters < 2 || digits < 2 || longestAlnumRun(w) < 12 {
		return false
	}
	return entropy(w) >= 3.5
}

// longestAlnumRun is the length of w's longest run of letters and digits:
// a random string has long ones, a name made of words joined by '-' or '_'
// and a version number has short ones.
func longestAlnumRun(w string) int {
	best, run := 0, 0
	for _, r := range w {
		if r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' {
			run++
			best = max(best, run)
		} else {
			run = 0
		}
	}
	return best
}

// entropy is the Shannon entropy of s in bits per character.
func entropy(s string) float64 {
	counts := map[rune]int{}
	n := 0
	for _, r := range s {
		counts[r]++
		n++
	}
	var h float64
	for _, c := range counts {
		p := float64(c) / float64(n)
		h -= p * math.Log2(p)
	}
	return h
}

// SecretParam reports whether a query or fragment parameter's name says
// its value is a credential: passwords (pass, pwd, passwd, password),
// tokens (token, access_token, private_token, auth_token), secrets and
// keys (secret, client_secret, key, apikey, api_key), signatures (sig,
// signature, X-Amz-Signature) and credentials (X-Amz-Credential).
func SecretParam(name string) bool {
	n := strings.ToLower(name)
	for _, w := range []string{"token", "passw", "secret", "apikey", "signature", "credential", "session"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	for _, part := range strings.FieldsFunc(n, func(r rune) bool { return r == '_' || r == '-' || r == '.' }) {
		switch part {
		case "pass", "pwd", "pw", "key", "sig", "authorization", "jwt", "bearer", "cred", "creds", "psk":
			return true
		}
	}
	return false
}

var (
	// scheme://userinfo@ (or scheme:/ once a path cleaning took a slash)
	// — the user information ends at the first of
	// "/?#@" (RFC 3986); whitespace, quotes and backslashes end a URL
	// quoted in a message or a JSON log line.
	schemeUserinfo = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*:/{1,2})([^\s/?#@"'<>\\]+)@`)
	// user:secret@host.domain without a scheme (registry credentials
	// pasted before an image reference, an NFS server as user:pass@host).
	bareUserinfo = regexp.MustCompile(`(^|[\s"'(=,\[])([A-Za-z0-9._~-]+):([^\s@/"'<>\\]+)@([A-Za-z0-9-]+\.[A-Za-z0-9.-]+)`)
	// A Proxmox API token as the Authorization header carries it:
	// user@realm!tokenid=secret (PVE's PVEAPIToken form; a colon is taken too).
	pveToken = regexp.MustCompile(`([A-Za-z0-9._-]+@[A-Za-z0-9._-]+![A-Za-z][A-Za-z0-9._-]*)[=:][^\s"',;&<>\\]+`)
	// ?name=value, &name=value, #name=value, ;name=value.
	// zerolog writes & as \u0026 inside a JSON string.
	param = regexp.MustCompile(`(\\u0026|[?&#;])([A-Za-z0-9_.\-\[\]]+)=([^&#;\s"'<>\\]*)`)
	// Authorization headers and bearer tokens quoted in errors.
	authHeader = regexp.MustCompile(`(\b(?:Bearer|Basic) +)[A-Za-z0-9._~+/-]{16,}=*`)
	pemBlock   = regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----[\s\S]*?(-----END [A-Z0-9 ]*PRIVATE KEY( BLOCK)?-----|$)`)
	// tokenShapes are secrets whose own format says what they are.
	tokenShapes = []*regexp.Regexp{
		// age identities: bech32 allows either case, never mixed, and
		// the post-quantum ones are far longer.
		regexp.MustCompile(`(?i)AGE-SECRET-KEY-(PQ-)?1[02-9ac-hj-np-z]{16,}`),
		// GitHub: classic and fine-grained personal, OAuth, user-to-server,
		// server-to-server and refresh tokens.
		regexp.MustCompile(`\b(gh[pousr]_[A-Za-z0-9]{16,}|github_pat_[A-Za-z0-9_]{16,})`),
		// GitLab: personal, pipeline trigger, deploy, runner, OAuth,
		// CI build, feed and incoming mail tokens.
		regexp.MustCompile(`\b(glpat|glptt|gldt|glrt|gloas|glcbt|glft|glimt|glsoat|glagent)-[A-Za-z0-9_.-]{16,}`),
		// Slack bot, user, app-level and refresh tokens.
		regexp.MustCompile(`\b(xox[abeoprs]|xapp|xoxe\.xox[bp])-[A-Za-z0-9-]{10,}`),
		// ntfy access tokens, Matrix access tokens, Gotify 3 tokens,
		// Tailscale auth keys, OpenAI-style keys.
		regexp.MustCompile(`\b(tk_[a-z0-9]{20,}|syt_[A-Za-z0-9_=]{10,}|gtfy[ac]\.[A-Za-z0-9_.-]{10,}|tskey-[A-Za-z0-9-]{10,}|sk-[A-Za-z0-9_-]{20,})`),
		// AWS access key IDs (long-term and temporary).
		regexp.MustCompile(`\b(AKIA|ASIA|AGPA|AROA)[0-9A-Z]{16}\b`),
		// JSON Web Tokens (three base64url parts, the first a JSON header).
		regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}`),
		// A Telegram bot token (id:secret).
		regexp.MustCompile(`\b[0-9]{8,10}:[A-Za-z0-9_-]{35}\b`),
	}
	uuidShape   = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	entropyWord = regexp.MustCompile(`[A-Za-z0-9+=_-]{16,}`)
)

func maskSchemeUserinfo(m string) string {
	sub := schemeUserinfo.FindStringSubmatch(m)
	scheme, info := sub[1], sub[2]
	user, _, hasPass := strings.Cut(info, ":")
	switch {
	case hasPass:
		// The user name stays readable (root:[REDACTED]@); a token
		// written as the password of an empty user (ntfy, :tok@) too.
		return scheme + user + ":" + Mask + "@"
	case strings.Contains(strings.ToLower(scheme), "ssh") && !HighEntropy(user) && len(user) < 40:
		// An ssh URL's user is the login (ssh://git@host): the key
		// authenticates, the name is no secret.
		return m
	}
	// A lone user name is how tokens travel (https://TOKEN@host).
	return scheme + Mask + "@"
}

func maskParam(m string) string {
	sub := param.FindStringSubmatch(m)
	if sub[3] == "" || sub[3] == Mask || !SecretParam(sub[2]) {
		return m
	}
	return sub[1] + sub[2] + "=" + Mask
}
