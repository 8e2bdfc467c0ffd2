package stages

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/state"
)

// StageError is the outcome of a run that stopped in a stage.
type StageError struct {
	Stage string
	Err   error
	// Interrupted is true when the run was cancelled (Ctrl-C, SIGTERM).
	Interrupted bool
	// Usage is true when the stage stopped on bad input before changing
	// anything (e.g. no Proxmox token secret): exit 2, like a config error.
	Usage bool
}

func (e *StageError) Error() string {
	if e.Interrupted {
		return fmt.Sprintf("stage %s interrupted: %v", e.Stage, e.Err)
	}
	return fmt.Sprintf("stage %s failed: %v", e.Stage, e.Err)
}

func (e *StageError) Unwrap() error { return e.Err }

// RunInfo describes the invocation for the state's last-run record.
type RunInfo struct {
	ID      string
	Command string
	LogPath string
}

// Run executes the selected stages in order and stops at the first failure.
// A stage starts once the stages it needs are done (Needs): one that needs
// only some of those before it runs beside the others. Outside a dry run
// it records every stage in the state file atomically: as running when it
// starts (so a killed process leaves a resumable trace) and ok / failed /
// interrupted when it ends. A dry run runs the stages one after another,
// writes nothing and prints the plan grouped by stage.
func Run(ctx context.Context, env *Env, selected []Stage, info RunInfo) error {
	names := make([]string, len(selected))
	for i, s := range selected {
		names[i] = s.Name()
	}
	if !env.DryRun {
		env.State.LastRun = &state.Run{ID: info.ID, Command: info.Command, Started: env.now().UTC(), Stages: names, LogPath: info.LogPath}
		if err := env.SaveState(); err != nil {
			return fmt.Errorf("writing state: %w", err)
		}
	}
	// Work of later stages that needs only the config starts now, in the
	// background, and ends with the run.
	prepCtx, stopPrep := context.WithCancel(ctx)
	defer stopPrep()
	startPreparers(prepCtx, env, selected)

	type outcome struct {
		done chan struct{}
		err  error
	}
	outcomes := make([]*outcome, len(selected))
	var failedMu sync.Mutex
	failed := false
	for i, s := range selected {
		// Wait for the stages this one needs; a failure among them, or
		// anywhere so far, ends the run here.
		for _, j := range neededBy(env.Config, selected, i, env.DryRun) {
			<-outcomes[j].done
		}
		failedMu.Lock()
		stop := failed
		failedMu.Unlock()
		if stop {
			break
		}
		var beside []string
		for j := range i {
			select {
			case <-outcomes[j].done:
			default:
				beside = append(beside, names[j])
			}
		}
		o := &outcome{done: make(chan struct{})}
		outcomes[i] = o
		senv := env.forStage(names[i], env.Log.With().Str("stage", names[i]).Logger())
		if err := startRecord(senv, names[i]); err != nil {
			o.err = err
			close(o.done)
			break
		}
		senv.UI.StageStart(Position(names[i]), len(Order), names[i], beside...)
		go func() {
			defer close(o.done)
			o.err = runRecorded(ctx, senv, s)
			if o.err != nil {
				failedMu.Lock()
				failed = true
				failedMu.Unlock()
			} else if s.Name() == Precheck {
				env.precheckPassed()
			}
		}()
	}
	// The first failure in pipeline order is the run's; stages that ran
	// beside it finished (their records say how).
	var runErr error
	for _, o := range outcomes {
		if o == nil {
			continue
		}
		<-o.done
		if runErr == nil && o.err != nil {
			runErr = o.err
		}
	}
	if env.DryRun {
		env.printPlan(names, runErr)
		return runErr
	}
	env.State.LastRun.Finished = env.now().UTC()
	env.State.LastRun.ExitCode = ExitCode(runErr)
	if err := env.SaveState(); err != nil && runErr == nil {
		return fmt.Errorf("writing state: %w", err)
	}
	return runErr
}

// Needs is an optional ability of a Stage: the stages before it in the
// pipeline whose results it needs, when not all of them. The runner starts
// a stage once those of them that are selected have finished, so a stage
// that needs fewer runs beside the others (flux beside infra). A stage
// without Needs, or whose Needs returns nil, needs every stage before it.
type Needs interface {
	Needs(cfg *config.Config) []string
}

// neededBy returns the indexes of the selected stages before selected[i]
// that it needs: every one unless its Needs names some (nil: all). A dry
// run needs every one: its plan reads stage by stage.
func neededBy(cfg *config.Config, selected []Stage, i int, dryRun bool) []int {
	var need []string
	if n, ok := selected[i].(Needs); ok && !dryRun {
		need = n.Needs(cfg)
	}
	var out []int
	for j := range i {
		if need == nil || slices.Contains(need, selected[j].Name()) {
			out = append(out, j)
		}
	}
	return out
}

// startRecord records stage name as running (outside a dry run).
func startRecord(env *Env, name string) error {
	if env.DryRun {
		return nil
	}
	env.withState(func(st *state.State) {
		rec := st.Stage(name)
		rec.Status, rec.Started, rec.Finished, rec.Error, rec.Changes = state.Running, env.now().UTC(), time.Time{}, "", nil
		rec.Attempts++
	})
	if err := env.SaveState(); err != nil {
		return fmt.Errorf("writing state: %w", err)
	}
	return nil
}

// runRecorded runs stage s on its view env, reports its outcome and
// records it in the state; the error is the run's StageError.
func runRecorded(ctx context.Context, env *Env, s Stage) error {
	name := s.Name()
	start := env.now()
	err := runStage(ctx, env, s)
	dur := env.now().Sub(start)
	interrupted := err != nil && ctx.Err() != nil
	changes := env.changesOf(name)
	env.UI.StageDone(name, dur, len(changes), err, interrupted)

	if !env.DryRun {
		env.withState(func(st *state.State) {
			rec := st.Stage(name)
			rec.Finished, rec.DurationSeconds, rec.Changes = env.now().UTC(), dur.Seconds(), changes
			switch {
			case interrupted:
				rec.Status, rec.Error = state.Interrupted, env.Secrets.String(err.Error())
			case err != nil:
				rec.Status, rec.Error = state.Failed, env.Secrets.String(err.Error())
			default:
				rec.Status = state.OK
			}
		})
		if serr := env.SaveState(); serr != nil && err == nil {
			err = fmt.Errorf("writing state: %w", serr)
		}
	}
	if err != nil {
		usage := !interrupted && len(changes) == 0 && config.IsUserError(err)
		return &StageError{Stage: name, Err: err, Interrupted: interrupted, Usage: usage}
	}
	return nil
}

// runStage runs one stage and turns a panic into a failure with its stack in
// the log, so a bug is recorded in the state instead of losing the record.
func runStage(ctx context.Context, env *Env, s Stage) (err error) {
	defer func() {
		if r := recover(); r != nil {
			env.Log.Error().Str("stack", string(debug.Stack())).Msgf("stage %s panicked: %v", s.Name(), r)
			err = fmt.Errorf("internal error (panic): %v", r)
		}
	}()
	return s.Run(ctx, env)
}

// printPlan lists what each stage would change. A stage whose planning
// failed says so (its plan is incomplete, not empty), and the stages after
// it were not planned at all.
func (e *Env) printPlan(names []string, runErr error) {
	var se *StageError
	failed := ""
	if errors.As(runErr, &se) {
		failed = se.Stage
	}
	var b strings.Builder
	b.WriteString("Plan (dry run: nothing was changed)\n")
	after := false
	for _, n := range names {
		fmt.Fprintf(&b, "  %s:\n", n)
		if after {
			fmt.Fprintf(&b, "    not planned: %s failed first\n", failed)
			continue
		}
		ch := e.changesOf(n)
		for _, c := range ch {
			fmt.Fprintf(&b, "    would %s\n", c)
		}
		switch {
		case n == failed:
			fmt.Fprintf(&b, "    FAILED, the plan stops here: %s\n", e.Secrets.String(se.Err.Error()))
			after = true
		case len(ch) == 0:
			b.WriteString("    no changes\n")
		}
	}
	fmt.Fprint(e.Out, b.String())
}

// Exit codes of the bootstrap command.
const (
	ExitOK          = 0
	ExitFailed      = 1
	ExitUsage       = 2
	ExitLocked      = 3
	ExitInterrupted = 130
)

// ExitCode maps a run's error to the process exit code.
func ExitCode(err error) int {
	var se *StageError
	var le *state.LockedError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &le):
		return ExitLocked
	case errors.As(err, &se) && se.Interrupted:
		return ExitInterrupted
	case errors.As(err, &se) && se.Usage:
		return ExitUsage
	case errors.Is(err, context.Canceled):
		return ExitInterrupted
	case isUserError(err):
		return ExitUsage
	}
	return ExitFailed
}
