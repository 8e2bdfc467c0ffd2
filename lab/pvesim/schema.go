package pvesim

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/homelab/bootstrap/lab/pveapi"
)

// The published API schema of the simulated version judges every request
// as PVE's REST layer does, in its order (pve-manager 9.2.11
// PVE/HTTPServer.pm rest_handler): a path or method the schema lacks is
// 501 "Method '<M> <path>' not implemented" (RESTHandler find_handler);
// then the method's declared permissions (check_api2_permissions), before
// the call is proxied to the member it names; then, on the member that
// answers, the parameters (RESTHandler handle → JSONSchema validate: 400
// "Parameter verification failed." with per-parameter errors); then the
// handler's own checks. pvesim's answer is validated against the method's
// returns schema too: a mismatch is pvesim's own defect and fails the
// call with 500 "Result verification failed" (PVE validates results only
// when asked, RESTHandler handle's $result_verification).
//
// Without the schema files (a clone outside this setup) pvesim falls back
// to the checks its handlers make themselves; with BOOTSTRAP_PVE_API_DIR
// set, or BOOTSTRAP_REQUIRE_LAB=1 (make test), a missing directory fails
// New. Nothing turns the schema off.

// loadSchema finds the schema of version (see pveapi.ReleaseFor).
func loadSchema(version string) (*pveapi.API, string, error) {
	dir, explicit, err := pveapi.Dir()
	if err != nil {
		if explicit {
			return nil, "", err
		}
		return nil, "", nil
	}
	api, note, err := pveapi.LoadFor(dir, version)
	if err != nil {
		return nil, "", fmt.Errorf("loading the API schema of PVE %s: %w", version, err)
	}
	return api, note, nil
}

// Schema is the published API schema this server validates with (nil
// without the schema files), and the note when its release is not the
// simulated version's own.
func (s *Server) Schema() (*pveapi.API, string) { return s.api, s.apiNote }

// findMethod is find_handler and check_api2_permissions; it records the
// call under its path template.
func (s *Server) findMethod(r *request) *apiError {
	if s.api == nil {
		return nil
	}
	m, uri := s.api.Find(r.method, r.path)
	if m == nil {
		return errf(http.StatusNotImplemented, "Method '%s %s' not implemented", r.method, r.path)
	}
	r.api, r.uri = m, uri
	s.mu.Lock()
	s.calls[m.Key()]++
	s.mu.Unlock()
	processCallsMu.Lock()
	processCalls[m.Key()] = true
	processCallsMu.Unlock()
	if r.who == nil {
		// POST /access/ticket, the one call before authentication
		// (permissions user => 'world').
		if m.Permissions == nil || m.Permissions.User != "world" {
			return permErr("user != null")
		}
		return nil
	}
	params := map[string]string{}
	for k := range r.params {
		params[k] = r.params.Get(k)
	}
	for k, v := range uri {
		params[k] = v
	}
	if err := m.CheckPermissions(r.who.privs, params, r.who.tokenID != "", r.path); err != nil {
		var d *pveapi.Denied
		if errors.As(err, &d) {
			return permErr(strings.TrimSuffix(d.What, "\n"))
		}
		return errf(http.StatusInternalServerError, "%v", err)
	}
	return nil
}

// checkParams is handle's parameter validation, on the member answering.
func (s *Server) checkParams(r *request) *apiError {
	if s.api == nil || r.api == nil || r.validated {
		return nil
	}
	r.validated = true
	// A member validates with its own schema: the same as the first's in
	// every simulated cluster (one version for all members).
	if errs := s.api.Params(r.api, r.uri, r.params); errs != nil {
		return paramErr(map[string]string(errs))
	}
	return nil
}

// checkResult validates an answer against returns.
func (s *Server) checkResult(r *request, data any) *apiError {
	if s.api == nil || r.api == nil {
		return nil
	}
	if errs := s.api.Result(r.api, data); errs != nil {
		s.log.Error().Str("call", r.api.Key()).Str("errors", errs.String()).Msg("pvesim answer does not match the schema's returns")
		e := errf(http.StatusInternalServerError, "Result verification failed")
		e.errs = map[string]string(errs)
		return e
	}
	return nil
}

// Calls counts the requests by method and path template of the schema
// ("GET /nodes/{node}/status"); empty without the schema files.
func (s *Server) Calls() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.calls)
}

var (
	processCallsMu sync.Mutex
	processCalls   = map[string]bool{}
)

// ProcessCalls lists every call, by method and path template, that any
// simulator of this process answered a method for (the schema's
// find_handler found it), sorted: what a test package's clients sent.
func ProcessCalls() []string {
	processCallsMu.Lock()
	defer processCallsMu.Unlock()
	return slices.Sorted(maps.Keys(processCalls))
}

// CallList is Calls' keys, sorted.
func (s *Server) CallList() []string {
	return slices.Sorted(maps.Keys(s.Calls()))
}
