package proxmox

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/homelab/bootstrap/lab/pveapi"
	"github.com/homelab/bootstrap/lab/pvesim"
)

// TestMain checks, after the package's tests, that every call their
// simulators received is in APICalls: the tests drive every operation of
// the package, so a call missing from the table (and so from the schema
// checks below) fails the package; and that no value the package sent
// passed a named format unchecked.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if missing := callsNotInTable(pvesim.ProcessCalls()); len(missing) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: calls made in the tests but not in proxmox.APICalls (add them, then the schema tests judge them): %s\n",
				strings.Join(missing, ", "))
			code = 1
		}
		// Every named format on a parameter the package sent was checked
		// by its rule (lab/pveapi/formats.go), none passed unchecked.
		if un := pveapi.Unchecked(); len(un) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: the package's requests carry values of named formats lab/pveapi does not check: %s\n", strings.Join(un, ", "))
			code = 1
		}
	}
	os.Exit(code)
}

func callsNotInTable(calls []string) []string {
	var missing []string
	for _, c := range calls {
		if !slices.ContainsFunc(APICalls, func(a APICall) bool { return a.Method+" "+a.Path == c }) {
			missing = append(missing, c)
		}
	}
	return missing
}

// Every call of the package exists in every release it supports (8.2 and
// later), or is made only from the release that has it (APICall.Since).
func TestAPICallsExistInEverySupportedRelease(t *testing.T) {
	for _, a := range pveapi.LoadForTest(t) {
		for _, c := range APICalls {
			if c.Since != "" && a.Release < c.Since {
				continue
			}
			if a.Method(c.Method, c.Path) == nil {
				t.Errorf("PVE %s has no %s %s (gate it with APICall.Since and in the code)", a.Release, c.Method, c.Path)
			}
		}
	}
}

// Each field the package decodes appears in the method's returns schema
// wherever that schema types the object holding it. The untyped ones are
// logged: the schema cannot judge them (pvesim's answers are the only
// check there).
func TestDecodedFieldsAreInTheReturnsSchema(t *testing.T) {
	apis := pveapi.LoadForTest(t)
	for _, c := range APICalls {
		for _, f := range c.Fields {
			field, optional := strings.CutSuffix(f, "?")
			var missing []string
			for _, a := range apis {
				m := a.Method(c.Method, c.Path)
				if m == nil {
					continue
				}
				s, untyped := returnsField(m.Returns, field)
				switch {
				case untyped != "":
					t.Logf("PVE %s %s: %s: %s", a.Release, m.Key(), field, untyped)
				case s == nil:
					missing = append(missing, a.Release)
				}
			}
			switch {
			case len(missing) == 0:
			case c.Unlisted[field] != "":
				t.Logf("%s %s: %s is not in the returns of %v; the code returns it (%s)", c.Method, c.Path, field, missing, c.Unlisted[field])
			case optional && len(missing) < len(apis):
				t.Logf("%s %s: %s, read when present, is missing from the returns of %v", c.Method, c.Path, field, missing)
			default:
				t.Errorf("%s %s: the package reads %s, which the returns schema of %v does not have", c.Method, c.Path, field, missing)
			}
		}
	}
}

// returnsField walks "memory.total" or "[].vmid" down a returns schema:
// the field's schema, or why the schema does not type it.
func returnsField(s *pveapi.Schema, field string) (*pveapi.Schema, string) {
	if s == nil {
		return nil, "no returns schema"
	}
	for _, part := range strings.Split(field, ".") {
		if strings.HasPrefix(part, "[]") {
			if s.Items == nil {
				return nil, "list items untyped"
			}
			s, part = s.Items, strings.TrimPrefix(part, "[]")
			if part == "" {
				continue
			}
		}
		if len(s.Properties) == 0 {
			return nil, "object untyped"
		}
		next := s.Properties[part]
		if next == nil {
			if s.AdditionalProperties != nil && *s.AdditionalProperties {
				return nil, "not listed; the object allows more"
			}
			return nil, ""
		}
		s = next
	}
	return s, ""
}

// The privileges the precheck requires of a run cover each call's
// declared permission check: a token holding exactly what the precheck
// asks (each need's smallest grant, on its own path) passes every check
// the schema declares for the calls that run makes. A call whose check
// asks more than the precheck fails here unless the package does without
// it (APICall.Optional).
func TestPrecheckAsksAtLeastTheSchemasCheck(t *testing.T) {
	apis := pveapi.LoadForTest(t)
	created := VMSpec{Cluster: "c", Name: "cp-1", Role: "controlplane", VMID: 100, DiskStorage: "disks",
		Bridge: "vmbr0", VLAN: 20, ISOStorage: "isos", GuestAgent: true}
	adopted := created
	adopted.Name, adopted.VMID = "cp-2", 101
	in := PrecheckInput{VMs: []VMSpec{created, adopted}, ISO: ISOSource{Storage: "isos"}, HA: true}
	plans := map[int]Plan{
		created.VMID: {Create: true},
		adopted.VMID: {Adopt: true, GrowDisk: 1, Update: map[string]string{"cores": "", "memory": "", "agent": "", "tags": ""}},
	}
	// Where the run makes each call, with the path's parameters.
	type use struct {
		call   string
		params map[string]string
	}
	var uses []use
	node := map[string]string{"node": "pve"}
	for _, c := range []string{"GET /nodes/{node}/status", "GET /nodes/{node}/rrddata", "GET /nodes/{node}/apt/versions",
		"GET /nodes/{node}/network", "GET /nodes/{node}/storage", "GET /nodes/{node}/tasks/{upid}/status", "POST /nodes/{node}/qemu",
		"GET /nodes/{node}/hardware/pci"} {
		uses = append(uses, use{c, node})
	}
	for _, st := range []string{"disks", "isos"} {
		uses = append(uses, use{"GET /nodes/{node}/storage/{storage}/content", map[string]string{"node": "pve", "storage": st}})
	}
	uses = append(uses, use{"POST /nodes/{node}/storage/{storage}/download-url", map[string]string{"node": "pve", "storage": "isos"}})
	for _, vmid := range []string{"100", "101"} {
		p := map[string]string{"node": "pve", "vmid": vmid}
		for _, c := range []string{"GET /nodes/{node}/qemu/{vmid}/status/current", "POST /nodes/{node}/qemu/{vmid}/status/start",
			"POST /nodes/{node}/qemu/{vmid}/agent/ping", "GET /nodes/{node}/qemu/{vmid}/pending"} {
			uses = append(uses, use{c, p})
		}
	}
	// The adopted VM is updated and grown; the created one is what a node
	// removal stops and destroys, and HA takes out first.
	for _, c := range []string{"PUT /nodes/{node}/qemu/{vmid}/config", "PUT /nodes/{node}/qemu/{vmid}/resize"} {
		uses = append(uses, use{c, map[string]string{"node": "pve", "vmid": "101"}})
	}
	for _, c := range []string{"POST /nodes/{node}/qemu/{vmid}/status/stop", "DELETE /nodes/{node}/qemu/{vmid}"} {
		uses = append(uses, use{c, map[string]string{"node": "pve", "vmid": "100"}})
	}
	uses = append(uses, use{"DELETE /cluster/ha/resources/{sid}", map[string]string{"sid": "vm:100"}})
	for _, c := range []string{"PUT /cluster/ha/rules/{rule}", "DELETE /cluster/ha/rules/{rule}"} {
		uses = append(uses, use{c, map[string]string{"rule": SeparationRuleID("c")}})
	}
	for _, c := range APICalls {
		if !strings.Contains(c.Path, "{") {
			uses = append(uses, use{c.Method + " " + c.Path, map[string]string{}})
		}
	}
	uses = append(uses, use{"GET /cluster/sdn/vnets/{vnet}", map[string]string{"vnet": "vnet1"}},
		use{"GET /storage/{storage}", map[string]string{"storage": "disks"}})
	for _, c := range APICalls {
		if !slices.ContainsFunc(uses, func(u use) bool { return u.call == c.Method+" "+c.Path }) {
			t.Errorf("%s %s: no use in this test", c.Method, c.Path)
		}
	}
	for _, a := range apis {
		v, _ := ParseVersion(a.Release + ".0")
		needs := RequiredPrivileges("pve", v, in, plans, true)
		held := grantsOf(needs)
		for _, u := range uses {
			verb, path, _ := strings.Cut(u.call, " ")
			m := a.Method(verb, path)
			if m == nil {
				continue
			}
			// The login is the one call made without the token.
			err := m.CheckPermissions(held.at, u.params, u.call != "POST /access/ticket", path)
			if err == nil {
				continue
			}
			i := slices.IndexFunc(APICalls, func(c APICall) bool { return c.Method+" "+c.Path == u.call })
			if i >= 0 && APICalls[i].Optional != "" {
				t.Logf("PVE %s %s %v: %v; optional: %s", a.Release, u.call, u.params, err, APICalls[i].Optional)
				continue
			}
			t.Errorf("PVE %s %s %v: the precheck's privileges fail the schema's check: %v", a.Release, u.call, u.params, err)
		}
	}
}

// acl is grants by path, inherited down the tree (as a role granted on a
// path propagates).
type acl map[string][]string

func grantsOf(needs []Need) acl {
	out := acl{}
	for _, n := range needs {
		best := n.Options[0]
		for _, o := range n.Options[1:] {
			if len(o.Privs) < len(best.Privs) {
				best = o
			}
		}
		out[best.Path] = append(out[best.Path], best.Privs...)
	}
	return out
}

func (g acl) at(path string) map[string]bool {
	out := map[string]bool{}
	for p, privs := range g {
		if p == "/" || path == p || strings.HasPrefix(path, p+"/") {
			for _, pr := range privs {
				out[pr] = true
			}
		}
	}
	return out
}
