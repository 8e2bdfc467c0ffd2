package pveapi

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// PrivsAt answers the privileges a caller holds on an ACL path.
type PrivsAt func(path string) map[string]bool

// Denied is a refused permission check: What is raise_perm_exc's detail
// ("/vms/100, VM.Audit"), empty for the bare "Permission check failed".
type Denied struct{ What string }

func (d *Denied) Error() string {
	if d.What == "" {
		return "Permission check failed"
	}
	return "Permission check failed (" + d.What + ")"
}

// ErrUnsupportedCheck is returned for check kinds this package does not
// evaluate (userid-param, userid-group, perm-modify: user and ACL
// administration, which neither the product nor pvesim use).
var ErrUnsupportedCheck = errors.New("permission check kind not evaluated here")

// CheckPermissions is check_api2_permissions (pve-access-control
// src/PVE/RPCEnvironment.pm, 9.1.1) for an authenticated user that is not
// root@pam, with params the request's parameters merged with the path's.
// token says the caller is an API token: a method without allowtoken
// refuses it (pve-manager PVE/HTTPServer.pm rest_handler); rel is the
// request's path below /api2/json for that message.
func (m *Method) CheckPermissions(privs PrivsAt, params map[string]string, token bool, rel string) error {
	if token && !m.AllowToken {
		return &Denied{What: "URI '" + rel + "' not available with API token, need proper ticket.\n"}
	}
	p := m.Permissions
	if p == nil {
		return &Denied{What: "user != root@pam"}
	}
	if p.User == "all" || p.User == "world" {
		return nil
	}
	if len(p.Check) == 0 {
		return &Denied{}
	}
	ok, err := execCheck(p.Check, privs, params, false)
	if err != nil {
		return err
	}
	if !ok {
		return &Denied{}
	}
	return nil
}

var tmplRE = regexp.MustCompile(`\{([^}]+)\}`)

// execCheck is exec_api2_perm_check for and, or and perm.
func execCheck(check []any, privs PrivsAt, params map[string]string, noerr bool) (bool, error) {
	if len(check) == 0 {
		return false, errors.New("no permission test specified")
	}
	test, _ := check[0].(string)
	switch test {
	case "and":
		for _, sub := range check[1:] {
			sc, _ := sub.([]any)
			if _, err := execCheck(sc, privs, params, false); err != nil {
				return false, err
			}
		}
		return true, nil
	case "or":
		for _, sub := range check[1:] {
			sc, _ := sub.([]any)
			ok, err := execCheck(sc, privs, params, true)
			if err != nil {
				return false, err
			}
			if ok {
				return true, nil
			}
		}
		if noerr {
			return false, nil
		}
		return false, &Denied{}
	case "perm":
		path, want, any, requireParam, err := PermCheck(check)
		if err != nil {
			return false, err
		}
		if requireParam != "" {
			if _, ok := params[requireParam]; !ok {
				if noerr {
					return false, nil
				}
				return false, &Denied{}
			}
		}
		path = NormalizePath(tmplRE.ReplaceAllStringFunc(path, func(m string) string {
			return params[strings.Trim(m, "{}")]
		}))
		have := privs(path)
		if any {
			for _, pr := range want {
				if have[pr] {
					return true, nil
				}
			}
			if noerr {
				return false, nil
			}
			return false, &Denied{What: path + ", " + strings.Join(want, "|")}
		}
		for _, pr := range want {
			if !have[pr] {
				if noerr {
					return false, nil
				}
				return false, &Denied{What: path + ", " + pr}
			}
		}
		return true, nil
	}
	return false, fmt.Errorf("%w: %q", ErrUnsupportedCheck, test)
}

// PermCheck reads a ["perm", path, [privs], options…] check.
func PermCheck(check []any) (path string, privs []string, anyOf bool, requireParam string, err error) {
	if len(check) < 3 {
		return "", nil, false, "", errors.New("missing parameters")
	}
	path, _ = check[1].(string)
	list, _ := check[2].([]any)
	for _, p := range list {
		if s, ok := p.(string); ok {
			privs = append(privs, s)
		}
	}
	for i := 3; i+1 < len(check); i += 2 {
		k, _ := check[i].(string)
		switch k {
		case "any":
			anyOf = perlString(check[i+1]) != "" && perlString(check[i+1]) != "0"
		case "require_param":
			requireParam, _ = check[i+1].(string)
		}
	}
	if path == "" || len(privs) == 0 {
		return "", nil, false, "", errors.New("missing parameters")
	}
	return path, privs, anyOf, requireParam, nil
}

// NormalizePath is pve-access-control's normalize_path: one leading slash,
// no doubled or trailing slashes.
func NormalizePath(p string) string {
	p = "/" + p
	for strings.Contains(p, "//") {
		p = strings.ReplaceAll(p, "//", "/")
	}
	p = strings.TrimSuffix(p, "/")
	if p == "" {
		return "/"
	}
	return p
}

// Checks walks a method's check expression and calls f on every perm leaf
// (path template, privileges, any), for comparisons.
func (m *Method) Checks(f func(path string, privs []string, any bool)) {
	if m.Permissions == nil {
		return
	}
	var walk func([]any)
	walk = func(c []any) {
		if len(c) == 0 {
			return
		}
		switch c[0] {
		case "and", "or":
			for _, sub := range c[1:] {
				if sc, ok := sub.([]any); ok {
					walk(sc)
				}
			}
		case "perm":
			if path, privs, any, _, err := PermCheck(c); err == nil {
				f(path, privs, any)
			}
		}
	}
	walk(m.Permissions.Check)
}
