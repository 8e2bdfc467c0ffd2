package talos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc/codes"
)

// MachineStage is a node's MachineStatus stage (`talosctl get
// machinestatus`): maintenance, booting, installing, upgrading, rebooting,
// running, …
type MachineStage = runtime.MachineStage

// Machine stages the talos stage branches on.
const (
	StageRunning    = runtime.MachineStageRunning
	StageBooting    = runtime.MachineStageBooting
	StageInstalling = runtime.MachineStageInstalling
	StageRebooting  = runtime.MachineStageRebooting
)

// MachineStatus reads the node's MachineStatus resource over COSI. machined
// keeps it from its sequence events
// (internal/app/machined/pkg/controllers/runtime/machine_status.go):
// booting when an installed system boots (and briefly when a maintenance
// node took its config), installing during the install phase, rebooting
// from kexec/reboot on, running once the boot sequence ended without error
// (a control plane's only after its etcd runs).
func (o *Ops) MachineStatus(ctx context.Context, ip string) (stage MachineStage, ready bool, err error) {
	err = o.read(ctx, ip, o.opts.CallTimeout, func(ctx context.Context, c *client.Client) (err error) {
		stage, ready, err = machineStatusOn(ctx, c)
		return err
	})
	if err != nil {
		return runtime.MachineStageUnknown, false, fmt.Errorf("reading the machine status of %s: %w", ip, err)
	}
	return stage, ready, nil
}

func machineStatusOn(ctx context.Context, c *client.Client) (MachineStage, bool, error) {
	ms, err := safe.StateGetByID[*runtime.MachineStatus](ctx, c.COSI, runtime.MachineStatusID)
	if err != nil {
		return runtime.MachineStageUnknown, false, err
	}
	return ms.TypedSpec().Stage, ms.TypedSpec().Status.Ready, nil
}

// SystemUp is what a configured node says about the system it runs.
type SystemUp struct {
	// Installed is true when the installed system booted: cri runs, which
	// only the installed system's boot sequence starts (StartAllServices)
	// and which the Bootstrap RPC waits for (IsBootstrapAllowed). A node
	// answering in configured mode without it is still about to install,
	// installing or rebooting.
	Installed bool
	Stage     MachineStage
	// Detail says what the node is doing when not Installed.
	Detail string
}

// notBootedYet is InstalledSystemUp's detail for a configured node whose
// installed system has not started cri yet.
const notBootedYet = "configured, not booted from its install yet (cri is not running)"

// InstalledSystemUp tells whether the configured node at ip runs its
// installed system (see SystemUp).
func (o *Ops) InstalledSystemUp(ctx context.Context, ip string) (SystemUp, error) {
	stage, _, err := o.MachineStatus(ctx, ip)
	if err != nil && client.StatusCode(err) != codes.Unimplemented {
		return SystemUp{}, err
	}
	up := SystemUp{Stage: stage}
	if stage == runtime.MachineStageRebooting {
		// Rebooting, or stuck there after a failed sequence: only the
		// node's events tell which.
		stuck, err := o.NeedsReboot(ctx, ip)
		if err != nil {
			return SystemUp{}, err
		}
		if stuck != nil {
			return SystemUp{}, stuck
		}
	}
	switch stage {
	case runtime.MachineStageInstalling, runtime.MachineStageUpgrading, runtime.MachineStageRebooting,
		runtime.MachineStageShuttingDown, runtime.MachineStageResetting, runtime.MachineStageMaintenance:
		up.Detail = "node is " + stage.String()
		return up, nil
	}
	svcs, err := o.Services(ctx, ip)
	if err != nil {
		return SystemUp{}, err
	}
	i := slices.IndexFunc(svcs, func(s Service) bool { return s.ID == "cri" })
	if i < 0 || svcs[i].State != "Running" {
		up.Detail = notBootedYet
		return up, nil
	}
	up.Installed = true
	return up, nil
}

// NeedsRebootError says a node's last sequence failed and left it
// waiting for a reboot: Controller.Run publishes the failure as a NOOP
// sequence event with a FATAL error, which turns MachineStatus to
// rebooting, and nothing reboots the node (the Upgrade RPC's goroutine
// only logs "upgrade failed": v1alpha1_controller.go, machine_status.go,
// v1alpha1_server.go at v1.13.3). A failed upgrade has already stopped cri,
// etcd and kubelet (and trustd) and unmounted EPHEMERAL before its
// installer ran (v1alpha1_sequencer.go Upgrade, StopServicesEphemeral),
// so until the reboot a control plane's etcd member is down and the
// node's pods do not run. No wait ends this state.
//
// The run does not reboot the node itself: the reboot returns it to its
// old Talos, but it loses the record of why the installer failed (the
// console and machined's log live in memory), and the next run would ask
// the same upgrade, which most likely fails the same way and takes the
// member down again. The user reads why, fixes it (or pins the version
// the node runs) and reboots it.
type NeedsRebootError struct {
	IP string
	// Version is the Talos the node runs and boots again.
	Version string
	// Sequence is the sequence that failed ("upgrade"), Failure its error.
	Sequence, Failure string
	// Stopped are the services that do not run (cri, etcd, kubelet).
	Stopped []string
}

func (e *NeedsRebootError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "its %s sequence failed (%s) and it waits for a reboot", e.Sequence, e.Failure)
	if len(e.Stopped) > 0 {
		fmt.Fprintf(&b, "; Talos stopped its %s before the failure, and they stay down until it reboots", strings.Join(e.Stopped, ", "))
		if slices.Contains(e.Stopped, "etcd") {
			b.WriteString(" (its etcd member is down meanwhile)")
		}
	}
	fmt.Fprintf(&b, ". Read why with `talosctl -n %s dmesg`, then reboot it with `talosctl -n %s reboot`", e.IP, e.IP)
	if e.Version != "" {
		fmt.Fprintf(&b, " (it boots Talos %s again)", e.Version)
	}
	b.WriteString(" and run again; the run does not reboot it itself (a reboot loses the installer's output, and the same upgrade would be asked again)")
	return b.String()
}

// eventsQuiet is how long a read of a node's event history waits for the
// next event before it takes the history as complete: apid sends the
// ring's events back to back, then only new ones (v1alpha1_server.go
// Events at v1.13.3), and no event marks the end of the history.
const eventsQuiet = 300 * time.Millisecond

// NeedsReboot reads the node's event history and returns a
// NeedsRebootError when its last sequence event is a failure (a FATAL
// NOOP), with the services that do not run and the version it runs; nil
// when the last sequence did not fail.
func (o *Ops) NeedsReboot(ctx context.Context, ip string) (*NeedsRebootError, error) {
	var out *NeedsRebootError
	err := o.read(ctx, ip, o.opts.CallTimeout, func(ctx context.Context, c *client.Client) error {
		last, err := lastSequenceEvent(ctx, c)
		if err != nil || last == nil || last.GetAction() != machine.SequenceEvent_NOOP || last.GetError().GetCode() != common.Code_FATAL {
			return err
		}
		out = &NeedsRebootError{IP: ip, Sequence: last.GetSequence(), Failure: last.GetError().GetMessage()}
		if v, err := c.Version(ctx); err == nil {
			out.Version = versionTag(v.GetMessages())
		}
		svcs, err := servicesOn(ctx, c)
		if err != nil {
			return err
		}
		for _, id := range []string{"cri", "etcd", "kubelet"} {
			if s, ok := findService(svcs, id); ok && s.State != "Running" {
				out.Stopped = append(out.Stopped, id)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the events of %s: %w", ip, err)
	}
	return out, nil
}

// lastSequenceEvent is the newest sequence event of the node's event
// history (nil when there is none), read until the history is complete
// (eventsQuiet) or ctx ends.
func lastSequenceEvent(ctx context.Context, c *client.Client) (*machine.SequenceEvent, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan client.EventResult)
	if err := c.EventsWatchV2(ctx, ch, client.WithTailEvents(-1)); err != nil {
		return nil, err
	}
	var last *machine.SequenceEvent
	quiet := time.NewTimer(eventsQuiet)
	defer quiet.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-quiet.C:
			return last, nil
		case r := <-ch:
			if r.Error != nil {
				return nil, r.Error
			}
			if se, ok := r.Event.Payload.(*machine.SequenceEvent); ok {
				last = se
			}
			quiet.Reset(eventsQuiet)
		}
	}
}

// Reboot asks the node at ip to reboot (as `talosctl reboot`); the node
// answers, then runs its reboot sequence.
func (o *Ops) Reboot(ctx context.Context, t Target) error {
	err := o.call(ctx, t.IP, true, o.opts.CallTimeout, func(ctx context.Context, c *client.Client) error {
		_, err := c.MachineClient.Reboot(ctx, &machine.RebootRequest{})
		return err
	})
	if err != nil {
		return fmt.Errorf("rebooting %s: %w", t, err)
	}
	return nil
}
