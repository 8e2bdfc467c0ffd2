package talos

import (
	"context"
	"fmt"
	"slices"

	"github.com/cosi-project/runtime/pkg/safe"
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
