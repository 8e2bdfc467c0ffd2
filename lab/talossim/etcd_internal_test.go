package talossim

import (
	"fmt"
	"testing"
	"time"
)

// etcd elects a leader only while more than half of its voting members
// keep their data; learners do not vote. Losing the quorum stops the
// cluster's etcd once (the control plane is told once); losing the last
// data drops the cluster.
func TestEtcdQuorum(t *testing.T) {
	now := time.Now()
	c := &etcdCluster{bootstrapNode: "10.0.0.1", members: map[string]*etcdMember{}}
	for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		c.members[ip] = &etcdMember{ip: ip, startedAt: now.Add(-time.Minute), readyAt: now.Add(-time.Second)}
	}
	// A fourth, still a learner, does not vote.
	c.members["10.0.0.4"] = &etcdMember{ip: "10.0.0.4", startedAt: now.Add(-time.Second), readyAt: now.Add(time.Hour)}
	s := &Sim{etcd: map[string]*etcdCluster{"id": c}}
	if !c.hasQuorum(now) {
		t.Fatal("3 of 3 voting members: no quorum")
	}
	if s.loseMemberLocked("id", "10.0.0.2") || !c.hasQuorum(time.Now()) {
		t.Fatal("2 of 3 left: quorum must hold and etcd keep serving")
	}
	if !s.loseMemberLocked("id", "10.0.0.3") || c.hasQuorum(time.Now()) || !c.quorumLost {
		t.Fatal("1 of 3 left: quorum lost, and the loss reported")
	}
	s.joinEtcd("id", &Node{ip: "10.0.0.3"}, "cp-3", time.Now())
	if c.members["10.0.0.3"].dataLost == false {
		t.Fatal("a cluster without a leader admitted a member back")
	}
	if s.loseMemberLocked("id", "10.0.0.4") {
		t.Fatal("the loss was reported twice")
	}
	s.loseMemberLocked("id", "10.0.0.1")
	if s.etcd["id"] != nil {
		t.Fatal("the cluster outlived its last data")
	}
}

// etcd's strict reconfiguration check (mayRemoveMember): the last member
// never goes; a member that is down goes; a running member goes only if
// the running members left are still a quorum; a learner always goes.
func TestStrictReconfigCheck(t *testing.T) {
	now := time.Now()
	c := &etcdCluster{bootstrapNode: "10.0.0.1", members: map[string]*etcdMember{}}
	for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		c.members[ip] = &etcdMember{ip: ip, startedAt: now.Add(-time.Minute), readyAt: now.Add(-time.Second)}
	}
	all := map[string]bool{"10.0.0.1": true, "10.0.0.2": true, "10.0.0.3": true}
	if err := c.mayRemoveLocked(c.members["10.0.0.3"], all, now); err != nil {
		t.Fatalf("3 of 3 running, removing one: %v", err)
	}
	twoUp := map[string]bool{"10.0.0.1": true, "10.0.0.3": true}
	if err := c.mayRemoveLocked(c.members["10.0.0.3"], twoUp, now); err != etcdUnhealthy {
		t.Fatalf("10.0.0.2 down, removing a running member: %v, want unhealthy", err)
	}
	if err := c.mayRemoveLocked(c.members["10.0.0.2"], twoUp, now); err != nil {
		t.Fatalf("removing the member that is down: %v", err)
	}
	c.members["10.0.0.4"] = &etcdMember{ip: "10.0.0.4", startedAt: now.Add(-time.Second), readyAt: now.Add(time.Hour)}
	if err := c.mayRemoveLocked(c.members["10.0.0.4"], twoUp, now); err != nil {
		t.Fatalf("removing a learner: %v", err)
	}
	last := &etcdCluster{bootstrapNode: "10.0.0.1", members: map[string]*etcdMember{"10.0.0.1": c.members["10.0.0.1"]}}
	if err := last.mayRemoveLocked(last.members["10.0.0.1"], all, now); err != etcdNotEnoughStarted {
		t.Fatalf("removing the last member: %v, want not enough started members", err)
	}
}

// etcd v3.6.11's check for adding a member (mayAddMember,
// isConnectedToQuorumAfterAddingNewMemberSince): the running voting
// members must be at least quorum(voters+1); learners do not count; a
// cluster of one voting member always admits.
func TestMemberAddQuorum(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name         string
		voters, down int
		learner      bool
		wantRefused  bool
	}{
		{"one voter", 1, 0, false, false},
		{"one voter, down", 1, 1, false, false},
		{"two of two", 2, 0, false, false},
		{"one of two", 2, 1, false, true},
		{"three of three", 3, 0, false, false},
		{"two of three", 3, 1, false, true},
		{"two of three and a learner", 3, 1, true, true},
		{"three of four", 4, 1, false, false},
		{"four of five", 5, 1, false, false},
		{"three of five", 5, 2, false, true},
	} {
		c := &etcdCluster{bootstrapNode: "10.0.0.1", members: map[string]*etcdMember{}}
		up := map[string]bool{}
		for i := range tc.voters {
			ip := fmt.Sprintf("10.0.0.%d", i+1)
			c.members[ip] = &etcdMember{ip: ip, startedAt: now.Add(-time.Minute), readyAt: now.Add(-time.Second)}
			up[ip] = i >= tc.down
		}
		if tc.learner {
			c.members["10.0.0.9"] = &etcdMember{ip: "10.0.0.9", startedAt: now.Add(-time.Second), readyAt: now.Add(time.Hour)}
			up["10.0.0.9"] = true
		}
		err := c.mayAddLocked(up, now)
		if refused := err == etcdUnhealthy; refused != tc.wantRefused || err != nil && !refused {
			t.Errorf("%s: %v, want refused %v", tc.name, err, tc.wantRefused)
		}
	}
}
