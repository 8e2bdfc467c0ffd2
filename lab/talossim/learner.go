package talossim

import (
	"fmt"
	"time"
)

// StuckLearner makes the etcd member of the control plane at ip a learner
// that is never promoted (stuck) or promotes it now (!stuck). Talos'
// etcd service adds a joining control plane as a learner and promotes it
// from a goroutine that retries for 10 minutes and then only logs "failed
// promoting member": the member stays a learner for as long as its etcd
// runs (talos v1.13.3 internal/app/machined/pkg/system/services/etcd.go,
// Start's go promoteMember and promoteMember's retry.Constant(10*time.Minute)).
// Why a learner does not catch up (a slow disk, a network between the
// members) is not modelled; its etcd serves as a learner here: listed with
// IsLearner, its service not healthy, not a voter.
func (s *Sim) StuckLearner(ip string, stuck bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for _, c := range s.etcd {
		m := c.members[ip]
		if m == nil {
			continue
		}
		if ip == c.bootstrapNode {
			// The bootstrap member is a voter from its start.
			return fmt.Errorf("talossim: %s started etcd: it was never a learner", ip)
		}
		if stuck {
			if m.startedAt.After(now) {
				m.startedAt = now
			}
			m.readyAt = now.Add(100 * 365 * 24 * time.Hour)
		} else {
			m.readyAt = now
		}
		return nil
	}
	return fmt.Errorf("talossim: %s is no etcd member", ip)
}
