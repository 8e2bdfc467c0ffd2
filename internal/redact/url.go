package redact

import (
	"net/url"
	"strings"
)

// URL returns raw with its credentials masked: the user information
// (user:password@, or a token in the user name) and the value of every
// query parameter whose name says it carries a secret. A string that does
// not parse as a URL with a scheme comes back as it is, except that
// anything between "://" and "@" is masked: a credential must not survive
// a typo elsewhere in the URL.
func URL(raw string) string {
	masked, _ := urlSecrets(raw)
	return masked
}

// URLSecrets returns the credentials a URL holds (user information and
// secret query values), for a Set to mask wherever they appear.
func URLSecrets(raw string) []string {
	_, secrets := urlSecrets(raw)
	return secrets
}

func urlSecrets(raw string) (string, []string) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.Scheme == "" || u.Opaque != "" {
		return userinfoFallback(raw)
	}
	var secrets []string
	if u.User != nil {
		if p, ok := u.User.Password(); ok {
			secrets = append(secrets, p)
			u.User = url.UserPassword(u.User.Username(), Mask)
		} else if !strings.Contains(u.Scheme, "ssh") {
			// A lone user name is how tokens travel (https://TOKEN@host).
			// An ssh URL's user is the login (ssh://git@host/repo): the key
			// authenticates, the name is no secret.
			secrets = append(secrets, u.User.Username())
			u.User = url.User(Mask)
		}
	}
	if u.RawQuery != "" {
		q := u.Query()
		secrets = append(secrets, maskParams(q)...)
		u.RawQuery = q.Encode()
	}
	// A fragment written as parameters (#access_token=…, as OAuth's
	// implicit flow hands tokens over) is masked the same way.
	if strings.Contains(u.Fragment, "=") {
		if f, err := url.ParseQuery(u.EscapedFragment()); err == nil {
			if found := maskParams(f); len(found) > 0 {
				secrets = append(secrets, found...)
				u.Fragment, u.RawFragment = strings.ReplaceAll(f.Encode(), url.QueryEscape(Mask), Mask), ""
			}
		}
	}
	if len(secrets) == 0 {
		return raw, nil
	}
	return strings.ReplaceAll(u.String(), url.QueryEscape(Mask), Mask), secrets
}

// userinfoFallback masks what sits between "://" and the next "@" of a
// string that is not a parsable URL.
func userinfoFallback(raw string) (string, []string) {
	i := strings.Index(raw, "://")
	if i < 0 {
		return raw, nil
	}
	rest := raw[i+3:]
	at := strings.IndexByte(rest, '@')
	if at < 0 || strings.ContainsAny(rest[:at], "/?#") {
		return raw, nil
	}
	info := rest[:at]
	secrets := []string{info}
	if _, p, ok := strings.Cut(info, ":"); ok && p != "" {
		secrets = append(secrets, p)
	}
	return raw[:i+3] + Mask + rest[at:], secrets
}

// maskParams masks, in place, the non-empty values of the parameters
// whose name says they carry a credential (SecretParam) and returns them.
func maskParams(vals url.Values) []string {
	var secrets []string
	for k, vs := range vals {
		if !SecretParam(k) {
			continue
		}
		for i, v := range vs {
			if v != "" {
				secrets = append(secrets, v)
				vs[i] = Mask
			}
		}
	}
	return secrets
}
