package talossim

import (
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
	s.joinEtcd("id", "10.0.0.3", "cp-3", time.Now())
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
