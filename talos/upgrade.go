package talos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/Masterminds/semver/v3"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/compatibility"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/emptypb"

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
// It returns the actor ID the upgrade sequence runs under: its events
// carry it (v1alpha1_server.go Upgrade at v1.13.3), so a sequenceWatch can
// follow exactly this sequence.
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

// sequenceWatch follows a node's runtime events from the moment it was
// opened, for the failure of one sequence (as `talosctl upgrade --wait`
// does): a sequence event that carries an error (Controller.Run publishes
// a failed sequence as a NOOP event with a FATAL error,
// v1alpha1_controller.go at v1.13.3) under the sequence's actor ID.
type sequenceWatch struct {
	actor  chan string
	failed chan SequenceFailure
}

// watchSequenceFailures opens a sequenceWatch on t and returns once apid
// has sent its first (empty) event: the stream is open. It is opened
// before the Upgrade call, because the sequence runs after the answer and
// a failed one shuts apid down soon after its failure event (machined's
// runEntrypoint, SequenceFailure): a watch opened after the answer can
// find the API gone. The watch ends with ctx, or when the node's API goes
// away (its reboot empties the event ring); a failure missed anyway is
// the version wait's to tell, from the node's boot time (waitUpgraded).
func (o *Ops) watchSequenceFailures(ctx context.Context, t Target) (*sequenceWatch, error) {
	w := &sequenceWatch{actor: make(chan string, 1), failed: make(chan SequenceFailure, 1)}
	opened := make(chan error, 1)
	go func() {
		var once sync.Once
		err := o.call(ctx, t.IP, true, o.opts.InstallTimeout+o.opts.RebootTimeout, func(ctx context.Context, c *client.Client) error {
			ch := make(chan client.EventResult)
			if err := c.EventsWatchV2(ctx, ch, client.WithTailEvents(0)); err != nil {
				return err
			}
			once.Do(func() { opened <- nil })
			actorCh, actor := w.actor, ""
			// Failures seen before the caller knew its sequence's actor ID.
			early := map[string]SequenceFailure{}
			for {
				select {
				case <-ctx.Done():
					return nil
				case actor = <-actorCh:
					actorCh = nil
					if f, ok := early[actor]; ok {
						w.failed <- f
						return nil
					}
				case r := <-ch:
					if r.Error != nil {
						return r.Error
					}
					se, ok := r.Event.Payload.(*machine.SequenceEvent)
					if !ok || se.GetError() == nil {
						continue
					}
					f := SequenceFailure{Sequence: se.GetSequence(), Failure: se.GetError().GetMessage()}
					if actor == "" {
						early[r.Event.ActorID] = f
						continue
					}
					if r.Event.ActorID == actor {
						w.failed <- f
						return nil
					}
				}
			}
		})
		once.Do(func() { opened <- err })
	}()
	if err := <-opened; err != nil {
		return nil, fmt.Errorf("following the events of %s: %w", t, err)
	}
	return w, nil
}

// For names the sequence to watch (the Upgrade answer's actor ID) and
// returns the channel its failure is delivered on.
func (w *sequenceWatch) For(actorID string) <-chan SequenceFailure {
	w.actor <- actorID
	return w.failed
}

// BootTime is the time the node at ip booted, in unix seconds, as
// MachineService.SystemStat answers it (BootTime: /proc/stat's btime,
// v1alpha1_monitoring.go at v1.13.9): it changes with every reboot and
// only then. 0 without error when the node answers SystemStat with
// Unimplemented: the caller then knows nothing of its reboots.
func (o *Ops) BootTime(ctx context.Context, ip string) (uint64, error) {
	var bt uint64
	err := o.read(ctx, ip, o.opts.CallTimeout, func(ctx context.Context, c *client.Client) error {
		resp, err := c.MachineClient.SystemStat(ctx, &emptypb.Empty{})
		for _, m := range resp.GetMessages() {
			bt = m.GetBootTime()
		}
		return err
	})
	if client.StatusCode(err) == codes.Unimplemented {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the boot time of %s: %w", ip, err)
	}
	return bt, nil
}

// RolledBackError is an upgrade Talos accepted whose sequence then failed
// on the node: machined took the failure as fatal, reverted the
// bootloader and rebooted the node into the Talos it ran (SequenceFailure;
// internal/app/machined/main.go runEntrypoint and handle at v1.13.9 and
// v1.14.0-rc.1). Nobody has to reboot it; the node's own console kept why
// its installer failed until that reboot. A re-run plans from the version
// the node runs and asks the same upgrade again, so the cause (the
// installer image, the disk space it needs) is to be fixed first.
type RolledBackError struct {
	Step UpgradeStep
	// Failure is the sequence's error as its FATAL event carried it; ""
	// when the run did not see the event (the node's API went away
	// first, and its reboot emptied the event ring) and learnt of the
	// failure from the node settled on its old version under a new boot
	// time.
	Failure string
	// Back: the node runs Step.From again. False when it did not within
	// RebootTimeout; Wait is then what the wait saw.
	Back bool
	Wait error
	// AfterInstaller: the upgrade went through the LifecycleService, whose
	// installer succeeded, and the reboot this tool asked brought the
	// node back on Step.From.
	AfterInstaller bool
}

func (e *RolledBackError) Error() string {
	s := e.Step
	var b strings.Builder
	fmt.Fprintf(&b, "upgrading %s to Talos %s: ", s.Target, s.To)
	switch {
	case e.AfterInstaller:
		fmt.Fprintf(&b, "its installer succeeded and it was drained and rebooted, but it runs Talos %s again, not %s: it booted its old Talos (why is not known here; its console shows the boot). It was uncordoned", s.From, s.To)
	case e.Failure == "":
		fmt.Fprintf(&b, "its upgrade sequence failed on the node: Talos reverted its bootloader and rebooted it, and it runs Talos %s again, not %s (it came back under a new boot time; the sequence's error went with that reboot, which empties the node's event history, and its console showed it)", s.From, s.To)
	case e.Back:
		fmt.Fprintf(&b, "its upgrade sequence failed after the Upgrade call was accepted: %s; Talos reverted its bootloader and rebooted it, and it runs Talos %s again", e.Failure, s.From)
	default:
		fmt.Fprintf(&b, "its upgrade sequence failed after the Upgrade call was accepted: %s; Talos reverts the bootloader of such a node and reboots it into its old Talos by itself, but %s did not run Talos %s again within the reboot timeout: %v; check its console", e.Failure, s.Name, s.From, e.Wait)
		return b.String()
	}
	b.WriteString(". A re-run asks the same upgrade again: fix the cause first (the installer image, or the disk space the installer needs)")
	return b.String()
}

// Settled is the one condition both the rollout's waits and its checks
// read: whether the node runs its installed system out of any upgrade or
// reboot (it answers in configured mode, cri runs, its stage is running),
// the Talos version it runs, and what it is doing when not (a node about
// to reboot by itself after a failed sequence says so: SequenceFailure).
// No state of the node is an error: every one either ends by itself or is
// a wait's to time out.
func (o *Ops) Settled(ctx context.Context, t Target) (settled bool, version, status string) {
	p, err := o.Probe(ctx, t.IP)
	if err != nil {
		return false, "", err.Error()
	}
	if p.Mode != ModeConfigured {
		return false, "", strings.TrimSpace("node is " + p.Mode.String() + " " + p.Detail)
	}
	up, err := o.InstalledSystemUp(ctx, t.IP)
	if err != nil {
		return false, p.Version, err.Error()
	}
	if !up.Installed || up.Stage != runtime.MachineStageRunning {
		return false, p.Version, fmt.Sprintf("Talos %s, %s (stage %s)", p.Version, up.Detail, up.Stage)
	}
	return true, p.Version, "runs Talos " + p.Version
}

// settleWait is what waitSettledOn waits for: the node settled (Settled),
// on Version when set, with Schematic when set.
type settleWait struct {
	What               string
	Timeout            time.Duration
	Version, Schematic string
	// NewBootSince, when set, counts the node only under another boot
	// time: it rebooted since.
	NewBootSince uint64
	// RolledBack, when set, is asked of a node settled on another version
	// or schematic than wanted; true ends the wait with a
	// RolledBackError.
	RolledBack func(ctx context.Context, version string) (bool, error)
	Step       UpgradeStep
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
	return o.waitSettledOn(ctx, t, settleWait{What: what, Timeout: o.opts.InstallTimeout + o.opts.RebootTimeout, Version: want, Schematic: wantSchematic})
}

// waitSettledOn waits as w says and returns the version the node runs.
func (o *Ops) waitSettledOn(ctx context.Context, t Target, w settleWait) (string, error) {
	var version string
	spec := wait.Spec{What: w.What, Timeout: w.Timeout,
		Interval: o.opts.PollInterval, ProgressEvery: o.opts.ProgressEvery, Log: o.opts.Log}
	err := wait.Until(ctx, spec, func(ctx context.Context) (bool, string, error) {
		ok, v, st := o.Settled(ctx, t)
		version = v
		if !ok {
			return false, st, nil
		}
		if w.NewBootSince != 0 {
			bt, err := o.BootTime(ctx, t.IP)
			if err != nil {
				return false, err.Error(), nil
			}
			if bt == w.NewBootSince {
				return false, st + ", not rebooted yet (same boot time)", nil
			}
		}
		match := w.Version == "" || v == w.Version
		if match && w.Schematic != "" {
			have, err := o.Schematic(ctx, t.IP)
			if err != nil {
				return false, err.Error(), nil
			}
			st = fmt.Sprintf("%s, schematic %s", st, orNone(factory.ShortID(have)))
			match = have == w.Schematic
		}
		if match {
			return true, st, nil
		}
		if w.RolledBack != nil {
			back, err := w.RolledBack(ctx, v)
			if err != nil {
				return false, err.Error(), nil
			}
			if back {
				return false, st, &RolledBackError{Step: w.Step, Back: true}
			}
		}
		return false, st, nil
	})
	return version, err
}

// waitUpgraded is the version wait of one upgrade step: for the node to
// settle on s.To (and s.ToSchematic). With bootBefore, its boot time
// before the Upgrade call, a node settled on s.From under another boot
// time ends the wait at once as a RolledBackError: its sequence failed
// and machined rebooted it into its old Talos. Without it (SystemStat
// Unimplemented, or no upgrade asked) only the failure event tells.
// rolledBack is the settle wait's test for a node that booted again
// (its boot time changed from bootBefore) but still runs s.From: Talos
// rolled the upgrade back. Nil when the boot time before is not known.
func (o *Ops) rolledBack(s UpgradeStep, bootBefore uint64) func(context.Context, string) (bool, error) {
	if bootBefore == 0 {
		return nil
	}
	return func(ctx context.Context, v string) (bool, error) {
		if v != s.From {
			return false, nil
		}
		// v was read before this boot time, maybe from the boot the node
		// was leaving: read the version again between two boot times, and
		// count it only when both name the same boot (a loaded host once
		// read the old version, the node then rebooted into the new one,
		// and the new boot time made it look rolled back).
		return rolledBackSince(s.From, bootBefore, func() (uint64, string, uint64, error) {
			bt1, err := o.BootTime(ctx, s.IP)
			if err != nil {
				return 0, "", 0, err
			}
			_, v, _ := o.Settled(ctx, s.Target)
			bt2, err := o.BootTime(ctx, s.IP)
			return bt1, v, bt2, err
		})
	}
}

// rolledBackSince says whether a node runs from again under a boot other
// than bootBefore: read gives a boot time, the version the node runs, and
// the boot time again; a version read across a reboot (the two differ)
// proves nothing.
func rolledBackSince(from string, bootBefore uint64, read func() (bt1 uint64, version string, bt2 uint64, err error)) (bool, error) {
	bt1, v, bt2, err := read()
	if err != nil {
		return false, err
	}
	return v == from && bt1 == bt2 && bt1 != 0 && bt1 != bootBefore, nil
}

func (o *Ops) waitUpgraded(ctx context.Context, s UpgradeStep, bootBefore uint64) error {
	what := fmt.Sprintf("%s to reboot into Talos %s", s.Target, s.To)
	if s.ToSchematic != "" {
		what += " with schematic " + factory.ShortID(s.ToSchematic)
	}
	w := settleWait{What: what, Timeout: o.opts.InstallTimeout + o.opts.RebootTimeout, Version: s.To, Schematic: s.ToSchematic, Step: s,
		RolledBack: o.rolledBack(s, bootBefore)}
	_, err := o.waitSettledOn(ctx, s.Target, w)
	return err
}

// waitRolledBack follows a failure event of s's upgrade sequence: machined
// reboots the node into s.From by itself, about ten seconds after the
// failure (SequenceFailure). The wait, bounded by RebootTimeout, lets the
// error say where the node stands.
func (o *Ops) waitRolledBack(ctx context.Context, s UpgradeStep, bootBefore uint64, failure SequenceFailure) error {
	o.opts.Log.Warn().Str("node", s.Name).Str("failure", failure.Failure).Msgf("the upgrade sequence of %s failed on the node; Talos reboots it into Talos %s by itself: waiting for that", s.Name, s.From)
	_, err := o.waitSettledOn(ctx, s.Target, settleWait{
		What:    fmt.Sprintf("%s to reboot into its old Talos %s after its failed upgrade", s.Target, s.From),
		Timeout: o.opts.RebootTimeout, Version: s.From, NewBootSince: bootBefore,
	})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return &RolledBackError{Step: s, Failure: failure.Failure, Back: err == nil, Wait: err}
}

// legacyUpgrade is one node's upgrade through MachineService.Upgrade
// (talosctl's upgradeLegacy: a node before v1.13, or one without the
// LifecycleService): the node drains, installs and reboots itself in its
// upgrade sequence. The version wait and the sequence's events run side
// by side: a sequence that fails after the answer is reported with its
// error, and a failure whose event was missed ends the version wait once
// the node is back on its old Talos.
func (o *Ops) legacyUpgrade(ctx context.Context, opts RollOutOptions, s UpgradeStep) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The boot before the call tells the node's reboot into its old
	// Talos after a failed sequence from its being slow.
	bootBefore, err := o.BootTime(ctx, s.IP)
	if err != nil {
		return err
	}
	watch, err := o.watchSequenceFailures(wctx, s.Target)
	if err != nil {
		return err
	}
	actorID, err := o.Upgrade(ctx, s.Target, opts.imageOf(s.Name))
	if err != nil {
		return err
	}
	var failed <-chan SequenceFailure // nil: no actor to follow
	if actorID != "" {
		failed = watch.For(actorID)
	}
	settled := make(chan error, 1)
	go func() { settled <- o.waitUpgraded(wctx, s, bootBefore) }()
	select {
	case f := <-failed:
		cancel()
		<-settled
		return o.waitRolledBack(ctx, s, bootBefore, f)
	case err := <-settled:
		var rb *RolledBackError
		if errors.As(err, &rb) {
			select {
			case f := <-failed:
				rb.Failure = f.Failure
			default:
			}
		}
		return err
	}
}

// RollOutOptions configure a Talos rollout.
type RollOutOptions struct {
	Steps []UpgradeStep
	// Image is the installer image of the target version.
	Image string
	// Images are installers of the target version for the nodes, by name,
	// that take another than Image (Secure Boot nodes).
	Images map[string]string
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
		if done {
			// A killed run may have rebooted it into its new Talos
			// before it uncordoned it.
			if kc := opts.Health.Kube; kc != nil {
				if err := o.waitUncordoned(ctx, kc, s.Name); err != nil {
					return err
				}
			}
		} else {
			err := errNoLifecycle
			if UpgradesThroughLifecycle(running) {
				err = o.lifecycleUpgrade(ctx, opts, s)
			}
			if errors.Is(err, errNoLifecycle) {
				err = o.legacyUpgrade(ctx, opts, s)
			}
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
