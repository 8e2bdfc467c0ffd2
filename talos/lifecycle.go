package talos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/blang/semver/v4"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"google.golang.org/grpc/codes"
)

// lifecycleRange is the Talos a node must run for talosctl upgrade to
// take the LifecycleService: talosUpgradeAPIVersionRange in
// cmd/talosctl/cmd/talos/upgrade.go at v1.14.0-rc.1 (the same at v1.13.3).
// Below it, and where the node answers Unimplemented, talosctl falls back
// to the legacy MachineService.Upgrade, deprecated since v1.13 and to be
// removed in Talos 1.18.
var lifecycleRange = semver.MustParseRange(">1.13.0-alpha.2 <2.0.0")

// UpgradesThroughLifecycle reports whether a node running version is
// upgraded as talosctl v1.13+ does it: the installer image pulled into the
// node's containerd, LifecycleService.Upgrade running it beside the
// running node, then a drain and a reboot asked by the client. A version
// that does not parse takes the legacy path.
func UpgradesThroughLifecycle(version string) bool {
	v, err := semver.ParseTolerant(version)
	return err == nil && lifecycleRange(v)
}

// systemContainerd is the containerd instance talosctl upgrade pulls the
// installer into and runs it from by default (--namespace system:
// ContainerDriver_CRI, NS_SYSTEM; imageCmdFlagsType.containerdInstance in
// cmd/talosctl/cmd/talos/image.go at v1.14.0-rc.1).
func systemContainerd() *common.ContainerdInstance {
	return &common.ContainerdInstance{Driver: common.ContainerDriver_CRI, Namespace: common.ContainerdNamespace_NS_SYSTEM}
}

// errNoLifecycle: the node answered Unimplemented to the LifecycleService
// path; the caller takes the legacy one, as talosctl does.
var errNoLifecycle = errors.New("the node does not serve the LifecycleService")

// PullInstaller pulls image into t's system containerd
// (ImageService.Pull, internal/app/images/images.go at v1.14.0-rc.1) and
// returns the reference the node pinned it under (its digest; the tag
// goes), which LifecycleService.Upgrade then runs.
func (o *Ops) PullInstaller(ctx context.Context, t Target, image string) (string, error) {
	var pinned string
	err := o.call(ctx, t.IP, true, o.opts.InstallTimeout, func(ctx context.Context, c *client.Client) error {
		stream, err := c.ImageClient.Pull(ctx, &machine.ImageServicePullRequest{Containerd: systemContainerd(), ImageRef: image})
		if err != nil {
			return err
		}
		return receiveAll(stream, func(resp *machine.ImageServicePullResponse) {
			if name := resp.GetName(); name != "" {
				pinned = name
			}
		})
	})
	if client.StatusCode(err) == codes.Unimplemented {
		return "", errNoLifecycle
	}
	if err != nil {
		return "", fmt.Errorf("pulling the installer %s on %s: %w", image, t, err)
	}
	if pinned == "" {
		return "", fmt.Errorf("pulling the installer %s on %s: the node's answer named no image", image, t)
	}
	return pinned, nil
}

// receiveAll hands each message of a server stream to f until the server
// ends it (nil) or it fails.
func receiveAll[T any](stream interface{ Recv() (T, error) }, f func(T)) error {
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		f(resp)
	}
}

// installerOutputKept is how many of the installer's last lines an error
// quotes.
const installerOutputKept = 8

// InstallUpgrade runs the installer image pinned (PullInstaller's answer)
// on t in upgrade mode (LifecycleService.Upgrade,
// internal/app/lifecycle/lifecycle.go at v1.14.0-rc.1): the installer runs
// in a container while the node keeps running, and the stream carries its
// output and then its exit code, non-zero included (lifecycle.proto: the
// server does not fail the call; the client judges the code). It returns
// the installer's last lines and its exit code.
func (o *Ops) InstallUpgrade(ctx context.Context, t Target, pinned string) (output []string, exitCode int32, err error) {
	exitCode = -1
	err = o.call(ctx, t.IP, true, o.opts.InstallTimeout, func(ctx context.Context, c *client.Client) error {
		stream, err := c.LifecycleClient.Upgrade(ctx, &machine.LifecycleServiceUpgradeRequest{
			Containerd: systemContainerd(),
			Source:     &machine.InstallArtifactsSource{ImageName: pinned},
		})
		if err != nil {
			return err
		}
		return receiveAll(stream, func(resp *machine.LifecycleServiceUpgradeResponse) {
			switch p := resp.GetProgress().GetResponse().(type) {
			case *machine.LifecycleServiceInstallProgress_Message:
				line := strings.TrimSpace(p.Message)
				o.opts.Log.Debug().Str("node", t.Name).Str("installer", line).Msg("installer output")
				output = append(output, line)
				if len(output) > installerOutputKept {
					output = output[1:]
				}
			case *machine.LifecycleServiceInstallProgress_ExitCode:
				exitCode = p.ExitCode
			}
		})
	})
	if client.StatusCode(err) == codes.Unimplemented {
		return output, exitCode, errNoLifecycle
	}
	if err != nil {
		return output, exitCode, fmt.Errorf("running the installer on %s: %w", t, err)
	}
	if exitCode < 0 {
		return output, exitCode, fmt.Errorf("running the installer on %s: the stream ended without the installer's exit code", t)
	}
	return output, exitCode, nil
}

// InstallerFailedError is an upgrade whose installer, run through the
// LifecycleService, exited non-zero: the node kept running its Talos and
// was neither drained nor rebooted, so nothing changed for the cluster.
type InstallerFailedError struct {
	Step     UpgradeStep
	ExitCode int32
	// Output is the installer's last lines.
	Output []string
}

func (e *InstallerFailedError) Error() string {
	s := e.Step
	var b strings.Builder
	fmt.Fprintf(&b, "upgrading %s to Talos %s: its installer exited with code %d", s.Target, s.To, e.ExitCode)
	if len(e.Output) > 0 {
		fmt.Fprintf(&b, " (last output: %s)", strings.Join(e.Output, " | "))
	}
	fmt.Fprintf(&b, "; the installer ran beside the running node, which was neither drained nor rebooted and runs Talos %s as before. A re-run asks the same upgrade again: fix the cause first (the installer image, or the disk space the installer needs)", s.From)
	return b.String()
}

// lifecycleUpgrade is one node's upgrade as talosctl upgrade does it for a
// node in lifecycleRange (upgradeViaLifecycleService at v1.14.0-rc.1):
// pull the installer, run it, then cordon and drain the Kubernetes node
// (--drain, the default), reboot it, wait for it to run the new Talos,
// and uncordon it. It returns errNoLifecycle, having changed nothing, when
// the node does not serve the LifecycleService.
func (o *Ops) lifecycleUpgrade(ctx context.Context, opts RollOutOptions, s UpgradeStep) error {
	pinned, err := o.PullInstaller(ctx, s.Target, opts.imageOf(s.Name))
	if err != nil {
		return err
	}
	output, code, err := o.InstallUpgrade(ctx, s.Target, pinned)
	if err != nil {
		return err
	}
	if code != 0 {
		return &InstallerFailedError{Step: s, ExitCode: code, Output: output}
	}
	bootBefore, err := o.BootTime(ctx, s.IP)
	if err != nil {
		return err
	}
	kc := opts.Health.Kube
	if kc != nil {
		if err := o.cordonAndDrain(ctx, kc, s.Name); err != nil {
			// The node keeps running its Talos: give it back its pods.
			if uerr := o.uncordon(ctx, kc, s.Name); uerr != nil {
				o.opts.Log.Warn().Err(uerr).Str("node", s.Name).Msg("uncordoning after a failed drain")
			}
			return fmt.Errorf("upgrading %s to Talos %s: %w; the node was not rebooted and runs Talos %s: Talos %s is installed on its disk and boots at its next reboot, and a re-run drains it and reboots it", s.Target, s.To, err, s.From, s.To)
		}
	} else {
		o.opts.Log.Warn().Str("node", s.Name).Msgf("no Kubernetes client: %s is rebooted into Talos %s without a drain", s.Name, s.To)
	}
	if err := o.Reboot(ctx, s.Target); err != nil {
		return err
	}
	w := settleWait{What: fmt.Sprintf("%s to reboot into Talos %s", s.Target, s.To), Timeout: o.opts.RebootTimeout,
		Version: s.To, Schematic: s.ToSchematic, Step: s, RolledBack: o.rolledBack(s, bootBefore)}
	if _, err := o.waitSettledOn(ctx, s.Target, w); err != nil {
		var rb *RolledBackError
		if errors.As(err, &rb) {
			rb.AfterInstaller = true
			// It runs its old Talos again: give it back its pods.
			if kc != nil {
				if uerr := o.uncordon(ctx, kc, s.Name); uerr != nil {
					o.opts.Log.Warn().Err(uerr).Str("node", s.Name).Msg("uncordoning a node back on its old Talos")
				}
			}
		}
		return err
	}
	if kc != nil {
		return o.waitUncordoned(ctx, kc, s.Name)
	}
	return nil
}
