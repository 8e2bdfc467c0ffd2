package postcheck

import (
	"cmp"
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/talos"
)

// CheckUserVolumes is the row of the Talos user volumes made of the VMs'
// extra disks (proxmox.vm.disks with volume: user); present only when a
// node has one.
const CheckUserVolumes = "talos-user-volumes"

// UserVolumeProbe reads the user volumes' states; a TalosProbe that has
// it is asked (found by type assertion, the other probes need not have it).
type UserVolumeProbe interface {
	UserVolumes(ctx context.Context, want map[string][]talos.UserVolume) (map[string]map[string]talos.VolumeState, error)
}

// defaultUserVolumeWait bounds the wait for user volumes not yet ready: a
// volume whose config was just applied is formatted and mounted within
// seconds; one that waits longer waits for something that is not coming
// (a disk its selector does not match).
const defaultUserVolumeWait = 90 * time.Second

// userVolumes waits, within its bound, until every node's user volumes
// are ready, then names each that is not, with its phase and Talos'
// error, and the serial of the disk it selects.
func (c *checker) userVolumes(ctx context.Context) (check.Status, string) {
	probe, ok := c.o.Talos.(UserVolumeProbe)
	if !ok || c.o.Talos == nil {
		return check.Warnf("no talosconfig to reach the Talos API with")
	}
	want := c.o.UserVolumes
	var nodes []string
	total := 0
	for n, vols := range want {
		nodes = append(nodes, n)
		total += len(vols)
	}
	sort.Strings(nodes)
	var last map[string]map[string]talos.VolumeState
	var lastErr error
	notReady := func() []string {
		var out []string
		for _, n := range nodes {
			for _, u := range want[n] {
				st := last[n][u.Name]
				if st.Ready() {
					continue
				}
				what := fmt.Sprintf("%s: %s %s", n, u.VolumeID(), cmp.Or(st.Phase, "not read"))
				if st.Error != "" {
					what += " (" + st.Error + ")"
				}
				out = append(out, what+fmt.Sprintf(" [selects the %s disk with serial %s]", u.Bus, u.Serial))
			}
		}
		return out
	}
	bound := cmp.Or(c.o.UserVolumeWait, defaultUserVolumeWait)
	err := wait.Until(ctx, wait.Spec{What: fmt.Sprintf("%d Talos user volume(s) on %d node(s) to be ready", total, len(nodes)), Timeout: bound,
		Interval: 2 * time.Second, Log: c.o.Log},
		func(ctx context.Context) (bool, string, error) {
			last, lastErr = probe.UserVolumes(ctx, want)
			left := notReady()
			return len(left) == 0 && lastErr == nil, fmt.Sprintf("%d of %d ready", total-len(left), total), nil
		})
	if err == nil {
		return check.Passf("%d user volume(s) ready, each on the disk with its serial, mounted under /var/mnt", total)
	}
	var parts []string
	if lastErr != nil {
		parts = append(parts, lastErr.Error())
	}
	parts = append(parts, notReady()...)
	return check.Failf("not ready after %s: %s", bound, strings.Join(parts, "; "))
}
