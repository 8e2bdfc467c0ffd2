package pvesim

import (
	"context"
	"crypto/subtle"
	"net/http"
	"sort"
	"strings"
	"time"
)

// Privileges of PVE 8. PVE 9 drops VM.Monitor and adds the guest agent and
// replication privileges.
var (
	privilegesCommon = []string{
		"Datastore.Allocate", "Datastore.AllocateSpace", "Datastore.AllocateTemplate", "Datastore.Audit",
		"Group.Allocate", "Mapping.Audit", "Mapping.Modify", "Mapping.Use",
		"Permissions.Modify", "Pool.Allocate", "Pool.Audit", "Realm.Allocate", "Realm.AllocateUser",
		"SDN.Allocate", "SDN.Audit", "SDN.Use",
		"Sys.AccessNetwork", "Sys.Audit", "Sys.Console", "Sys.Incoming", "Sys.Modify", "Sys.PowerMgmt", "Sys.Syslog",
		"User.Modify",
		"VM.Allocate", "VM.Audit", "VM.Backup", "VM.Clone", "VM.Config.CDROM", "VM.Config.CPU", "VM.Config.Cloudinit",
		"VM.Config.Disk", "VM.Config.HWType", "VM.Config.Memory", "VM.Config.Network", "VM.Config.Options",
		"VM.Console", "VM.Migrate", "VM.PowerMgmt", "VM.Snapshot", "VM.Snapshot.Rollback",
	}
	privilegesPVE8Only = []string{"VM.Monitor"}
	privilegesPVE9Only = []string{
		"VM.GuestAgent.Audit", "VM.GuestAgent.FileRead", "VM.GuestAgent.FileSystemMgmt",
		"VM.GuestAgent.FileWrite", "VM.GuestAgent.Unrestricted", "VM.Replicate",
	}
)

// AllPrivileges lists every privilege the given pve-manager version knows.
func AllPrivileges(version string) []string {
	out := append([]string(nil), privilegesCommon...)
	if strings.HasPrefix(version, "9.") {
		out = append(out, privilegesPVE9Only...)
	} else {
		out = append(out, privilegesPVE8Only...)
	}
	sort.Strings(out)
	return out
}

// Admin is an ACL granting every privilege on / (the Administrator role).
func Admin(version string) []ACE {
	return []ACE{{Path: "/", Privileges: AllPrivileges(version)}}
}

// identity is who a request authenticated as.
type identity struct {
	user    string // "root@pam"
	tokenID string // full "root@pam!name" for tokens
	acl     []ACE
	root    bool
	// userACL bounds a privilege-separated token: it holds only what its
	// user holds too (nil when the user is not simulated: then the
	// token's own ACL stands alone).
	userACL []ACE
}

func (id *identity) name() string {
	if id.tokenID != "" {
		return id.tokenID
	}
	return id.user
}

// privs computes the privileges at path (RPCEnvironment::permissions in
// pve-access-control src/PVE/RPCEnvironment.pm at 9.1.1): root@pam holds
// everything; a privilege-separated token of another user holds what its
// own ACL and its user's both grant ("intersect user and token
// permissions" in compile_acl_path).
func (id *identity) privs(path string) map[string]bool {
	out := map[string]bool{}
	if id.root {
		for _, p := range AllPrivileges("9.") {
			out[p] = true
		}
		for _, p := range privilegesPVE8Only {
			out[p] = true
		}
		return out
	}
	out = aclPrivs(id.acl, path)
	if id.userACL != nil {
		user := aclPrivs(id.userACL, path)
		for p := range out {
			if !user[p] {
				delete(out, p)
			}
		}
	}
	return out
}

// aclPrivs walks an ACL from / down to path: each level with its own
// entries replaces what was inherited, like PVE's ACL tree.
func aclPrivs(acl []ACE, path string) map[string]bool {
	out := map[string]bool{}
	path = "/" + strings.Trim(path, "/")
	levels := []string{"/"}
	if path != "/" {
		cur := ""
		for _, part := range strings.Split(strings.Trim(path, "/"), "/") {
			cur += "/" + part
			levels = append(levels, cur)
		}
	}
	for _, lvl := range levels {
		var here map[string]bool
		for _, ace := range acl {
			p := "/" + strings.Trim(ace.Path, "/")
			if p != lvl {
				continue
			}
			if ace.NoPropagate && lvl != path {
				continue
			}
			if here == nil {
				here = map[string]bool{}
			}
			for _, pr := range ace.Privileges {
				here[pr] = true
			}
		}
		if here != nil {
			out = here
		}
	}
	return out
}

func (id *identity) has(path string, privs ...string) bool {
	have := id.privs(path)
	for _, p := range privs {
		if !have[p] {
			return false
		}
	}
	return true
}

// check requires every priv on path; the first missing one is named.
func (id *identity) check(path string, privs ...string) *apiError {
	have := id.privs(path)
	for _, p := range privs {
		if !have[p] {
			return permErr(path + ", " + p)
		}
	}
	return nil
}

// checkAny requires one of privs on path.
func (id *identity) checkAny(path string, privs ...string) *apiError {
	have := id.privs(path)
	for _, p := range privs {
		if have[p] {
			return nil
		}
	}
	return permErr(path + ", " + strings.Join(privs, "|"))
}

func permErr(what string) *apiError {
	if what == "" {
		return errf(http.StatusForbidden, "Permission check failed")
	}
	return errf(http.StatusForbidden, "Permission check failed (%s)", what)
}

// authenticate resolves the ticket cookie (or Authorization header) or API
// token of a request.
func (s *Server) authenticate(hr *http.Request) (*identity, *apiError) {
	tk := authValue(hr.Header.Get("Cookie"), "PVEAuthCookie")
	if tk == "" {
		tk = authValue(hr.Header.Get("Authorization"), "PVEAuthCookie")
	}
	if tk != "" {
		s.mu.Lock()
		t, ok := s.tickets[tk]
		u := s.users[t.user]
		s.mu.Unlock()
		if !ok {
			return nil, errf(http.StatusUnauthorized, "Authentication failed!")
		}
		// A ticket older than its lifetime no longer verifies
		// (verify_ticket with $ticket_lifetime in AccessControl.pm), and
		// auth_handler turns every verification failure into
		// "Authentication failed!" (pve-manager 9.2.11 PVE/HTTPServer.pm).
		if life := s.scaled(s.opts.Profile.TicketLifetime); life > 0 && time.Since(t.issued) > life {
			return nil, errf(http.StatusUnauthorized, "Authentication failed!")
		}
		if hr.Method != http.MethodGet && hr.Header.Get("CSRFPreventionToken") != t.csrf {
			return nil, errf(http.StatusUnauthorized, "Permission denied - invalid csrf token")
		}
		return &identity{user: t.user, acl: u.ACL, root: t.user == "root@pam"}, nil
	}
	raw := authValue(hr.Header.Get("Authorization"), "PVEAPIToken")
	if raw == "" {
		return nil, errf(http.StatusUnauthorized, "No ticket")
	}
	i := strings.LastIndexAny(raw, "=:")
	if i < 0 {
		return nil, errf(http.StatusUnauthorized, "Authentication failed!")
	}
	tokenID, secret := raw[:i], raw[i+1:]
	s.mu.Lock()
	t, ok := s.tokens[tokenID]
	s.mu.Unlock()
	if !ok || subtle.ConstantTimeCompare([]byte(t.Secret), []byte(secret)) != 1 {
		return nil, errf(http.StatusUnauthorized, "Authentication failed!")
	}
	user, _, _ := strings.Cut(tokenID, "!")
	id := &identity{user: user, tokenID: tokenID, acl: t.ACL}
	s.mu.Lock()
	u, known := s.users[user]
	s.mu.Unlock()
	switch {
	case t.NoPrivsep && user == "root@pam":
		id.root = true
	case t.NoPrivsep && known:
		id.acl = u.ACL
	case known && user != "root@pam":
		id.userACL = u.ACL
		if id.userACL == nil {
			id.userACL = []ACE{}
		}
	}
	return id, nil
}

// authValue extracts "name=value" (or "name:value") from a Cookie or
// Authorization header.
func authValue(header, name string) string {
	for _, part := range strings.FieldsFunc(header, func(r rune) bool { return r == ';' }) {
		part = strings.TrimSpace(part)
		if strings.HasPrefix(part, name+"=") || strings.HasPrefix(part, name+":") {
			return strings.TrimSpace(part[len(name)+1:])
		}
	}
	return ""
}

func (s *Server) login(ctx context.Context, r *request) (any, *apiError) {
	user, pass := r.param("username"), r.param("password")
	if user == "" || pass == "" {
		return nil, paramErr(map[string]string{"username": "property is missing and it is not optional"})
	}
	if !strings.Contains(user, "@") {
		user += "@pam"
	}
	s.mu.Lock()
	u, ok := s.users[user]
	s.mu.Unlock()
	if !ok || subtle.ConstantTimeCompare([]byte(u.Password), []byte(pass)) != 1 {
		if err := s.pause(ctx, s.opts.Profile.AuthFailure); err != nil {
			return nil, errf(500, "%v", err)
		}
		return nil, errf(http.StatusUnauthorized, "authentication failure")
	}
	tk := "PVE:" + user + ":" + strings.ToUpper(randHex(4)) + "::" + randHex(32)
	csrf := strings.ToUpper(randHex(4)) + ":" + randHex(20)
	s.mu.Lock()
	s.tickets[tk] = ticket{user: user, csrf: csrf, issued: time.Now()}
	s.mu.Unlock()
	return map[string]any{
		"username":            user,
		"ticket":              tk,
		"CSRFPreventionToken": csrf,
		"cap":                 map[string]any{},
	}, nil
}

// getPermissions answers GET /access/permissions: the privileges at ?path,
// or at every path the identity has ACL entries on.
func (s *Server) getPermissions(r *request) (any, *apiError) {
	if uid := r.param("userid"); uid != "" && uid != r.who.name() {
		if err := r.who.check("/access", "Sys.Audit"); err != nil {
			return nil, err
		}
	}
	paths := []string{}
	if p := r.param("path"); p != "" {
		paths = append(paths, p)
	} else {
		seen := map[string]bool{"/": true}
		paths = append(paths, "/")
		for _, ace := range r.who.acl {
			p := "/" + strings.Trim(ace.Path, "/")
			if !seen[p] {
				seen[p] = true
				paths = append(paths, p)
			}
		}
	}
	out := map[string]any{}
	for _, p := range paths {
		m := map[string]any{}
		for pr := range r.who.privs(p) {
			m[pr] = 1
		}
		out[p] = m
	}
	return out, nil
}
