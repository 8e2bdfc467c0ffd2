package talos

import (
	"strings"
	"testing"
)

// TestEtcdMembersMatchedByAddress: "etcd members to be control plane
// nodes" pairs members and control planes by the members' peer IPs, as
// talosctl does, so hostnames a user's patch sets pass; unlike talosctl
// (member IPs ⊆ control-plane IPs) it also wants every control plane to
// be a member, and names a member outside them with the command that
// takes it out (tolerated by the waits).
func TestEtcdMembersMatchedByAddress(t *testing.T) {
	cps := []HealthTarget{{Name: "cp-1", IP: "10.0.0.11", Role: RoleControlPlane}, {Name: "cp-2", IP: "10.0.0.12", Role: RoleControlPlane}}
	member := func(host, ip string) EtcdMember { return EtcdMember{Hostname: host, IPs: []string{ip}} }
	judge := func(tolerate bool, members ...EtcdMember) string {
		facts := map[string]*nodeFacts{"cp-1": {members: members}, "cp-2": {members: members}}
		return strings.Join(etcdMembersAreControlPlanes(HealthInput{TolerateUnexpected: tolerate}, cps, facts, "cp-1"), "; ")
	}
	if p := judge(false, member("node-a", "10.0.0.11"), member("node-b", "10.0.0.12")); p != "" {
		t.Errorf("members under other hostnames at the control planes' addresses: %q", p)
	}
	if p := judge(false, member("cp-1", "10.0.0.11"), member("cp-2", "10.0.0.99")); !strings.Contains(p, "no member at the address of cp-2") || !strings.Contains(p, "take cp-2 out with `bootstrap node remove cp-2`") {
		t.Errorf("cp-2's name at another address: %q", p)
	}
	if p := judge(true, member("cp-1", "10.0.0.11"), member("cp-2", "10.0.0.12"), member("cp-3", "10.0.0.13")); p != "" {
		t.Errorf("an extra member, tolerated: %q", p)
	}
	if p := judge(false, member("cp-1", "10.0.0.11"), member("cp-2", "10.0.0.12"), member("cp-3", "10.0.0.13")); !strings.Contains(p, "take cp-3 out") {
		t.Errorf("an extra member: %q", p)
	}
	learner := member("cp-2", "10.0.0.12")
	learner.Learner = true
	if p := judge(true, member("cp-1", "10.0.0.11"), learner); !strings.Contains(p, "cp-2 is still a learner") {
		t.Errorf("a learner: %q", p)
	}
}
