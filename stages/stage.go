// Package stages runs the pipeline: precheck → provision → talos → infra →
// flux → postcheck. Each stage is one file here, idempotent and resumable on
// its own; the Runner selects stages, records their outcome atomically in the
// cluster's state and turns dry runs into a plan.
package stages

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/state"
)

// Stage is one step of the pipeline.
type Stage interface {
	// Name is the stage's canonical name, one of Order.
	Name() string
	// Run makes the stage's part of the cluster match the config. It checks
	// live state before acting and makes every change through env.Wet.
	Run(ctx context.Context, env *Env) error
}

// Canonical stage names, in pipeline order.
const (
	Precheck  = "precheck"
	Provision = "provision"
	Talos     = "talos"
	Infra     = "infra"
	Flux      = "flux"
	Postcheck = "postcheck"
)

// Order is the pipeline.
var Order = []string{Precheck, Provision, Talos, Infra, Flux, Postcheck}

// Pipeline returns the stages in pipeline order, the precheck walking the
// others' Prechecks.
func Pipeline() []Stage {
	areas := []Stage{ProvisionStage{}, TalosStage{}, InfraStage{}, FluxStage{}, PostcheckStage{}}
	return append([]Stage{PrecheckStage{Areas: areas}}, areas...)
}

// Aliases maps the old script's stage names to ours.
var Aliases = map[string]string{"k3s": Talos, "apps": Flux}

// All is the value of --stage that selects the whole pipeline.
const All = "all"

// Canonical resolves an alias; it returns "" for an unknown name.
func Canonical(name string) string {
	name = strings.ToLower(strings.TrimSpace(name))
	if a, ok := Aliases[name]; ok {
		return a
	}
	if slices.Contains(Order, name) || name == All {
		return name
	}
	return ""
}

// Position is a stage's 1-based place in the pipeline.
func Position(name string) int { return slices.Index(Order, name) + 1 }

func validNames() string {
	return fmt.Sprintf("%s, %s (aliases: k3s → talos, apps → flux)", All, strings.Join(Order, ", "))
}

// Selection is what the user asked to run.
type Selection struct {
	Stage  string
	From   string
	Resume bool
}

// ErrNothingToResume says --resume found no failed or interrupted stage.
type ErrNothingToResume struct{ Reason string }

func (e *ErrNothingToResume) Error() string { return "nothing to resume: " + e.Reason }

// Select resolves a selection against the registered stages (in pipeline
// order) and the recorded state. Unknown names and impossible combinations
// are user errors, decided before anything runs.
func Select(registered []Stage, sel Selection, st *state.State) ([]Stage, error) {
	set := 0
	for _, b := range []bool{sel.Stage != "" && sel.Stage != All, sel.From != "", sel.Resume} {
		if b {
			set++
		}
	}
	if set > 1 {
		return nil, config.Userf("use only one of --stage STAGE, --from STAGE and --resume")
	}
	byName := map[string]Stage{}
	for _, s := range registered {
		byName[s.Name()] = s
	}
	lookup := func(flag, name string) (string, error) {
		c := Canonical(name)
		if c == "" || (c == All && flag == "--from") {
			return "", config.Userf("unknown stage %q for %s: valid names are %s", name, flag, validNames())
		}
		if c != All && byName[c] == nil {
			return "", config.Userf("stage %s is not available in this build of bootstrap", c)
		}
		return c, nil
	}
	from := func(name string, limit []string) []Stage {
		var out []Stage
		for _, s := range registered {
			if Position(s.Name()) >= Position(name) && (limit == nil || slices.Contains(limit, s.Name())) {
				out = append(out, s)
			}
		}
		return out
	}
	switch {
	case sel.Resume:
		return resume(registered, st, from)
	case sel.From != "":
		name, err := lookup("--from", sel.From)
		if err != nil {
			return nil, err
		}
		return from(name, nil), nil
	case sel.Stage == "" || Canonical(sel.Stage) == All:
		return registered, nil
	default:
		name, err := lookup("--stage", sel.Stage)
		if err != nil {
			return nil, err
		}
		return []Stage{byName[name]}, nil
	}
}

// resume restarts at the first stage of the last run that failed or was
// interrupted (a "running" record left by a killed process counts), and
// continues with the rest of that run's stages.
func resume(registered []Stage, st *state.State, from func(string, []string) []Stage) ([]Stage, error) {
	if st == nil || st.LastRun == nil {
		return nil, &ErrNothingToResume{Reason: "no previous run is recorded; start with `bootstrap run --stage all`"}
	}
	for _, name := range Order {
		if !slices.Contains(st.LastRun.Stages, name) {
			continue
		}
		switch st.Stage(name).EffectiveStatus() {
		case state.Failed, state.Interrupted:
			return from(name, st.LastRun.Stages), nil
		case state.Never:
			// The last run stopped before reaching this stage without
			// recording a failure (killed between stages): resume here.
			return from(name, st.LastRun.Stages), nil
		}
	}
	return nil, &ErrNothingToResume{Reason: fmt.Sprintf("the last run (%s) completed every stage it ran; run a stage explicitly with --stage", strings.Join(st.LastRun.Stages, ", "))}
}

func isUserError(err error) bool {
	var se *StageError
	// A user error inside a stage is a stage failure (exit 1) unless the
	// runner found it changed nothing (StageError.Usage, checked before).
	if errors.As(err, &se) {
		return false
	}
	return config.IsUserError(err)
}
