package talos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Adding a control plane: etcd's rule for adding a member, checked before
// a run creates or configures a control plane that is not a member yet.

// Voter is one voting etcd member as a run sees it: its name, its
// address, whether its etcd runs, and, when it does not, whether its node's
// Talos API answers and its machine stage (a node still booting starts
// its etcd on its own).
type Voter struct {
	Name, IP string
	Runs     bool
	Answers  bool
	Stage    MachineStage
}

func (v Voter) String() string {
	if v.IP == "" {
		return v.Name
	}
	return fmt.Sprintf("%s (%s)", v.Name, v.IP)
}

// JoinAllowed is etcd's strict reconfiguration check for adding a member
// (etcd v3.6.11 server/etcdserver/server.go mayAddMember, on by default and
// applied to the learner Talos adds too: internal/app/machined/pkg/system/
// services/etcd.go addMember at Talos v1.13.3 calls MemberAddAsLearner):
// the member asked must be connected to quorum(voters+1) of the voting
// members, itself included, the new member counted as unavailable
// (server/etcdserver/util.go isConnectedToQuorumAfterAddingNewMemberSince);
// a cluster of one voting member always admits. A member whose etcd does
// not run is not connected. With three voters and one down, 2 < quorum(4)
// = 3: etcd answers "etcdserver: unhealthy cluster", and the new control
// plane's etcd asks again for EtcdJoinTimeout (30 min) and then fails.
// The reason names the members that do not run.
func JoinAllowed(voters []Voter) (bool, string) {
	if len(voters) <= 1 {
		return true, ""
	}
	var down []string
	for _, v := range voters {
		if !v.Runs {
			down = append(down, v.String())
		}
	}
	need := (len(voters)+1)/2 + 1
	if running := len(voters) - len(down); running < need {
		return false, fmt.Sprintf("the etcd member(s) %s do not run: %d of the %d voting members run, and etcd adds a member only while %d of them do (its quorum with the new member); start %s first",
			strings.Join(down, ", "), running, len(voters), need, strings.Join(down, ", "))
	}
	return true, ""
}

// EtcdMembersVia lists the etcd members through the first of cps that
// answers, and returns which one did. The error joins every control
// plane's when none answers.
func (o *Ops) EtcdMembersVia(ctx context.Context, cps []Target) ([]EtcdMember, Target, error) {
	var errs []error
	for _, cp := range cps {
		m, err := o.EtcdMembers(ctx, cp.IP)
		if err == nil {
			return m, cp, nil
		}
		errs = append(errs, err)
	}
	return nil, Target{}, errors.Join(errs...)
}

// Voters are the voting members among members (learners do not vote),
// each with whether its etcd service runs (and, when not, whether its node
// answers and its stage), asked of the member's node at its peer address,
// all at once.
func (o *Ops) Voters(ctx context.Context, members []EtcdMember) []Voter {
	var out []Voter
	for _, m := range members {
		if m.Learner {
			continue
		}
		v := Voter{Name: m.Hostname}
		if len(m.IPs) > 0 {
			v.IP = m.IPs[0]
		}
		out = append(out, v)
	}
	var wg sync.WaitGroup
	for i := range out {
		if out[i].IP == "" {
			continue
		}
		wg.Go(func() {
			v := &out[i]
			svcs, err := o.Services(ctx, v.IP)
			v.Answers = err == nil
			s, ok := findService(svcs, "etcd")
			v.Runs = ok && s.State == "Running"
			if v.Answers && !v.Runs {
				v.Stage, _, _ = o.MachineStatus(ctx, v.IP)
			}
		})
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b Voter) int { return strings.Compare(a.Name, b.Name) })
	return out
}
