package stages

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/talos"
	"github.com/homelab/bootstrap/ui"
)

func prepEnv(t *testing.T) *Env {
	log := zerolog.New(zerolog.NewTestWriter(t))
	return &Env{Log: log, UI: ui.NewReporter(log), Now: time.Now}
}

// TestTakePrepared: a result is taken once; a wait for one is bounded and
// names it; one that failed or panicked, or was never started, reads as not
// prepared, so the stage does the work in line.
func TestTakePrepared(t *testing.T) {
	ctx := context.Background()
	env := prepEnv(t)

	env.prepare(ctx, "ok", "the answer", func(context.Context) (any, error) { return 42, nil })
	if v, ok, err := takePrepared[int](ctx, env, "ok", time.Second); err != nil || !ok || v != 42 {
		t.Fatalf("took %v %v %v, want 42", v, ok, err)
	}
	if _, ok, err := takePrepared[int](ctx, env, "ok", time.Second); ok || err != nil {
		t.Fatalf("a result was taken twice (%v, %v)", ok, err)
	}
	if _, ok, err := takePrepared[int](ctx, env, "never", time.Second); ok || err != nil {
		t.Fatalf("work never started reads as prepared (%v, %v)", ok, err)
	}

	release := make(chan struct{})
	defer close(release)
	env.prepare(ctx, "slow", "the slow thing", func(context.Context) (any, error) { <-release; return 1, nil })
	_, _, err := takePrepared[int](ctx, env, "slow", 50*time.Millisecond)
	if !errors.Is(err, wait.ErrTimeout) || !strings.Contains(err.Error(), "the slow thing") {
		t.Fatalf("unbounded or unnamed wait: %v", err)
	}

	env.prepare(ctx, "failed", "a failing thing", func(context.Context) (any, error) { return nil, errors.New("boom") })
	env.prepare(ctx, "panics", "a panicking thing", func(context.Context) (any, error) { panic("bug") })
	env.prepare(ctx, "type", "a thing of another type", func(context.Context) (any, error) { return "text", nil })
	for _, key := range []string{"failed", "panics", "type"} {
		if _, ok, err := takePrepared[int](ctx, env, key, time.Second); ok || err != nil {
			t.Errorf("%s: read as prepared (%v, %v)", key, ok, err)
		}
	}
}

// prepStage records when it was prepared and run.
type prepStage struct {
	name string
	log  *[]string
}

func (s prepStage) Name() string { return s.name }
func (s prepStage) Run(context.Context, *Env) error {
	*s.log = append(*s.log, "run "+s.name)
	return nil
}
func (s prepStage) Prepare(context.Context, *Env) { *s.log = append(*s.log, "prepare "+s.name) }

// TestRunPreparesBeforeTheFirstStage: every selected stage's background
// work starts before the first stage runs, dry runs included.
func TestRunPreparesBeforeTheFirstStage(t *testing.T) {
	for _, dry := range []bool{false, true} {
		var log []string
		env := prepEnv(t)
		env.Out = &strings.Builder{}
		env.DryRun = dry
		env.State = state.New("lab")
		env.Paths = config.Paths{StateDir: t.TempDir()}
		sel := []Stage{prepStage{Provision, &log}, prepStage{Talos, &log}}
		if err := Run(context.Background(), env, sel, RunInfo{ID: "t"}); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(log, ", "); got != "prepare provision, prepare talos, run provision, run talos" {
			t.Errorf("dry run %v: %s", dry, got)
		}
	}
}

// TestTalosPrepareMintsTheBundleTheStageStores: without a bundle on disk
// the talos stage's Prepare mints one, and the plan renders with it
// instead of minting another (an RSA-4096 key each); with a bundle on disk
// nothing is minted.
func TestTalosPrepareMintsTheBundleTheStageStores(t *testing.T) {
	dir := t.TempDir()
	env := prepEnv(t)
	env.Config = &config.Config{Cluster: config.Cluster{TalosVersion: "v1.13.3"}}
	env.Paths = config.Paths{Secrets: filepath.Join(dir, talos.SecretsFile)}
	ctx := context.Background()

	TalosStage{}.Prepare(ctx, env)
	minted, ok, err := takePrepared[mintedBundle](ctx, env, prepBundle, time.Minute)
	if err != nil || !ok || minted.bundle == nil || minted.talosVersion != "v1.13.3" {
		t.Fatalf("no bundle minted: %v %v", ok, err)
	}
	plan, err := talos.Plan(talos.GenerateOptions{Dir: dir, ClusterName: "lab", Endpoint: "https://10.0.0.10:6443", TalosVersion: "v1.13.3",
		KubernetesVersion: "1.36.1", Nodes: []talos.Node{{Name: "cp-1", Role: talos.RoleControlPlane, IP: "10.0.0.11"}}, NewBundle: minted.bundle})
	if err != nil {
		t.Fatal(err)
	}
	if plan.Bundle != minted.bundle || !plan.SecretsCreated {
		t.Error("the plan minted another bundle instead of the prepared one")
	}

	if err := os.WriteFile(env.Paths.Secrets, []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	TalosStage{}.Prepare(ctx, env)
	if _, ok, _ := takePrepared[mintedBundle](ctx, env, prepBundle, time.Minute); ok {
		t.Error("a bundle was minted although the cluster has one")
	}
}

// TestFluxInstallObjectsPreparedForOtherOptions: Flux's objects rendered
// in the background are used only when they were rendered from the
// options the stage has now (a patch changed the cluster's DNS domain:
// rendered again).
func TestFluxInstallObjectsPreparedForOtherOptions(t *testing.T) {
	ctx := context.Background()
	env := prepEnv(t)
	env.Config = &config.Config{Flux: config.Flux{Version: "v2.9.5", Manifests: filepath.Join(t.TempDir(), "absent.tar.gz")}}
	const sentinel = "apiVersion: v1\nkind: Prepared\nmetadata:\n  name: x\n"
	prepared := func(domain string) {
		opts := fluxInstallOptions(env, domain)
		env.prepare(ctx, prepFluxInstall, "Flux", func(context.Context) (any, error) { return renderedFlux{opts: opts, manifests: sentinel}, nil })
	}

	prepared("")
	objs, err := fluxInstallObjects(ctx, env, fluxInstallOptions(env, talos.DefaultDNSDomain))
	if err != nil || len(objs) != 1 || objs[0].GetKind() != "Prepared" {
		t.Fatalf("the prepared objects were not used: %v", err)
	}

	prepared("")
	_, err = fluxInstallObjects(ctx, env, fluxInstallOptions(env, "homelab.internal"))
	if err == nil || !strings.Contains(err.Error(), "absent.tar.gz") {
		t.Fatalf("objects rendered for cluster.local were used for homelab.internal (%v)", err)
	}
}

// cpuPrepStage prepares CPU work that records whether the precheck had
// ended when it started.
type cpuPrepStage struct {
	prepStage
	started chan bool
	ended   *bool
}

func (s cpuPrepStage) Prepare(ctx context.Context, env *Env) {
	env.prepareCPU(ctx, "cpu", "the CPU work", func(context.Context) (any, error) {
		s.started <- *s.ended
		return nil, nil
	})
}

// precheckStage passes or fails after a pause long enough for work that
// does not wait for it to have started.
type precheckStage struct {
	fail  bool
	ended *bool
}

func (precheckStage) Name() string { return Precheck }
func (s precheckStage) Run(context.Context, *Env) error {
	time.Sleep(50 * time.Millisecond)
	*s.ended = true
	if s.fail {
		return errors.New("a precheck failed")
	}
	return nil
}

// TestCPUPreparationWaitsForThePrecheck: CPU work in the background
// starts once the precheck has passed, not beside it, and never after a
// failed one; without a precheck in the run it starts at once.
func TestCPUPreparationWaitsForThePrecheck(t *testing.T) {
	for _, tc := range []struct {
		name     string
		precheck bool
		fail     bool
	}{{"passed", true, false}, {"failed", true, true}, {"no precheck", false, false}} {
		var log []string
		var ended bool
		env := prepEnv(t)
		env.Out = &strings.Builder{}
		env.State = state.New("lab")
		env.Paths = config.Paths{StateDir: t.TempDir()}
		env.Secrets = &redact.Set{}
		started := make(chan bool, 1)
		cpu := cpuPrepStage{prepStage{Talos, &log}, started, &ended}
		sel := []Stage{cpu}
		if tc.precheck {
			sel = []Stage{precheckStage{tc.fail, &ended}, cpu}
		}
		err := Run(context.Background(), env, sel, RunInfo{ID: "t"})
		if (err != nil) != tc.fail {
			t.Fatalf("%s: run: %v", tc.name, err)
		}
		select {
		case afterPrecheck := <-started:
			switch {
			case tc.fail:
				t.Errorf("%s: the CPU work started after a failed precheck", tc.name)
			case tc.precheck && !afterPrecheck:
				t.Errorf("%s: the CPU work started beside the precheck", tc.name)
			}
		case <-time.After(time.Second):
			if !tc.fail {
				t.Errorf("%s: the CPU work never started", tc.name)
			}
		}
	}
}

// TestCPUPreparationRunsOneAfterAnother: CPU work runs in the order it was
// prepared, each piece once the one before has ended.
func TestCPUPreparationRunsOneAfterAnother(t *testing.T) {
	ctx := context.Background()
	env := prepEnv(t)
	var mu sync.Mutex
	var order []string
	running := 0
	work := func(name string) func(context.Context) (any, error) {
		return func(context.Context) (any, error) {
			mu.Lock()
			running++
			overlap := running > 1
			order = append(order, name)
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			mu.Lock()
			running--
			mu.Unlock()
			if overlap {
				return nil, errors.New(name + " ran beside other CPU work")
			}
			return name, nil
		}
	}
	for _, name := range []string{"first", "second", "third"} {
		env.prepareCPU(ctx, name, name, work(name))
	}
	for _, name := range []string{"third", "first", "second"} {
		if v, ok, err := takePrepared[string](ctx, env, name, time.Second); err != nil || !ok || v != name {
			t.Errorf("%s: %v %v %v", name, v, ok, err)
		}
	}
	if got := strings.Join(order, ", "); got != "first, second, third" {
		t.Errorf("order %s", got)
	}
}
