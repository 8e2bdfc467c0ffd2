package pvesim

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/lab/pveapi"
)

// TestSchemaRefusesAsPVE: a deliberately wrong parameter, a wrong
// sub-option and a missing required one are refused with PVE's 400 body,
// the errors exactly those the published schema gives; a path the schema
// lacks is 501, and the declared permission check comes before the
// parameters (rest_handler).
func TestSchemaRefusesAsPVE(t *testing.T) {
	pveapi.DirForTest(t)
	for _, version := range []string{"8.2.4", "9.1.2"} {
		t.Run(version, func(t *testing.T) {
			s := newSim(t, Options{Version: version, ISOs: []ISOSpec{{Storage: "local", Name: "talos.iso", Size: 100 << 20}},
				Tokens: []Token{{ID: "root@pam!bootstrap", Secret: "s", ACL: Admin(version)},
					{ID: "audit@pve!ro", Secret: "r", ACL: []ACE{{Path: "/", Privileges: []string{"Sys.Audit"}}}}}})
			api, _ := s.Schema()
			if api == nil {
				t.Fatal("no schema loaded")
			}
			c := newClient(t, s)
			form := url.Values{}
			for k, v := range talosVM {
				form[k] = v
			}
			form.Set("bogus", "1")
			form.Set("scsi0", "local-lvm:32,discard=sometimes")
			form.Del("vmid")
			a := c.do("POST", "/nodes/pve/qemu", form)
			var body struct {
				Data    any               `json:"data"`
				Message string            `json:"message"`
				Errors  map[string]string `json:"errors"`
			}
			if err := json.Unmarshal(a.body, &body); err != nil {
				t.Fatal(err)
			}
			m, uri := api.Find("POST", "/nodes/pve/qemu")
			want := map[string]string{}
			for k, v := range api.Params(m, uri, form) {
				want[k] = v
			}
			if a.code != 400 || a.status != "400 Parameter verification failed." || body.Data != nil ||
				body.Message != "Parameter verification failed.\n" || !reflect.DeepEqual(body.Errors, want) {
				t.Fatalf("refusal: %s %s", a.status, a.body)
			}
			for k, text := range map[string]string{
				"bogus": "property is not defined in schema and the schema does not allow additional properties",
				"vmid":  "property is missing and it is not optional",
				"scsi0": "invalid format - format error\nscsi0.discard: value 'sometimes' does not have a value in the enumeration 'ignore, on'\n",
			} {
				if body.Errors[k] != text {
					t.Errorf("%s: %q, want %q", k, body.Errors[k], text)
				}
			}
			if len(body.Errors) != 3 {
				t.Errorf("errors: %v", body.Errors)
			}
			s.mu.Lock()
			left := len(s.vms)
			s.mu.Unlock()
			if left != 0 {
				t.Error("a refused create left a VM")
			}

			// Not in the schema: 501 as find_handler's miss.
			if a := c.do("GET", "/nodes/pve/qemu/701/nosuch", nil); a.code != 501 || a.msg != "Method 'GET /nodes/pve/qemu/701/nosuch' not implemented\n" {
				t.Errorf("unknown path: %s %q", a.status, a.msg)
			}
			// The permission check first: a token without the declared
			// privilege is refused 403 even with a bad parameter.
			ro := *c
			ro.auth = "PVEAPIToken=audit@pve!ro=r"
			if a := ro.do("PUT", "/nodes/pve/qemu/701/resize", url.Values{"disk": {"floppy"}, "size": {"x"}}); a.code != 403 ||
				a.msg != "Permission check failed (/vms/701, VM.Config.Disk)\n" {
				t.Errorf("resize without VM.Config.Disk: %s %q", a.status, a.msg)
			}
			if a := c.do("PUT", "/nodes/pve/qemu/701/resize", url.Values{"disk": {"floppy"}, "size": {"+1G"}}); a.code != 400 || a.errs["disk"] == nil {
				t.Errorf("resize of a disk the enum lacks: %s %v", a.status, a.errs)
			}
			if calls := s.CallList(); !contains(calls, "POST /nodes/{node}/qemu") || !contains(calls, "PUT /nodes/{node}/qemu/{vmid}/resize") {
				t.Errorf("calls by template: %v", calls)
			}
		})
	}
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// TestHandlersCheckWhatTheSchemaDeclares: each method pvesim serves whose
// schema declares a privilege check is refused by pvesim's handler itself
// (the checks it makes without the schema files) for a token holding
// every privilege but those the declaration names. A handler that forgot
// its check, or checks less, fails here.
func TestHandlersCheckWhatTheSchemaDeclares(t *testing.T) {
	pveapi.DirForTest(t)
	const version = "9.1.2"
	s := newSim(t, Options{Version: version, ISOs: []ISOSpec{{Storage: "local", Name: "talos.iso", Size: 100 << 20}},
		Bridges: []BridgeSpec{{Name: "vmbr0", VLANAware: true}}})
	api, _ := s.Schema()
	if err := s.SeedVM(701, map[string]string{"name": "cp-1", "scsi0": "local-lvm:8"}, false); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.ha[701] = "started"
	s.mu.Unlock()
	calls := []struct{ method, path string }{
		{"GET", "/cluster/status"}, {"GET", "/cluster/options"}, {"GET", "/cluster/ha/resources/vm:701"},
		{"DELETE", "/cluster/ha/resources/vm:701"}, {"POST", "/cluster/ha/resources"},
		{"GET", "/nodes/pve/status"}, {"GET", "/nodes/pve/rrddata"},
		{"GET", "/nodes/pve/storage/local/status"}, {"GET", "/nodes/pve/storage/local/content"},
		{"POST", "/nodes/pve/storage/local/download-url"},
		{"GET", "/nodes/pve/qemu/701/config"}, {"PUT", "/nodes/pve/qemu/701/config"}, {"POST", "/nodes/pve/qemu/701/config"},
		{"GET", "/nodes/pve/qemu/701/pending"}, {"PUT", "/nodes/pve/qemu/701/resize"},
		{"GET", "/nodes/pve/qemu/701/status/current"}, {"POST", "/nodes/pve/qemu/701/status/start"},
		{"POST", "/nodes/pve/qemu/701/status/stop"}, {"POST", "/nodes/pve/qemu/701/status/shutdown"},
		{"POST", "/nodes/pve/qemu/701/status/reboot"}, {"DELETE", "/nodes/pve/qemu/701"},
		{"POST", "/nodes/pve/qemu/701/migrate"}, {"GET", "/nodes/pve/qemu/701/agent/network-get-interfaces"},
		{"POST", "/nodes/pve/qemu/701/agent/ping"}, {"GET", "/nodes/pve/apt/versions"},
	}
	for _, call := range calls {
		m, uri := api.Find(call.method, call.path)
		if m == nil {
			t.Errorf("%s %s: not in the schema", call.method, call.path)
			continue
		}
		if u := m.Permissions.User; u == "all" || u == "world" {
			// check_api2_permissions returns before a declared check
			// (GET /cluster/options declares Sys.Audit and user 'all').
			continue
		}
		named := map[string]bool{}
		m.Checks(func(_ string, privs []string, _ bool) {
			for _, p := range privs {
				named[p] = true
			}
		})
		if len(named) == 0 {
			t.Errorf("%s: declares no privilege", m.Key())
			continue
		}
		var rest []string
		for _, p := range AllPrivileges(version) {
			if !named[p] {
				rest = append(rest, p)
			}
		}
		who := &identity{user: "t@pve", tokenID: "t@pve!x", acl: []ACE{{Path: "/", Privileges: rest}}}
		params := url.Values{}
		for k, v := range uri {
			params.Set(k, v)
		}
		if strings.HasSuffix(call.path, "/config") && call.method != "GET" {
			params.Set("cores", "2") // a change to check, not "no options specified"
		}
		r := &request{method: call.method, path: call.path, segs: strings.Split(strings.Trim(call.path, "/"), "/"), params: params, who: who}
		_, aerr := s.route(context.Background(), r)
		if aerr == nil || aerr.code != http.StatusForbidden {
			names := make([]string, 0, len(named))
			for p := range named {
				names = append(names, p)
			}
			sort.Strings(names)
			t.Errorf("%s without %v: the handler answered %v, want 403", m.Key(), names, aerr)
		}
	}
}
