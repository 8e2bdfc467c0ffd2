package stages

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/ui"
)

// besideStage is a stage for the runner's scheduling tests: it records
// its start and end, makes one change, and may wait for another stage to
// have started (to show they run beside each other) or fail.
type besideStage struct {
	name     string
	needs    []string
	waitFor  <-chan struct{}
	started  chan struct{}
	fail     error
	mu       *sync.Mutex
	timeline *[]string
}

func (s besideStage) Name() string { return s.name }

func (s besideStage) note(what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	*s.timeline = append(*s.timeline, what+" "+s.name)
}

func (s besideStage) Run(ctx context.Context, env *Env) error {
	s.note("start")
	close(s.started)
	defer s.note("end")
	if err := env.Wet("change of "+s.name, func() error { return nil }); err != nil {
		return err
	}
	if s.waitFor != nil {
		select {
		case <-s.waitFor:
		case <-time.After(5 * time.Second):
			return errors.New("the other stage did not start beside this one")
		}
	}
	return s.fail
}

// besideNeeds is a besideStage with the Needs ability.
type besideNeeds struct{ besideStage }

func (s besideNeeds) Needs(*config.Config) []string { return s.needs }

// besidePipeline is talos → infra → flux → postcheck where flux needs only
// talos; infra waits (up to 5 s) for flux to have started.
func besidePipeline(infraFails error) ([]Stage, *[]string) {
	var mu sync.Mutex
	var timeline []string
	mk := func(name string) besideStage {
		return besideStage{name: name, started: make(chan struct{}), mu: &mu, timeline: &timeline}
	}
	talos, infra, flux, post := mk(Talos), mk(Infra), mk(Flux), mk(Postcheck)
	infra.waitFor, infra.fail = flux.started, infraFails
	flux.needs = []string{Talos}
	return []Stage{talos, infra, besideNeeds{flux}, post}, &timeline
}

func besideEnv(t *testing.T, dry bool) *Env {
	env := prepEnv(t)
	env.Out = &strings.Builder{}
	env.DryRun = dry
	env.State = state.New("lab")
	env.Paths = config.Paths{StateDir: t.TempDir()}
	env.Config = &config.Config{}
	env.Secrets = &redact.Set{}
	return env
}

// TestRunStartsAStageBesideThoseItDoesNotNeed: a stage whose Needs leave
// out the stage before it starts while that one runs; each records its own
// changes and outcome, and the stage that needs both waits for both.
func TestRunStartsAStageBesideThoseItDoesNotNeed(t *testing.T) {
	sel, timeline := besidePipeline(nil)
	env := besideEnv(t, false)
	if err := Run(context.Background(), env, sel, RunInfo{ID: "t"}); err != nil {
		t.Fatalf("%v (timeline %v)", err, *timeline)
	}
	got := *timeline
	at := func(what string) int { return slices.Index(got, what) }
	if at("start flux") > at("end infra") {
		t.Errorf("flux started after infra ended: %v", got)
	}
	if at("start postcheck") < at("end infra") || at("start postcheck") < at("end flux") {
		t.Errorf("postcheck started before the stages it needs ended: %v", got)
	}
	for _, name := range []string{Talos, Infra, Flux, Postcheck} {
		rec := env.State.Stage(name)
		if rec.Status != state.OK || len(rec.Changes) != 1 || rec.Changes[0] != "change of "+name {
			t.Errorf("%s recorded %s with changes %v", name, rec.Status, rec.Changes)
		}
	}
	saved, err := state.Load(env.Paths.StateDir, "lab")
	if err != nil {
		t.Fatal(err)
	}
	if rec := saved.Stage(Flux); rec.Status != state.OK {
		t.Errorf("the saved state has flux %s", rec.Status)
	}
}

// TestRunAStageBesideAFailureFinishes: when the stage beside fails, the
// one running finishes and is recorded as it ended; nothing after them
// starts, and the run's error is the failed stage's.
func TestRunAStageBesideAFailureFinishes(t *testing.T) {
	sel, timeline := besidePipeline(errors.New("chart install failed"))
	env := besideEnv(t, false)
	err := Run(context.Background(), env, sel, RunInfo{ID: "t"})
	var se *StageError
	if !errors.As(err, &se) || se.Stage != Infra {
		t.Fatalf("run error %v, want infra's", err)
	}
	if slices.Contains(*timeline, "start postcheck") {
		t.Errorf("postcheck ran after a failure: %v", *timeline)
	}
	if rec := env.State.Stage(Flux); rec.Status != state.OK {
		t.Errorf("flux, beside the failure, recorded %s", rec.Status)
	}
	if rec := env.State.Stage(Infra); rec.Status != state.Failed || !strings.Contains(rec.Error, "chart install failed") {
		t.Errorf("infra recorded %s %q", rec.Status, rec.Error)
	}
	if rec := env.State.Stage(Postcheck); rec.Status != state.Never {
		t.Errorf("postcheck recorded %s", rec.Status)
	}
}

// TestDryRunRunsStagesOneAfterAnother: a dry run's plan reads stage by
// stage, so nothing runs beside anything.
func TestDryRunRunsStagesOneAfterAnother(t *testing.T) {
	sel, timeline := besidePipeline(nil)
	// Infra would wait for flux: in a dry run it must not.
	sel[1] = besideStage{name: Infra, started: make(chan struct{}), mu: &sync.Mutex{}, timeline: timeline}
	env := besideEnv(t, true)
	if err := Run(context.Background(), env, sel, RunInfo{ID: "t"}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(*timeline, ", "); !strings.Contains(got, "end infra, start flux") {
		t.Errorf("dry run order: %s", got)
	}
}

// TestFluxRunsBesideInfraOnlyOnTalosNetwork: Flux needs the infra stage
// when the pod network is the infra stage's or the user's.
func TestFluxRunsBesideInfraOnlyOnTalosNetwork(t *testing.T) {
	for cni, want := range map[string]bool{"flannel": false, "cilium": true, "none": true} {
		cfg := &config.Config{CNI: config.CNI{Name: cni}}
		needs := FluxStage{}.Needs(cfg)
		if got := needs == nil || slices.Contains(needs, Infra); got != want {
			t.Errorf("cni %s: flux needs infra %v (Needs %v)", cni, got, needs)
		}
	}
}

// TestForStageCopiesEveryExportedField: a stage's view of the run's Env
// carries every exported field; a field added to Env must be added to
// forStage too (this list fails until it is).
func TestForStageCopiesEveryExportedField(t *testing.T) {
	copied := []string{"Config", "Paths", "State", "Log", "UI", "Out", "DryRun", "Secrets", "Options", "Now", "LogPath", "Warnings"}
	typ := reflect.TypeFor[Env]()
	for i := range typ.NumField() {
		if f := typ.Field(i); f.IsExported() && !slices.Contains(copied, f.Name) {
			t.Errorf("Env.%s is not copied by forStage", f.Name)
		}
	}
	env := besideEnv(t, true)
	env.LogPath, env.Options.NewEtcd, env.Warnings = "run.log", true, &ui.Warnings{}
	view := env.forStage(Flux, env.Log)
	if view.Config != env.Config || view.State != env.State || view.Secrets != env.Secrets || view.LogPath != env.LogPath ||
		view.DryRun != env.DryRun || view.Options != env.Options || view.Paths != env.Paths || view.Out != env.Out || view.Warnings != env.Warnings {
		t.Error("the view differs from the run's Env")
	}
}
