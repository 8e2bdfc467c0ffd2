package pvesim

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
)

// newCluster9 is a cluster of names on PVE version, each member with one
// HA-managed VM 70<i>.
func newCluster9(t *testing.T, version string, names ...string) ([]*Server, *client) {
	t.Helper()
	var nodes []NodeSpec
	for _, n := range names {
		nodes = append(nodes, NodeSpec{Name: n})
	}
	ms, err := NewCluster(Options{Version: version}, nodes, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, m := range ms {
			_ = m.Close()
		}
	})
	c := newClient(t, ms[0])
	for i, m := range ms {
		id := 701 + i
		if err := m.SeedVM(id, map[string]string{"name": fmt.Sprintf("cp-%d", i+1), "memory": "2048"}, true); err != nil {
			t.Fatal(err)
		}
	}
	return ms, c
}

// The rules API of PVE 9 (pve-ha-manager 5.2.0 src/PVE/API2/HA/Rules.pm)
// kept cluster-wide, with the checks a negative resource-affinity rule
// meets; PVE 8 has no such path.
func TestHARulesAPI(t *testing.T) {
	ms, c := newCluster9(t, "9.1.2", "pve1", "pve2", "pve3")
	rule := func(res string) url.Values {
		return url.Values{"rule": {"bootstrap-lab-cp"}, "type": {"resource-affinity"}, "affinity": {"negative"}, "resources": {res}}
	}
	expect := func(what string, a answer, code int, msg string) {
		t.Helper()
		if a.code != code || !strings.Contains(a.msg, msg) {
			t.Errorf("%s: %s %q, want %d %q", what, a.status, a.msg, code, msg)
		}
	}
	expect("unmanaged resources", c.do("POST", "/cluster/ha/rules", rule("vm:701,vm:702")), 500,
		"create ha rule failed: cannot use unmanaged resource(s) vm:701, vm:702.")
	for _, id := range []string{"701", "702", "703"} {
		c.ok("POST", "/cluster/ha/resources", url.Values{"sid": {"vm:" + id}})
	}
	expect("one resource", c.do("POST", "/cluster/ha/rules", rule("vm:701")), 500,
		"create ha rule failed: 400 Rule 'bootstrap-lab-cp' is invalid.\nresources: rule is ineffective as there are less than two resources")
	expect("bad id", c.do("POST", "/cluster/ha/rules", url.Values{"rule": {"1cp"}, "type": {"resource-affinity"}, "affinity": {"negative"}, "resources": {"vm:701,vm:702"}}), 400,
		"Parameter verification failed.")
	expect("node option on resource-affinity", c.do("POST", "/cluster/ha/rules", url.Values{"rule": {"x1"}, "type": {"resource-affinity"}, "affinity": {"negative"}, "resources": {"vm:701,vm:702"}, "nodes": {"pve1"}}), 500,
		"unexpected property 'nodes'")
	expect("no affinity", c.do("POST", "/cluster/ha/rules", url.Values{"rule": {"x1"}, "type": {"resource-affinity"}, "resources": {"vm:701,vm:702"}}), 500,
		"missing value for required option 'affinity'")
	c.ok("POST", "/cluster/ha/rules", rule("vm:702,vm:701"))
	expect("twice", c.do("POST", "/cluster/ha/rules", rule("vm:701,vm:702")), 500, "create ha rule failed: HA rule 'bootstrap-lab-cp' already defined")

	// Every member's endpoint answers with the one rule, resources sorted.
	got := newClient(t, ms[2]).ok("GET", "/cluster/ha/rules", url.Values{"type": {"resource-affinity"}}).([]any)
	if len(got) != 1 || got[0].(map[string]any)["resources"] != "vm:701,vm:702" || got[0].(map[string]any)["affinity"] != "negative" {
		t.Fatalf("rules seen through pve3: %v", got)
	}
	c.ok("PUT", "/cluster/ha/rules/bootstrap-lab-cp", url.Values{"type": {"resource-affinity"}, "resources": {"vm:701,vm:702,vm:703"}})
	if r := ms[1].HARules(); len(r) != 1 || strings.Join(r[0].Resources, ",") != "vm:701,vm:702,vm:703" {
		t.Fatalf("after the update: %+v", r)
	}
	// A fourth VM on three nodes: a negative rule cannot separate them.
	if err := ms[0].SeedVM(704, map[string]string{"name": "cp-4", "memory": "2048"}, true); err != nil {
		t.Fatal(err)
	}
	c.ok("POST", "/cluster/ha/resources", url.Values{"sid": {"vm:704"}})
	expect("more resources than nodes", c.do("PUT", "/cluster/ha/rules/bootstrap-lab-cp", url.Values{"type": {"resource-affinity"}, "resources": {"vm:701,vm:702,vm:703,vm:704"}}), 500,
		"update HA rules failed: 400 Rule 'bootstrap-lab-cp' is invalid.\nresources: rule defines more resources than available nodes")
	expect("update of a missing rule", c.do("PUT", "/cluster/ha/rules/nope", url.Values{"type": {"resource-affinity"}, "resources": {"vm:701,vm:702"}}), 500,
		"update HA rules failed: HA rule 'nope' does not exist")

	// 9.1 purges a deleted resource from the rules (pve-ha-manager 5.0.7).
	c.ok("DELETE", "/cluster/ha/resources/vm:703", nil)
	if r := ms[0].HARules(); len(r) != 1 || strings.Join(r[0].Resources, ",") != "vm:701,vm:702" {
		t.Errorf("after vm:703 left HA: %+v", r)
	}
	expect("read a missing rule", c.do("GET", "/cluster/ha/rules/nope", nil), 500, "no such ha rule 'nope'")
	c.ok("DELETE", "/cluster/ha/rules/bootstrap-lab-cp", nil)
	c.ok("DELETE", "/cluster/ha/rules/bootstrap-lab-cp", nil) // a missing rule deletes fine
	if r := ms[0].HARules(); len(r) != 0 {
		t.Errorf("after the delete: %+v", r)
	}

	_, c8 := newCluster9(t, "8.4.1", "pve1", "pve2")
	expect("PVE 8", c8.do("GET", "/cluster/ha/rules", nil), 501, "Method 'GET /cluster/ha/rules' not implemented")
	expect("PVE 8 create", c8.do("POST", "/cluster/ha/rules", rule("vm:701,vm:702")), 501, "not implemented")
}
