package postcheck

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/talos"
)

// volProbe answers the volumes' states; ready turns them ready from the
// given poll on (0: never).
type volProbe struct {
	extProbe
	polls atomic.Int32
	ready int32
}

func (p *volProbe) UserVolumes(_ context.Context, want map[string][]talos.UserVolume) (map[string]map[string]talos.VolumeState, error) {
	n := p.polls.Add(1)
	out := map[string]map[string]talos.VolumeState{}
	for node, vols := range want {
		out[node] = map[string]talos.VolumeState{}
		for _, u := range vols {
			st := talos.VolumeState{Phase: "failed", Error: "no disks matched selector for volume"}
			if p.ready > 0 && n >= p.ready {
				st = talos.VolumeState{Phase: "ready", Location: "/dev/sdb"}
			}
			out[node][u.Name] = st
		}
	}
	return out, nil
}

func TestUserVolumesRow(t *testing.T) {
	vols := map[string][]talos.UserVolume{"wk-1": {{Name: "data", Serial: "bs-0123456789abcdef", Bus: "scsi"}}}
	if names := Checks(Options{}); containsCheck(names, CheckUserVolumes) {
		t.Error("a cluster without user volumes has the row")
	}
	if !containsCheck(Checks(Options{UserVolumes: vols}), CheckUserVolumes) {
		t.Error("no user volumes row")
	}
	p := &volProbe{ready: 1}
	c := &checker{o: Options{UserVolumes: vols, UserVolumeWait: 10 * time.Second, Talos: p}}
	if st, why := c.userVolumes(context.Background()); st != check.Pass {
		t.Errorf("ready volume: %s %s", st, why)
	}
	// Never ready: the bounded wait ends, and the row names the volume,
	// its phase, Talos' error and the disk it selects.
	c.o.Talos, c.o.UserVolumeWait = &volProbe{}, time.Second
	st, why := c.userVolumes(context.Background())
	if st != check.Fail || !strings.Contains(why, "wk-1: u-data failed (no disks matched selector for volume) [selects the scsi disk with serial bs-0123456789abcdef]") {
		t.Errorf("missing disk: %s %s", st, why)
	}
}

func containsCheck(cs []check.Check, name string) bool {
	for _, c := range cs {
		if c.Name == name {
			return true
		}
	}
	return false
}
