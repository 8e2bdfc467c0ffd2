package talos

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/lab/talossim"
)

// A failed upgrade sequence reboots the node into its old Talos by itself
// (machined's runEntrypoint and handle, internal/app/machined/main.go at
// v1.13.9). A v1.12 node has no LifecycleService, so its upgrade takes
// the legacy MachineService.Upgrade and its sequence: upgradeOne reports the sequence's error and the rollback when
// it reads the failure event, and the rollback alone when the event is
// missed (only the node's new boot on its old version tells), in seconds,
// not the version wait's minutes. Nothing tells the user to reboot it.
func TestUpgradeRolledBack(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		unseen bool
	}{{"failure event", false}, {"failure event missed", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// The version wait would run 5 minutes; the test's context 60 s.
			h := newHarness(t, harnessOptions{controlPlanes: 1, talosVersion: "v1.12.6", ops: OpsOptions{InstallTimeout: 4 * time.Minute, RebootTimeout: time.Minute}})
			ctx := testCtx(t)
			if _, err := h.converge(ctx, Execute); err != nil {
				t.Fatal(err)
			}
			cp := h.node("cp-1")
			from := cp.Version()
			faults := talossim.Faults{UpgradeSequenceFails: 1}
			if tc.unseen {
				faults.SequenceFailureUnseen = 1
			}
			cp.SetFaults(faults)
			reboots, boot := cp.Counters().Reboots, cp.BootTime()
			step := UpgradeStep{Target: h.targets()[0], From: from, To: "v1.13.11", Pos: 1, Of: 1}
			start := time.Now()
			err := h.ops.upgradeOne(ctx, RollOutOptions{Steps: []UpgradeStep{step}, Image: "ghcr.io/siderolabs/installer:v1.13.11", Mutate: Execute}, step)
			took := time.Since(start)
			var rb *RolledBackError
			if !errors.As(err, &rb) || !rb.Back || took > 20*time.Second {
				t.Fatalf("after %s: %v", took.Round(time.Millisecond), err)
			}
			msg := err.Error()
			want := []string{"upgrading cp-1", "to Talos v1.13.11", "it runs Talos " + from + " again",
				"A re-run asks the same upgrade again: fix the cause first", "the rollout stopped at cp-1 (1/1)"}
			if tc.unseen {
				want = append(want, "Talos reverted its bootloader and rebooted it", "it came back under a new boot time")
				if rb.Failure != "" {
					t.Errorf("a failure read from a missed event: %q", rb.Failure)
				}
			} else {
				want = append(want, "its upgrade sequence failed after the Upgrade call was accepted: sequence failed:",
					"(injected) failed to install bootloader: no space left on device", "Talos reverted its bootloader and rebooted it")
			}
			for _, w := range want {
				if !strings.Contains(msg, w) {
					t.Errorf("the error does not say %q: %s", w, msg)
				}
			}
			if strings.Contains(msg, "talosctl") {
				t.Errorf("the error asks the user for a command: %s", msg)
			}
			c := cp.Counters()
			if cp.Version() != from || c.FailedUpgrades != 1 || c.Reboots != reboots+1 || c.RebootCalls != 0 || cp.BootTime() <= boot {
				t.Fatalf("cp-1 after its failed upgrade: %s, %+v, boot time %d (was %d)", cp.Version(), c, cp.BootTime(), boot)
			}
			t.Logf("reported after %s: %s", took.Round(time.Millisecond), msg)
		})
	}
}

// A node that does not come back from machined's reboot within the reboot
// timeout (legacy path, a v1.12 node) is reported as such, with the sequence's error and where to look.
func TestUpgradeNotBackAfterItsFailure(t *testing.T) {
	t.Parallel()
	h := newHarness(t, harnessOptions{controlPlanes: 1, talosVersion: "v1.12.6", ops: OpsOptions{RebootTimeout: 3 * time.Second}})
	ctx := testCtx(t)
	if _, err := h.converge(ctx, Execute); err != nil {
		t.Fatal(err)
	}
	cp := h.node("cp-1")
	from := cp.Version()
	cp.SetFaults(talossim.Faults{UpgradeSequenceFails: 1, ExtraRebootDelay: 30 * time.Second})
	step := UpgradeStep{Target: h.targets()[0], From: from, To: "v1.13.11", Pos: 1, Of: 1}
	err := h.ops.upgradeOne(ctx, RollOutOptions{Steps: []UpgradeStep{step}, Image: "ghcr.io/siderolabs/installer:v1.13.11", Mutate: Execute}, step)
	var rb *RolledBackError
	if !errors.As(err, &rb) || rb.Back || rb.Failure == "" ||
		!strings.Contains(err.Error(), "cp-1 did not run Talos "+from+" again within the reboot timeout") ||
		!strings.Contains(err.Error(), "check its console") || strings.Contains(err.Error(), "talosctl") {
		t.Fatalf("not back in time: %v", err)
	}
}

// Between a failed upgrade sequence and machined's reboot the node answers
// with its stage at rebooting: Settled reads it as not settled, naming the
// failure and the coming reboot, not as a state no wait ends.
func TestSettledNamesAFailedSequence(t *testing.T) {
	t.Parallel()
	// apid goes away RebootStart after the failure: long enough to read.
	h := newHarness(t, harnessOptions{controlPlanes: 1, profile: profile(func(p *talossim.Profile) { p.RebootStart = 1500 * time.Millisecond })})
	ctx := testCtx(t)
	if _, err := h.converge(ctx, Execute); err != nil {
		t.Fatal(err)
	}
	cp := h.node("cp-1")
	cp.SetFaults(talossim.Faults{UpgradeSequenceFails: 1})
	target := h.targets()[0]
	if _, err := h.ops.Upgrade(ctx, target, "ghcr.io/siderolabs/installer:v1.13.11"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for cp.Counters().FailedUpgrades == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the upgrade sequence never failed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	settled, v, st := h.ops.Settled(ctx, target)
	if settled || v != cp.Version() || !strings.Contains(st, "its upgrade sequence failed (sequence failed:") ||
		!strings.Contains(st, "Talos reverts its bootloader and reboots it into the Talos it ran") || !strings.Contains(st, "stage rebooting") {
		t.Fatalf("Settled in the failure's window: %v %s %q", settled, v, st)
	}
}
