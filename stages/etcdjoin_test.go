package stages

import (
	"strings"
	"testing"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/talos"
)

// joinAfterRemoval judges the re-created node against the members left
// once its own is removed: with four voters and one down, etcd removes a
// running one (3-1 ≥ 1+3/2) but then adds no member (2 < quorum(4)), so
// replacing a running control plane is refused before anything changes;
// replacing the one that is down leaves three running members, which take
// it (3 ≥ quorum(4)).
func TestJoinAfterRemoval(t *testing.T) {
	voters := []talos.Voter{
		{Name: "cp-1", IP: "10.0.0.11", Runs: true}, {Name: "cp-2", IP: "10.0.0.12", Runs: false},
		{Name: "cp-3", IP: "10.0.0.13", Runs: true}, {Name: "cp-4", IP: "10.0.0.14", Runs: true},
	}
	q := talos.RemovalQuorum{Members: 4, Running: 3, TargetRuns: true}
	if ok, why := q.Allowed(); !ok {
		t.Fatalf("etcd would refuse the removal itself: %s", why)
	}
	err := joinAfterRemoval(&NodeRemoval{Name: "cp-3", IP: "10.0.0.13"}, voters)
	if err == nil || !config.IsUserError(err) || !strings.Contains(err.Error(), "the etcd member(s) cp-2 (10.0.0.12) do not run") {
		t.Fatalf("replacing running cp-3 with cp-2 down: %v", err)
	}
	if err := joinAfterRemoval(&NodeRemoval{Name: "cp-2", IP: "10.0.0.12"}, voters); err != nil {
		t.Fatalf("replacing cp-2, the one down: %v", err)
	}
}

// A control plane whose etcd does not run counts as coming up for a
// joining one when the talos stage waits for it: it does not answer,
// boots, or reads rebooting — also the reboot machined does by itself
// after a failed upgrade or reset sequence (main.go runEntrypoint and
// handle at v1.13.9), which brings its etcd back without anyone asking.
// One settled at running with its etcd stopped does not.
func TestBootingCountsARebootingControlPlane(t *testing.T) {
	for _, tc := range []struct {
		v    talos.Voter
		want bool
	}{
		{talos.Voter{Name: "cp-2", Answers: false}, true},
		{talos.Voter{Name: "cp-2", Answers: true, Stage: talos.StageBooting}, true},
		{talos.Voter{Name: "cp-2", Answers: true, Stage: talos.StageRebooting}, true},
		{talos.Voter{Name: "cp-2", Answers: true, Stage: talos.StageRunning}, false},
	} {
		if got := booting(tc.v); got != tc.want {
			t.Errorf("booting(answers %v, stage %s) = %v, want %v", tc.v.Answers, tc.v.Stage, got, tc.want)
		}
	}
}
