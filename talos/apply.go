package talos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	"google.golang.org/grpc/codes"

	"github.com/homelab/bootstrap/internal/wait"
)

// Target is one node to converge.
type Target struct {
	Name string
	IP   string
	Role Role
	// Config is the rendered machine config.
	Config []byte
	// InstallDisk is checked against the node's disks before a maintenance apply.
	InstallDisk string
}

// String is "name (ip)", as nodes are named in messages.
func (t Target) String() string { return fmt.Sprintf("%s (%s)", t.Name, t.IP) }

// Mutator runs fn as a change described by what, or, in a dry run, only
// records it. The stage passes env.Wet.
type Mutator func(what string, fn func() error) error

// Execute is the Mutator of a real run: it always runs fn.
func Execute(_ string, fn func() error) error { return fn() }

// noop is what a dry run records without anything to run.
func noop() error { return nil }

// Action is what EnsureConfig did to a node.
type Action string

// Actions reported by EnsureConfig.
const (
	ActionUnchanged Action = "unchanged"
	// ActionInstalled: applied in maintenance mode; installed and rebooted,
	// or, on a node booted from the factory's disk image
	// (EnsureResult.FromImage), configured where it runs.
	ActionInstalled Action = "installed"
	// ActionUpdated: applied a changed config to a configured node.
	ActionUpdated Action = "updated"
	// ActionPlanned: a dry run recorded the apply without doing it.
	ActionPlanned Action = "planned"
)

// EnsureOptions controls EnsureConfig.
type EnsureOptions struct {
	// Mutate wraps every apply (env.Wet in the stage); nil executes.
	Mutate Mutator
	// DryRun plans instead of waiting: a node that does not answer is
	// reported as planned at once.
	DryRun bool
}

// EnsureResult reports one node's convergence.
type EnsureResult struct {
	Action Action
	// Mode the node was found in.
	Found NodeMode
	// Diff is the node's own dry-run diff for a configured node ("" if none).
	Diff string
	// Reboot is true when the applied change needed a reboot.
	Reboot bool
	// Attempts counts maintenance applies (more than one after a failed install).
	Attempts int
	// Version is the Talos version the node runs (as its Version RPC says).
	Version string
	// FromImage: the node was found in maintenance mode booted from a disk
	// created from the factory's disk image (its SystemDisk names the
	// disk holding META): the maintenance apply needed no install and no
	// reboot.
	FromImage bool
}

// rebootObserveWindow is how many poll intervals EnsureConfig watches for a
// node to go down (or report a reboot) after an apply that needs a reboot
// (a minute at the default interval).
const rebootObserveWindow = 240

// maxInstallAttempts bounds re-applying after a node came back in
// maintenance mode (an install that failed and rebooted into the ISO).
const maxInstallAttempts = 3

// EnsureConfig brings one node to its rendered config:
//   - maintenance: check the install disk exists (COSI disks), apply without
//     credentials, then wait while the node restarts its API with this
//     cluster's CA, installs and reboots, until it runs its installed
//     system; a node that falls back to maintenance mode (the install
//     failed) gets the config again, a bounded number of times;
//   - configured with our CA: wait until it runs its installed system (not
//     while it installs or reboots), then ask it for a dry-run diff and
//     apply (AUTO) only if it differs, waiting out a reboot when needed;
//   - configured by another cluster: refuse (ForeignNodeError);
//   - down: wait for it, bounded by InstallTimeout.
//
// An apply the node refuses for now (FailedPrecondition: another apply in
// progress, a reboot already under way) is waited out, not fatal. Every
// apply goes through opts.Mutate, so a dry run records "would apply" and
// stops.
func (o *Ops) EnsureConfig(ctx context.Context, t Target, opts EnsureOptions) (EnsureResult, error) {
	mutate := opts.Mutate
	if mutate == nil {
		mutate = Execute
	}
	log := o.opts.Log.With().Str("node", t.Name).Str("ip", t.IP).Logger()
	var (
		res        EnsureResult
		found      = false
		applied    = false // applied in maintenance mode during this call
		sawLeft    = false // since then, the node left maintenance mode (down or configured)
		rebootWait = false
		sawReboot  = false
		rebootAt   time.Time
	)
	// A node up from its install is woken for when its cri turns healthy
	// (the bootstrap waits for that), from the poll that first finds it
	// not booted yet: its event stream, as for a health wait.
	wctx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	wake := make(chan struct{}, 1)
	var following sync.Once
	spec := wait.Spec{
		Wake:          wake,
		What:          fmt.Sprintf("node %s to run its config", t),
		Timeout:       o.opts.InstallTimeout,
		Interval:      o.opts.PollInterval,
		ProgressEvery: o.opts.ProgressEvery,
		Log:           log,
		// A node up from its install starts cri within seconds (Talos'
		// boot sequence; BootstrapReady in talossim), and the bootstrap
		// waits for it: that short stretch is polled more closely than
		// the minutes of install and reboot before it.
		IntervalFor: func(status string) time.Duration {
			if status == notBootedYet {
				return o.opts.PollInterval * 2 / 5
			}
			return 0
		},
	}
	err := wait.Until(ctx, spec, func(ctx context.Context) (bool, string, error) {
		p, err := o.Probe(ctx, t.IP)
		if err != nil {
			return false, "", err
		}
		if !found {
			found, res.Found = true, p.Mode
			log.Info().Str("mode", p.Mode.String()).Str("version", p.Version).Str("detail", p.Detail).Msgf("node %s is %s", t, p.Mode)
		}
		switch p.Mode {
		case ModeForeign:
			return false, "", &ForeignNodeError{Name: t.Name, IP: t.IP, SecretsPath: o.opts.SecretsPath}
		case ModeDown:
			sawLeft = sawLeft || applied
			sawReboot = sawReboot || rebootWait
			if opts.DryRun && !applied {
				res.Action = ActionPlanned
				return true, "", mutate(fmt.Sprintf("apply config to %s once it answers (unreachable now: %s)", t, p.Detail), noop)
			}
			return false, "unreachable: " + p.Detail, nil
		case ModeMaintenance:
			if applied && !sawLeft {
				return false, "config accepted, install starting", nil
			}
			if applied {
				if res.Attempts >= maxInstallAttempts {
					return false, "", fmt.Errorf("node %s came back in maintenance mode %d times after applying its config: the install keeps failing (check the VM console: installer image pull, install disk)", t, res.Attempts)
				}
				log.Warn().Int("attempt", res.Attempts+1).Msgf("node %s came back in maintenance mode: the install failed; applying its config again", t)
			}
			fromImage, err := o.checkInstallDisk(ctx, t)
			if err != nil {
				return false, "", err
			}
			res.FromImage = fromImage
			ran := false
			what := fmt.Sprintf("apply config to %s in maintenance mode (installs Talos to %s and reboots)", t, t.InstallDisk)
			if fromImage {
				what = fmt.Sprintf("apply config to %s in maintenance mode (it runs Talos from the disk image on %s: no install, no reboot)", t, t.InstallDisk)
			}
			if err := mutate(what, func() error {
				ran = true
				return o.applyMaintenance(ctx, t)
			}); errors.Is(err, errNotDelivered) {
				return false, "apply not delivered: node unreachable", nil
			} else if busy := nodeBusy(err); busy != "" {
				return false, busy, nil
			} else if err != nil {
				return false, "", err
			}
			if !ran {
				res.Action = ActionPlanned
				return true, "", nil
			}
			applied, sawLeft = true, false
			res.Attempts++
			if fromImage {
				return false, "config applied, booting", nil
			}
			return false, "config applied, installing", nil
		case ModeConfigured:
			sawLeft = sawLeft || applied
			up, err := o.InstalledSystemUp(ctx, t.IP)
			if err != nil {
				if isDown(err) {
					return false, "unreachable: " + shortErr(err), nil
				}
				if isUntrustedServer(err) {
					// It answered with our CA to the probe and no longer
					// does: a failed install rebooted it into maintenance
					// mode between the two calls. The next probe says so.
					return false, "left configured mode: " + shortErr(err), nil
				}
				return false, "", err
			}
			if !up.Installed {
				sawReboot = sawReboot || (rebootWait && up.Stage == StageRebooting)
				if opts.DryRun {
					res.Action = ActionPlanned
					return true, "", mutate(fmt.Sprintf("wait for %s to finish installing (%s)", t, up.Detail), noop)
				}
				if up.Detail == notBootedYet {
					following.Do(func() { o.nodeEvents(wctx, t.IP, wake) })
				}
				return false, up.Detail, nil
			}
			// A reboot can be quicker than our polls; after a while without
			// seeing it, trust the node's own diff.
			if rebootWait && !sawReboot && time.Since(rebootAt) < rebootObserveWindow*o.opts.PollInterval {
				return false, "waiting for the node to reboot", nil
			}
			res.Version = p.Version
			diff, changed, err := o.DiffConfig(ctx, t)
			if err != nil {
				if isDown(err) {
					// Gone again since the probe (a dropped connection, a
					// reboot): ask again on the next poll.
					return false, "unreachable: " + shortErr(err), nil
				}
				if busy := nodeBusy(err); busy != "" {
					return false, busy, nil
				}
				return false, "", err
			}
			if !changed {
				if applied {
					res.Action = ActionInstalled
				} else if res.Action == "" {
					res.Action = ActionUnchanged
				}
				return true, "", nil
			}
			if applied || res.Action == ActionUpdated {
				return false, "", fmt.Errorf("node %s still differs from its config after applying it:\n%s", t, diff)
			}
			res.Diff = diff
			ran := false
			var reboot bool
			if err := mutate(fmt.Sprintf("apply changed config to %s", t), func() error {
				ran = true
				var err error
				reboot, err = o.applyConfigured(ctx, t)
				return err
			}); errors.Is(err, errNotDelivered) {
				return false, "apply not delivered: node unreachable", nil
			} else if busy := nodeBusy(err); busy != "" {
				return false, busy, nil
			} else if err != nil {
				return false, "", err
			}
			if !ran {
				res.Action = ActionPlanned
				return true, "", nil
			}
			res.Action, res.Reboot = ActionUpdated, reboot
			if reboot {
				rebootWait, sawReboot, rebootAt = true, false, time.Now()
				return false, "config applied, rebooting", nil
			}
			return false, "config applied", nil
		}
		return false, "", fmt.Errorf("node %s: unexpected mode %s", t, p.Mode)
	})
	if err != nil {
		return res, fmt.Errorf("converging node %s: %w", t, err)
	}
	return res, nil
}

// nodeBusy returns what to wait for when the node refused an apply for now:
// apid answers FailedPrecondition while another apply runs or once a
// reboot was accepted ("configuration was already applied and node is
// rebooting", v1alpha1_server.go ApplyConfiguration). "" otherwise.
func nodeBusy(err error) string {
	if err == nil || client.StatusCode(err) != codes.FailedPrecondition {
		return ""
	}
	return "node busy: " + shortErr(err)
}

// errNotDelivered marks an apply whose request never reached the node
// (the connection was refused): nothing changed, and the caller applies
// again on its next poll.
var errNotDelivered = errors.New("apply not delivered")

// applyMaintenance sends the config to a node in maintenance mode. A call
// that may have reached the node (no answer in time, a connection cut)
// counts as done: the node may have taken the config and gone into install
// before answering, and the next probe tells.
func (o *Ops) applyMaintenance(ctx context.Context, t Target) error {
	err := o.call(ctx, t.IP, false, o.opts.ApplyTimeout, func(ctx context.Context, c *client.Client) error {
		_, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{
			Data: t.Config,
			Mode: machine.ApplyConfigurationRequest_AUTO,
		})
		return err
	})
	switch {
	case err == nil:
		o.opts.Log.Info().Str("node", t.Name).Msgf("applied config to %s in maintenance mode", t)
		return nil
	case notSent(err):
		o.opts.Log.Warn().Str("node", t.Name).Err(err).Msg("maintenance apply not delivered (connection refused); retrying on the next poll")
		return fmt.Errorf("%w to %s: %w", errNotDelivered, t, err)
	case isDown(err):
		o.opts.Log.Warn().Str("node", t.Name).Err(err).Msg("maintenance apply got no answer; checking the node again")
		return nil
	}
	return fmt.Errorf("applying config to %s in maintenance mode: %w", t, err)
}

// DiffConfig asks a configured node for a dry-run apply of t.Config and
// returns the node's own diff. changed is false when the node reports no
// changes.
func (o *Ops) DiffConfig(ctx context.Context, t Target) (diff string, changed bool, err error) {
	var details string
	err = o.read(ctx, t.IP, o.opts.CallTimeout, func(ctx context.Context, c *client.Client) error {
		resp, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{
			Data:   t.Config,
			Mode:   machine.ApplyConfigurationRequest_AUTO,
			DryRun: true,
		})
		if err != nil {
			return err
		}
		for _, m := range resp.GetMessages() {
			details = m.GetModeDetails()
		}
		return nil
	})
	if err != nil {
		return "", false, fmt.Errorf("dry-run apply on %s: %w", t, err)
	}
	diff, changed = parseDryRun(details)
	return diff, changed, nil
}

// parseDryRun reads apid's dry-run summary: "Dry run summary:\n<mode>
// (skipped in dry-run).\nConfig diff:\n\n<diff or No changes.>".
func parseDryRun(details string) (string, bool) {
	const marker = "Config diff:\n\n"
	i := strings.Index(details, marker)
	if i < 0 {
		// No diff section: treat as changed so we never skip an apply silently.
		return details, true
	}
	d := strings.TrimSpace(details[i+len(marker):])
	if d == "No changes." || d == "" {
		return "", false
	}
	return d, true
}

func (o *Ops) applyConfigured(ctx context.Context, t Target) (reboot bool, err error) {
	return o.applyConfig(ctx, t, machine.ApplyConfigurationRequest_AUTO)
}

// applyConfig applies t.Config to a configured node in mode.
func (o *Ops) applyConfig(ctx context.Context, t Target, mode machine.ApplyConfigurationRequest_Mode) (reboot bool, err error) {
	err = o.call(ctx, t.IP, true, o.opts.ApplyTimeout, func(ctx context.Context, c *client.Client) error {
		resp, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{
			Data: t.Config,
			Mode: mode,
		})
		if err != nil {
			return err
		}
		for _, m := range resp.GetMessages() {
			reboot = m.GetMode() == machine.ApplyConfigurationRequest_REBOOT
		}
		return nil
	})
	if notSent(err) {
		o.opts.Log.Warn().Str("node", t.Name).Err(err).Msg("apply not delivered (connection refused); retrying on the next poll")
		return false, fmt.Errorf("%w to %s: %w", errNotDelivered, t, err)
	}
	if err != nil {
		return false, fmt.Errorf("applying config to %s: %w", t, err)
	}
	o.opts.Log.Info().Str("node", t.Name).Bool("reboot", reboot).Msgf("applied changed config to %s", t)
	return reboot, nil
}

// Disk is one block device a node reports.
type Disk struct {
	DevPath   string
	Size      uint64
	Model     string
	Transport string
	Readonly  bool
	CDROM     bool
}

// Disks lists the node's disks over COSI (as `talosctl get disks`);
// insecure for a node in maintenance mode.
func (o *Ops) Disks(ctx context.Context, ip string, insecure bool) ([]Disk, error) {
	var out []Disk
	err := o.call(ctx, ip, !insecure, o.opts.CallTimeout, func(ctx context.Context, c *client.Client) error {
		list, err := safe.StateListAll[*block.Disk](ctx, c.COSI)
		if err != nil {
			return err
		}
		for d := range list.All() {
			s := d.TypedSpec()
			out = append(out, Disk{DevPath: s.DevPath, Size: s.Size, Model: s.Model, Transport: s.Transport, Readonly: s.Readonly, CDROM: s.CDROM})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing disks of %s: %w", ip, err)
	}
	slices.SortFunc(out, func(a, b Disk) int { return strings.Compare(a.DevPath, b.DevPath) })
	return out, nil
}

// checkInstallDisk checks, before a maintenance apply, that the node has
// the writable install disk its config names, and, on a node running
// Talos from a disk created from the factory's disk image (fromImage),
// that the image is on that disk: Talos calls the disk holding META its
// system disk (SystemDisk resource, talos v1.13.3
// internal/app/machined/pkg/controllers/block/system_disk.go) and puts
// STATE and EPHEMERAL there, and upgrades install to it.
func (o *Ops) checkInstallDisk(ctx context.Context, t Target) (fromImage bool, err error) {
	if t.InstallDisk == "" {
		return false, nil
	}
	disks, err := o.Disks(ctx, t.IP, true)
	if err != nil {
		if isDown(err) {
			return false, nil // the next probe waits for it
		}
		return false, err
	}
	var seen []string
	found := false
	for _, d := range disks {
		if d.DevPath == t.InstallDisk && !d.Readonly && !d.CDROM {
			found = true
			break
		}
		seen = append(seen, fmt.Sprintf("%s (%d GiB%s)", d.DevPath, d.Size>>30, map[bool]string{true: ", read-only", false: ""}[d.Readonly || d.CDROM]))
	}
	if !found {
		return false, fmt.Errorf("node %s has no writable install disk %s; it reports: %s (check the VM's disk bus: scsi ⇒ /dev/sda, virtio ⇒ /dev/vda)",
			t, t.InstallDisk, strings.Join(seen, ", "))
	}
	system, err := o.SystemDisk(ctx, t.IP)
	switch {
	case err != nil && isDown(err):
		return false, nil
	case err != nil:
		return false, err
	case system == "":
		return false, nil // booted the ISO: the install writes the disk
	case system != t.InstallDisk:
		return true, fmt.Errorf("node %s runs Talos from a disk image on %s, but its config installs to %s (check the VM's disk bus: scsi ⇒ /dev/sda, virtio ⇒ /dev/vda)", t, system, t.InstallDisk)
	}
	return true, nil
}

// SystemDisk is the device of the disk holding the node's META partition,
// read over COSI in maintenance mode ("" when the node has none: it booted
// the ISO onto an empty disk).
func (o *Ops) SystemDisk(ctx context.Context, ip string) (string, error) {
	var dev string
	err := o.call(ctx, ip, false, o.opts.CallTimeout, func(ctx context.Context, c *client.Client) error {
		sd, err := safe.StateGetByID[*block.SystemDisk](ctx, c.COSI, block.SystemDiskID)
		if state.IsNotFoundError(err) {
			return nil
		}
		if err != nil {
			return err
		}
		dev = sd.TypedSpec().DevPath
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("reading the system disk of %s: %w", ip, err)
	}
	return dev, nil
}
