package talos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/Masterminds/semver/v3"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/compatibility"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"

	"github.com/homelab/bootstrap/factory"
	"github.com/homelab/bootstrap/internal/wait"
)

// UpgradeStep is one node's Talos upgrade: what it runs and what it gets.
type UpgradeStep struct {
	Target
	From, To string
	// FromSchematic and ToSchematic are the Image Factory schematic IDs
	// the node runs and gets; ToSchematic is empty when the installer is
	// not derived from one (the schematic is then not compared).
	FromSchematic, ToSchematic string
	// Pos and Of place the step in the rollout, for the user.
	Pos, Of int
}

// String is the step as the user reads it in a plan.
func (s UpgradeStep) String() string {
	order := "control planes first"
	if s.Role == RoleWorker {
		order = "workers after the control planes"
	}
	if s.From == s.To {
		return fmt.Sprintf("upgrade Talos on %s in place, %s with schematic %s (was %s) (%d/%d, %s)", s.Name, s.To, factory.ShortID(s.ToSchematic), orNone(factory.ShortID(s.FromSchematic)), s.Pos, s.Of, order)
	}
	if s.ToSchematic != "" && s.ToSchematic != s.FromSchematic {
		return fmt.Sprintf("upgrade Talos on %s %s → %s with schematic %s (was %s) (%d/%d, %s)", s.Name, s.From, s.To, factory.ShortID(s.ToSchematic), orNone(factory.ShortID(s.FromSchematic)), s.Pos, s.Of, order)
	}
	return fmt.Sprintf("upgrade Talos on %s %s → %s (%d/%d, %s)", s.Name, s.From, s.To, s.Pos, s.Of, order)
}

func orNone(s string) string {
	if s == "" {
		return "none: not an Image Factory image"
	}
	return s
}

// Running is what a node runs, or what it should: the Talos version and
// the Image Factory schematic ID ("" when not a factory image, or, in what
// is wanted, when the installer is not derived from a schematic).
type Running struct {
	Version, Schematic string
}

// PlanError is a rollout refused before anything is called; the stage
// reports it as a user error (exit 2).
type PlanError struct {
	Reason string
	// Downgrade: a node runs a newer Talos than the config names.
	Downgrade bool
}

func (e *PlanError) Error() string { return e.Reason }

// PlanUpgrades compares the Talos version each node runs (live, by node
// name) with want and returns the upgrades, control planes first (one at a
// time keeps etcd's quorum), then workers, each in config order. It
// refuses, before any call:
//   - a downgrade, unless allowDowngrade;
//   - upgrading a control plane of a cluster with exactly two: Talos
//     refuses it too (internal/pkg/etcd/etcd.go ValidateForUpgrade at
//     v1.13.3: "etcd member count(2) is insufficient to maintain quorum
//     if upgrade commences").
//
// Nodes whose version is unknown (down) are an error: a rollout must know
// where every node stands.
func PlanUpgrades(nodes []Target, live map[string]string, want string, allowDowngrade bool) ([]UpgradeStep, error) {
	running := make(map[string]Running, len(live))
	for name, v := range live {
		running[name] = Running{Version: v}
	}
	return PlanUpgradesTo(nodes, running, Running{Version: want}, allowDowngrade)
}

// PlanUpgradesTo is PlanUpgrades with schematics: when want names one, a
// node at the wanted version that runs another schematic (or an image the
// factory did not build) gets an upgrade in place to the same version
// with the new installer, the only way Talos changes its extensions.
func PlanUpgradesTo(nodes []Target, liveNodes map[string]Running, wantRunning Running, allowDowngrade bool) ([]UpgradeStep, error) {
	want := wantRunning.Version
	wv, err := semver.NewVersion(strings.TrimPrefix(want, "v"))
	if err != nil {
		return nil, &PlanError{Reason: fmt.Sprintf("cluster.talosVersion %q is not a version", want)}
	}
	var cps, wks []UpgradeStep
	controlPlanes := 0
	for _, n := range nodes {
		if n.Role == RoleControlPlane {
			controlPlanes++
		}
		cur, ok := liveNodes[n.Name]
		from := cur.Version
		if !ok || from == "" {
			return nil, fmt.Errorf("the Talos version of %s is unknown (it did not answer): cannot plan an upgrade", n)
		}
		fv, err := semver.NewVersion(strings.TrimPrefix(from, "v"))
		if err != nil {
			return nil, fmt.Errorf("%s reports Talos %q, which is not a version", n, from)
		}
		sameSchematic := wantRunning.Schematic == "" || cur.Schematic == wantRunning.Schematic
		switch c := fv.Compare(wv); {
		case c == 0 && sameSchematic:
			continue
		case c > 0 && !allowDowngrade:
			return nil, &PlanError{Downgrade: true, Reason: fmt.Sprintf("%s runs Talos %s, newer than cluster.talosVersion %s: a downgrade is refused; set cluster.talosVersion to %s, or pass --allow-downgrade if you mean it", n, from, want, from)}
		}
		if c := fv.Compare(wv); c != 0 {
			if err := installerAccepts(want, from); err != nil {
				return nil, &PlanError{Reason: fmt.Sprintf("%s runs Talos %s: the Talos %s installer refuses to install over it (%v; its pre-flight check runs after the Upgrade call is accepted and leaves the node on its old version); go through an intermediate Talos release first", n, from, want, err)}
			}
		}
		step := UpgradeStep{Target: n, From: from, To: want, FromSchematic: cur.Schematic, ToSchematic: wantRunning.Schematic}
		if n.Role == RoleControlPlane {
			cps = append(cps, step)
		} else {
			wks = append(wks, step)
		}
	}
	if len(cps) > 0 && controlPlanes == 2 {
		return nil, &PlanError{Reason: "the cluster has 2 control planes: Talos refuses to upgrade one (etcd would lose quorum while it reboots); add a third control plane or remove one first"}
	}
	steps := append(cps, wks...)
	for i := range steps {
		steps[i].Pos, steps[i].Of = i+1, len(steps)
	}
	return steps, nil
}

// installerAccepts is the installer's pre-flight version check
// (cmd/installer/pkg/install/preflight.go at v1.13.3): the target's
// machinery UpgradeableFrom the host's version (minimum host version for
// an upgrade, maximum for a downgrade). A target release this build's
// machinery does not know is left to its own installer.
func installerAccepts(target, host string) error {
	tv, err := compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: target})
	if err != nil {
		return nil
	}
	hv, err := compatibility.ParseTalosVersion(&machine.VersionInfo{Tag: host})
	if err != nil {
		return nil
	}
	if err := tv.UpgradeableFrom(hv); err != nil && !strings.HasPrefix(err.Error(), "upgrades to version") {
		return err
	}
	return nil
}

// Upgrade asks the node to upgrade to the installer image (as `talosctl
// upgrade --image`, not staged, default reboot mode). The node pulls and
// validates the image, and on a control plane checks etcd, before it
// answers; the upgrade itself runs after the answer.
//
// It returns the actor ID the upgrade sequence runs under: its events carry
// it (v1alpha1_server.go Upgrade at v1.13.3), so UpgradeFailure can follow
// exactly this sequence.
func (o *Ops) Upgrade(ctx context.Context, t Target, image string) (actorID string, err error) {
	err = o.call(ctx, t.IP, true, o.opts.InstallTimeout, func(ctx context.Context, c *client.Client) error {
		resp, err := c.MachineClient.Upgrade(ctx, &machine.UpgradeRequest{Image: image})
		for _, m := range resp.GetMessages() {
			actorID = m.GetActorId()
		}
		return err
	})
	if err != nil {
		return "", fmt.Errorf("upgrading %s to %s: %w", t, image, err)
	}
	return actorID, nil
}

// UpgradeFailure follows the upgrade sequence actorID on t through the
// node's runtime events, as `talosctl upgrade --wait` does, and delivers
// its failure: a sequence event that carries an error (Controller.Run
// publishes a failed sequence as a NOOP event with a FATAL error,
// v1alpha1_controller.go at v1.13.3). The Upgrade call answers before the
// sequence runs, and a failed sequence leaves the node up on its old
// version (stage rebooting) instead of rebooting: without this a rollout
// would only learn of it when its version wait runs out. The watch ends
// with ctx, or when the node's API goes away (its reboot empties the
// event ring; what happens after it is the version wait's to judge).
func (o *Ops) UpgradeFailure(ctx context.Context, t Target, actorID string) <-chan error {
	out := make(chan error, 1)
	if actorID == "" {
		return out
	}
	go func() {
		_ = o.call(ctx, t.IP, true, o.opts.InstallTimeout+o.opts.RebootTimeout, func(ctx context.Context, c *client.Client) error {
			return followEvents(ctx, c, func(ev client.Event) bool {
				se, ok := ev.Payload.(*machine.SequenceEvent)
				if !ok || se.GetError() == nil {
					return false
				}
				out <- fmt.Errorf("its %s sequence failed after the Upgrade call was accepted: %s", se.GetSequence(), se.GetError().GetMessage())
				return true
			}, client.WithTailEvents(-1), client.WithActorID(actorID))
		})
	}()
	return out
}

// Settled is the one condition both the rollout's waits and its checks
// read: whether the node runs its installed system out of any upgrade or
// reboot (it answers in configured mode, cri runs, its stage is running),
// the Talos version it runs, and what it is doing when not. err is a state
// no wait ends: a NeedsRebootError (its last sequence failed).
func (o *Ops) Settled(ctx context.Context, t Target) (settled bool, version, status string, err error) {
	p, err := o.Probe(ctx, t.IP)
	if err != nil {
		return false, "", err.Error(), nil
	}
	if p.Mode != ModeConfigured {
		return false, "", strings.TrimSpace("node is " + p.Mode.String() + " " + p.Detail), nil
	}
	up, err := o.InstalledSystemUp(ctx, t.IP)
	var stuck *NeedsRebootError
	if errors.As(err, &stuck) {
		return false, p.Version, "", fmt.Errorf("%s: %w", t, err)
	}
	if err != nil {
		return false, p.Version, err.Error(), nil
	}
	if !up.Installed || up.Stage != runtime.MachineStageRunning {
		return false, p.Version, fmt.Sprintf("Talos %s, %s (stage %s)", p.Version, up.Detail, up.Stage), nil
	}
	return true, p.Version, "runs Talos " + p.Version, nil
}

// waitSettled waits for Settled and returns the version the node runs;
// with want set it waits for that version too.
func (o *Ops) waitSettled(ctx context.Context, t Target, want, wantSchematic string) (string, error) {
	what := fmt.Sprintf("%s to run its installed system (out of any upgrade or reboot)", t)
	if want != "" {
		what = fmt.Sprintf("%s to reboot into Talos %s", t, want)
	}
	if wantSchematic != "" {
		what += " with schematic " + factory.ShortID(wantSchematic)
	}
	var version string
	spec := wait.Spec{What: what, Timeout: o.opts.InstallTimeout + o.opts.RebootTimeout,
		Interval: o.opts.PollInterval, ProgressEvery: o.opts.ProgressEvery, Log: o.opts.Log}
	err := wait.Until(ctx, spec, func(ctx context.Context) (bool, string, error) {
		ok, v, st, err := o.Settled(ctx, t)
		version = v
		if err != nil {
			return false, "", err
		}
		if !ok || (want != "" && v != want) {
			return false, st, nil
		}
		if wantSchematic == "" {
			return true, st, nil
		}
		have, err := o.Schematic(ctx, t.IP)
		if err != nil {
			return false, err.Error(), nil
		}
		return have == wantSchematic, fmt.Sprintf("%s, schematic %s", st, orNone(factory.ShortID(have))), nil
	})
	return version, err
}

// RollOutOptions configure a Talos rollout.
type RollOutOptions struct {
	Steps []UpgradeStep
	// Image is the installer image of the target version.
	Image string
	// Health is checked before the first step (an unhealthy cluster is not
	// upgraded) and after every node.
	Health HealthInput
	Mutate Mutator
	// OnUpgraded is called after each node came back healthy at its target.
	OnUpgraded func(UpgradeStep)
	// WorkerParallelism is how many workers are upgraded at once (control
	// planes always go one at a time); 0 or 1: one after another.
	WorkerParallelism int
}

// upgradeOne takes one node through its upgrade: wait until it settles,
// ask for the upgrade unless it already runs the target (a killed run
// asked it), wait for the target version, then for the whole cluster.
func (o *Ops) upgradeOne(ctx context.Context, opts RollOutOptions, s UpgradeStep) error {
	err := opts.Mutate(s.String(), func() error {
		running, err := o.waitSettled(ctx, s.Target, "", "")
		if err != nil {
			return err
		}
		done := running == s.To
		if done && s.ToSchematic != "" {
			have, err := o.Schematic(ctx, s.IP)
			if err != nil {
				return err
			}
			done = have == s.ToSchematic
		}
		actorID := ""
		if !done {
			if actorID, err = o.Upgrade(ctx, s.Target, opts.Image); err != nil {
				return err
			}
		}
		// The version wait and the sequence's events side by side: a
		// sequence that fails after the answer is reported at once.
		wctx, cancel := context.WithCancel(ctx)
		failed := o.UpgradeFailure(wctx, s.Target, actorID)
		settled := make(chan error, 1)
		go func() {
			_, err := o.waitSettled(wctx, s.Target, s.To, s.ToSchematic)
			settled <- err
		}()
		select {
		case err := <-failed:
			cancel()
			<-settled
			// What the failure left: the services it stopped, read now.
			if stuck, rerr := o.NeedsReboot(ctx, s.IP); rerr == nil && stuck != nil {
				return fmt.Errorf("upgrading %s to Talos %s: %w", s.Target, s.To, stuck)
			}
			return fmt.Errorf("upgrading %s to Talos %s: %w; it still runs Talos %s and waits for a reboot (its machine stage reads rebooting): read why with `talosctl -n %s dmesg`, then reboot it with `talosctl -n %s reboot`", s.Target, s.To, err, s.From, s.IP, s.IP)
		case err := <-settled:
			cancel()
			if err != nil {
				return err
			}
		}
		return o.WaitHealthy(ctx, fmt.Sprintf("the cluster healthy after upgrading %s", s.Name), opts.Health)
	})
	if err != nil {
		return fmt.Errorf("%w; the rollout stopped at %s (%d/%d): the nodes after it are untouched, and a re-run continues from the versions the nodes run", err, s.Name, s.Pos, s.Of)
	}
	if opts.OnUpgraded != nil {
		opts.OnUpgraded(s)
	}
	return nil
}

// RollOut upgrades the control planes one node at a time, then the
// workers, WorkerParallelism at a time. Before the first it
// waits for the cluster to be healthy; after each, for the node to run the
// target version from its installed system and for the cluster to be
// healthy again (etcd with every member, kubelets, nodes Ready). A step
// that fails stops the rollout: the nodes after it are untouched and a
// re-run plans again from the live versions, so nothing is upgraded twice.
func (o *Ops) RollOut(ctx context.Context, opts RollOutOptions) error {
	if len(opts.Steps) == 0 {
		return nil
	}
	if err := o.WaitHealthy(ctx, "the cluster healthy before upgrading Talos", opts.Health); err != nil {
		return fmt.Errorf("not upgrading an unhealthy cluster: %w", err)
	}
	var cps, wks []UpgradeStep
	for _, s := range opts.Steps {
		if s.Role == RoleControlPlane {
			cps = append(cps, s)
		} else {
			wks = append(wks, s)
		}
	}
	for _, s := range cps {
		if err := o.upgradeOne(ctx, opts, s); err != nil {
			return err
		}
	}
	// Workers, WorkerParallelism at a time; the first failure stops new
	// ones from starting and is returned once the running ones finish.
	sem := make(chan struct{}, max(1, opts.WorkerParallelism))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for _, s := range wks {
		sem <- struct{}{}
		mu.Lock()
		stop := firstErr != nil
		mu.Unlock()
		if stop {
			<-sem
			break
		}
		wg.Add(1)
		go func(s UpgradeStep) {
			defer func() { <-sem; wg.Done() }()
			if err := o.upgradeOne(ctx, opts, s); err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}(s)
	}
	wg.Wait()
	return firstErr
}
