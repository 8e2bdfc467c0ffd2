package talos

import (
	"strings"
	"testing"
)

// JoinAllowed is etcd v3.6.11's mayAddMember over the voting members the
// run sees: quorum(voters+1) of them must run; one voter always admits;
// the reason names the members that do not run.
func TestJoinAllowed(t *testing.T) {
	v := func(name string, runs bool) Voter {
		return Voter{Name: name, IP: "10.0.0." + name[len(name)-1:], Runs: runs}
	}
	for _, tc := range []struct {
		name   string
		voters []Voter
		ok     bool
		names  string
	}{
		{"empty", nil, true, ""},
		{"one voter, down", []Voter{v("cp-1", false)}, true, ""},
		{"two of two", []Voter{v("cp-1", true), v("cp-2", true)}, true, ""},
		{"one of two", []Voter{v("cp-1", true), v("cp-2", false)}, false, "cp-2 (10.0.0.2)"},
		{"two of three", []Voter{v("cp-1", true), v("cp-2", false), v("cp-3", true)}, false, "cp-2 (10.0.0.2) do not run: 2 of the 3 voting members run, and etcd adds a member only while 3 of them do"},
		{"three of four", []Voter{v("cp-1", true), v("cp-2", false), v("cp-3", true), v("cp-4", true)}, true, ""},
		{"four of five", []Voter{v("cp-1", true), v("cp-2", false), v("cp-3", true), v("cp-4", true), v("cp-5", true)}, true, ""},
		{"three of five", []Voter{v("cp-1", true), v("cp-2", false), v("cp-3", false), v("cp-4", true), v("cp-5", true)}, false, "cp-2 (10.0.0.2), cp-3 (10.0.0.3)"},
	} {
		ok, why := JoinAllowed(tc.voters)
		if ok != tc.ok || !strings.Contains(why, tc.names) || ok != (why == "") {
			t.Errorf("%s: %v %q, want %v naming %q", tc.name, ok, why, tc.ok, tc.names)
		}
	}
}
