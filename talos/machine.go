package talos

import (
	"context"
	"fmt"
	"slices"
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
		// A reboot, or the one machined does by itself after a failed
		// sequence: the node's events tell which, for the user.
		failed, err := o.LastSequenceFailure(ctx, ip)
		if err != nil {
			return SystemUp{}, err
		}
		if failed != nil {
			up.Detail = failed.String()
			return up, nil
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

// SequenceFailure is a node's sequence that failed after the node had
// booted (an upgrade whose installer failed, a reset whose leave failed):
// Controller.Run publishes its STOP, then the failure as a NOOP sequence
// event with a FATAL error (v1alpha1_controller.go), which turns
// MachineStatus to rebooting ("fatal errors lead to reboot",
// machine_status.go). machined's runEntrypoint takes any sequence error
// but LOCKED and CANCELED as fatal ("fatal sequencer error in %q
// sequence") and returns it; its deferred system.Services(...).Shutdown
// stops every service, apid with it, then handle() reverts the bootloader
// to the entry the node booted (revertBootloader), counts "rebooting in
// %d seconds" down from 10 and reboots (internal/app/machined/main.go at
// v1.13.9 and v1.14.0-rc.1; only a panic=0 kernel argument, not Talos'
// default, keeps it down). The node comes back on the Talos it ran, with
// its services: no wait has to be ended by hand.
type SequenceFailure struct {
	// Sequence is the sequence that failed ("upgrade", "reset"), Failure
	// its error as the event carried it.
	Sequence, Failure string
}

func (f *SequenceFailure) String() string {
	return fmt.Sprintf("its %s sequence failed (%s): Talos reverts its bootloader and reboots it into the Talos it ran, about ten seconds after the failure", f.Sequence, f.Failure)
}

// eventsQuiet is how long a read of a node's event history waits for the
// next event before it takes the history as complete: apid sends the
// ring's events back to back, then only new ones (v1alpha1_server.go
// Events at v1.13.3), and no event marks the end of the history.
const eventsQuiet = 300 * time.Millisecond

// LastSequenceFailure reads the node's event history and returns its last
// sequence event when that is a failure (a FATAL NOOP); nil when the last
// sequence did not fail. The history lives in machined's memory: the
// reboot that follows a failure empties it.
func (o *Ops) LastSequenceFailure(ctx context.Context, ip string) (*SequenceFailure, error) {
	var out *SequenceFailure
	err := o.read(ctx, ip, o.opts.CallTimeout, func(ctx context.Context, c *client.Client) error {
		last, err := lastSequenceEvent(ctx, c)
		if err != nil || last == nil || last.GetAction() != machine.SequenceEvent_NOOP || last.GetError().GetCode() != common.Code_FATAL {
			return err
		}
		out = &SequenceFailure{Sequence: last.GetSequence(), Failure: last.GetError().GetMessage()}
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
