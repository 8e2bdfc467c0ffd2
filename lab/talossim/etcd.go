package talossim

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"
)

// etcdCluster is the etcd membership of one Talos cluster (by cluster.id).
// Members become visible at readyAt: the bootstrap node after EtcdStart,
// the other control planes EtcdJoin after both etcd and they are up.
type etcdCluster struct {
	bootstrapNode string // IP
	readyAt       time.Time
	members       map[string]*etcdMember // by IP
	failed        error                  // the control plane failed to start
	// quorumLost is set once the members that keep their data are no
	// longer a majority: etcd elects no leader, the control plane stops.
	quorumLost bool
	// joins numbers the members added after the bootstrap (each gets a new
	// ID); removed counts members removed.
	joins, removed int
	// evicted lists the nodes (by IP) whose member another node removed
	// while they ran: their etcd learns it and stops until they rejoin.
	evicted map[string]bool
}

type etcdMember struct {
	id       uint64
	hostname string
	ip       string
	// startedAt is when etcd started on the node (data directory no longer
	// empty): at once on the bootstrap node; half way through a join, when
	// the node is added as a learner after discovering the cluster.
	startedAt time.Time
	readyAt   time.Time
	// dataLost: the member's VM was destroyed with its disk (WipeDisk).
	dataLost bool
}

// started reports whether etcd runs (healthy or not) on the member at now.
func (m *etcdMember) started(now time.Time) bool { return m != nil && !now.Before(m.startedAt) }

func memberID(clusterID, ip string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(clusterID + "/" + ip))
	return h.Sum64()
}

// bootstrapEtcd starts the cluster on n; callers hold n.mu and s.mu.
func (s *Sim) bootstrapEtcd(clusterID string, n *Node, hostname string, now time.Time) {
	c := &etcdCluster{bootstrapNode: n.ip, readyAt: now.Add(s.scaled(s.opts.Profile.EtcdStart)), members: map[string]*etcdMember{}}
	c.members[n.ip] = &etcdMember{id: memberID(clusterID, n.ip), hostname: hostname, ip: n.ip, startedAt: now, readyAt: c.readyAt}
	s.etcd[clusterID] = c
	n.serviceEventAtLocked(c.readyAt, "etcd")
}

// joinEtcd adds a configured control plane to its bootstrapped cluster;
// callers hold n.mu and s.mu. Nothing happens before bootstrap: a control plane
// without etcd data waits for one. A cluster without quorum admits no one
// (the member list and the add need a leader: the node's etcd waits to
// join, then fails). A control plane joining with an empty data directory
// first removes every member of its hostname (the member a re-created or
// wiped node left behind), then is added as a learner under a new member
// ID, as Talos' etcd service does (addMember in
// internal/app/machined/pkg/system/services/etcd.go at v1.13.3;
// MemberAddAsLearner gives the new member its own ID). etcd refuses the
// add while it could lose quorum (mayAddLocked); Talos then asks again
// every EtcdJoinRetry until EtcdJoinTimeout, after which its etcd service
// has failed (buildInitialCluster).
func (s *Sim) joinEtcd(clusterID string, n *Node, hostname string, now time.Time) {
	ip := n.ip
	c := s.etcd[clusterID]
	if c == nil || c.quorumLost {
		return
	}
	if m, ok := c.members[ip]; ok && !m.dataLost {
		m.hostname = hostname
		return
	}
	delete(c.evicted, ip)
	for at, m := range c.members {
		if m.hostname == hostname || at == ip {
			delete(c.members, at)
			c.removed++
		}
	}
	if err := c.mayAddLocked(s.etcdPeersUpLocked(), now); err != nil {
		n.counters.EtcdAddsRefused++
		n.log.Debug().Err(err).Msg("talossim: etcd refused to add the member; asking again")
		if now.Before(n.etcdJoinDeadline) {
			n.afterLocked(s.scaled(s.opts.Profile.EtcdJoinRetry), func() {
				if n.phase != PhaseRunning || n.etcdLeft {
					return
				}
				s.mu.Lock()
				defer s.mu.Unlock()
				s.joinEtcd(clusterID, n, n.hostnameLocked(), time.Now())
			})
		}
		return
	}
	start := now
	if c.readyAt.After(start) {
		start = c.readyAt
	}
	join := s.scaled(s.opts.Profile.EtcdJoin)
	c.joins++
	m := &etcdMember{id: memberID(clusterID, fmt.Sprintf("%s#%d", ip, c.joins)), hostname: hostname, ip: ip,
		startedAt: start.Add(join / 2), readyAt: start.Add(join)}
	c.members[ip] = m
	n.serviceEventAtLocked(m.startedAt, "etcd")
	n.serviceEventAtLocked(m.readyAt, "etcd")
}

// mayAddLocked is etcd's strict reconfiguration check for adding a member
// (etcd v3.6.11 server/etcdserver/server.go mayAddMember, on by default),
// which a learner passes too: the member serving the request must have
// been connected (for HealthInterval, 5 s: not simulated) to
// quorum(voters+1) of the voting members, itself included, the new member
// counted as unavailable (util.go isConnectedToQuorumAfterAddingNewMemberSince;
// a cluster of one voting member always admits). With three voting
// members and one down, 2 < quorum(4) = 3: refused with ErrUnhealthy.
// (v3.6.5 wanted every member connected, isConnectedFullySince.) A member
// counts as connected while its node's etcd runs (up: etcdPeersUp) with
// its data. etcd's one-learner limit (membership.DefaultMaxLearners) is
// not simulated. s.mu is held.
func (c *etcdCluster) mayAddLocked(up map[string]bool, now time.Time) error {
	voting, connected := 0, 0
	for _, m := range c.members {
		if c.learner(m, now) {
			continue
		}
		voting++
		if up[m.ip] && !m.dataLost && m.started(now) {
			connected++
		}
	}
	if voting <= 1 {
		return nil
	}
	if quorum := (voting+1)/2 + 1; connected < quorum {
		return etcdUnhealthy
	}
	return nil
}

// learner reports whether m is a learner at now (or not yet a member): a
// joined member until it is promoted; the bootstrap node never is.
func (c *etcdCluster) learner(m *etcdMember, now time.Time) bool {
	return m.readyAt.After(now) && m.ip != c.bootstrapNode
}

// etcdView returns the cluster and the member at ip as of now (nil when not
// a member); callers hold s.mu.
func (s *Sim) etcdView(clusterID, ip string) (*etcdCluster, *etcdMember) {
	c := s.etcd[clusterID]
	if c == nil {
		return nil, nil
	}
	return c, c.members[ip]
}

// etcdRunningLocked reports whether the cluster's etcd has a running member;
// callers hold s.mu.
func (s *Sim) etcdRunningLocked(clusterID string) bool {
	c := s.etcd[clusterID]
	return c != nil && len(c.readyMembers(time.Now())) > 0
}

// hasQuorum reports whether etcd can elect a leader: more than half of its
// voting members (learners do not vote) keep their data (etcd raft; a
// member whose VM is only powered off counts as alive here: not modelled).
func (c *etcdCluster) hasQuorum(now time.Time) bool {
	voting, alive := 0, 0
	for _, m := range c.members {
		if c.learner(m, now) {
			continue // a learner, or not yet a member
		}
		voting++
		if !m.dataLost {
			alive++
		}
	}
	return alive*2 > voting
}

// readyMembers lists members whose etcd is up, by hostname.
func (c *etcdCluster) readyMembers(now time.Time) []*etcdMember {
	var out []*etcdMember
	for _, m := range c.members {
		if !m.readyAt.After(now) {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b *etcdMember) int { return strings.Compare(a.hostname, b.hostname) })
	return out
}
