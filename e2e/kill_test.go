package e2e_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/gitsnap"
	"github.com/homelab/bootstrap/stages"
	"github.com/homelab/bootstrap/state"
)

var (
	killCases = flag.Int("kill-cases", envInt("E2E_KILL_CASES", 20), "kill -9 points in TestKillAndResume (env E2E_KILL_CASES)")
	killSeed  = flag.Int64("kill-seed", int64(envInt("E2E_KILL_SEED", 1)), "seed of the kill points (env E2E_KILL_SEED)")
	// Ten points per lab: the 20 points run on two labs side by side. A
	// lab per four points (five labs) cost twice the CPU for the same
	// points and the same stages hit (measured: 122.8 against 65.6 CPU-s,
	// 96 against 47 s alone), and a point after a chain's first lands in a
	// resumed run, which is the harder case.
	killChain = flag.Int("kill-chain", envInt("E2E_KILL_CHAIN", 10), "kill points per lab: each resume may be killed again (env E2E_KILL_CHAIN)")
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// The kill tests run 3 control planes and a worker: enough for a second
// etcd bootstrap to be possible, so that exactly one is a real finding.
var killLab = e2e.Options{ControlPlanes: 3, Workers: 1}

// TestKillAndResume kills the binary with SIGKILL at seeded random points
// spread over every stage, then runs `bootstrap run --resume` (or `--stage
// all` when there is nothing to resume) until the pipeline is done. The
// points are stratified by stage (each stage gets its share whatever its
// length) and placed within a stage by the run's own progress: a point is
// the n-th progress event of its stage, drawn from the events a reference
// run logged there, so where a kill lands does not depend on how fast the
// machine runs. To keep the cost of a lab per point down, the points are
// dealt into chains of -kill-chain, each chain on a fresh lab, in pipeline
// order: the resume after one kill is itself killed at the next point. The
// chains run side by side. After every kill the secrets bundle is
// byte-identical to the one first written, at most one etcd bootstrap
// happened and no VM is duplicated; at the end of every chain the run is
// green with exactly one etcd bootstrap, exactly the configured VMs, the
// same secrets bundle and no Helm release pending.
func TestKillAndResume(t *testing.T) {
	t.Parallel()
	start := time.Now()
	// Not testContext: this parent holds no lab slot of its own (its
	// reference run and chains take theirs), and its budget covers their
	// waits for one.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	t.Cleanup(cancel)
	ref := referenceEvents(t, ctx)
	rng := rand.New(rand.NewPCG(uint64(*killSeed), 0x6b696c6c))
	chains := chainKillPoints(killPoints(ref, *killCases, rng), *killChain, rng)
	t.Logf("seed %d: %d kill points in %d chains (reference run's progress events: %s)", *killSeed, *killCases, len(chains), formatEvents(ref))

	var mu sync.Mutex
	landed := map[string]int{}
	t.Run("chains", func(t *testing.T) {
		for i, chain := range chains {
			t.Run(fmt.Sprintf("chain%02d", i+1), func(t *testing.T) {
				t.Parallel()
				for _, k := range runKillChain(t, ctx, chain) {
					mu.Lock()
					landed[k]++
					mu.Unlock()
				}
			})
		}
	})
	var dist []string
	for _, s := range stages.Order {
		dist = append(dist, fmt.Sprintf("%s %d", s, landed[s]))
	}
	t.Logf("kills landed per stage: %s (%d missed); %s in all", strings.Join(dist, ", "), landed[""], time.Since(start).Round(time.Second))
	if t.Failed() {
		return
	}
	// Every stage must have been hit when there are enough points.
	if *killCases >= 2*len(stages.Order) {
		for _, s := range stages.Order {
			if landed[s] == 0 {
				t.Errorf("no kill landed in stage %s: the points do not cover the pipeline", s)
			}
		}
	}
	// A point is at the latest its stage's last event: only a run that
	// failed or skipped the stage can miss it.
	if landed[""] != 0 {
		t.Errorf("%d of %d kill points were missed (the run finished first)", landed[""], *killCases)
	}
}

// referenceEvents runs the pipeline once, uninterrupted and logging at the
// kill runs' level, on the kill tests' lab and counts each stage's progress
// events. The lab is gone (and its slot free) when it returns.
func referenceEvents(t *testing.T, ctx context.Context) map[string]int {
	t.Helper()
	ref := map[string]int{}
	ok := t.Run("reference", func(t *testing.T) {
		h := startHarness(t, killLab)
		r, err := h.RunWith(ctx, e2e.RunOptions{Debug: true}, "run", "--stage", "all")
		if err != nil {
			t.Fatal(err)
		}
		if r.ExitCode != 0 {
			t.Fatalf("reference run failed:\n%s", r.Tail(40))
		}
		for _, ev := range r.Events {
			ref[ev.Stage]++
		}
		for _, s := range stages.Order {
			if ref[s] == 0 {
				t.Fatalf("the reference run logged no progress in stage %s", s)
			}
		}
	})
	if !ok {
		t.FailNow()
	}
	if len(ref) == 0 {
		// The reference run was skipped (-short, or no lab): so is this.
		t.Skip("no reference run: the lab is unavailable")
	}
	return ref
}

func formatEvents(ref map[string]int) string {
	var parts []string
	for _, s := range stages.Order {
		parts = append(parts, fmt.Sprintf("%s %d", s, ref[s]))
	}
	return strings.Join(parts, ", ")
}

// killPoints spreads n points over the stages: each stage gets n/6 of
// them, the remainder goes to the stages with the most progress events,
// and each point is a uniformly random event of its stage.
func killPoints(ref map[string]int, n int, rng *rand.Rand) []e2e.KillPoint {
	byLength := slices.Clone(stages.Order)
	slices.SortStableFunc(byLength, func(a, b string) int { return ref[b] - ref[a] })
	var out []e2e.KillPoint
	for i := 0; i < n; i++ {
		var stage string
		if i < n/len(stages.Order)*len(stages.Order) {
			stage = stages.Order[i%len(stages.Order)]
		} else {
			stage = byLength[i%len(stages.Order)]
		}
		out = append(out, e2e.KillPoint{Stage: stage, Event: rng.IntN(ref[stage])})
	}
	return out
}

// chainKillPoints deals the points into chains of size at random and
// orders each chain along the pipeline.
func chainKillPoints(points []e2e.KillPoint, size int, rng *rand.Rand) [][]e2e.KillPoint {
	rng.Shuffle(len(points), func(i, j int) { points[i], points[j] = points[j], points[i] })
	var chains [][]e2e.KillPoint
	for len(points) > 0 {
		n := min(size, len(points))
		c := slices.Clone(points[:n])
		points = points[n:]
		slices.SortFunc(c, func(a, b e2e.KillPoint) int {
			if d := stages.Position(a.Stage) - stages.Position(b.Stage); d != 0 {
				return d
			}
			return a.Event - b.Event
		})
		chains = append(chains, c)
	}
	return chains
}

// runKillChain runs one chain on a fresh lab and returns the stage each
// kill landed in ("" for a point the run finished before).
func runKillChain(t *testing.T, ctx context.Context, chain []e2e.KillPoint) []string {
	h := startHarness(t, killLab)
	var (
		landed  []string
		secrets []byte
		args    = []string{"run", "--stage", "all"}
		log     []string
	)
	checkInvariants := func(after string) {
		t.Helper()
		b, err := os.ReadFile(h.Paths().Secrets)
		switch {
		case err == nil && secrets == nil:
			secrets = b
		case err == nil && !bytes.Equal(b, secrets):
			t.Fatalf("%s: the secrets bundle %s changed", after, h.Paths().Secrets)
		case err != nil && secrets != nil:
			t.Fatalf("%s: the secrets bundle is gone: %v", after, err)
		}
		if n := h.Lab.Talos.Bootstraps(); n > 1 || len(h.Lab.Talos.SplitBrains()) > 0 {
			t.Fatalf("%s: %d etcd bootstraps (split brains: %v)", after, n, h.Lab.Talos.SplitBrains())
		}
		if err := checkVMs(h, false); err != nil {
			t.Fatalf("%s: %v", after, err)
		}
	}
	for i, k := range chain {
		r, err := h.RunKill(ctx, &k, args...)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case r.Killed:
			landed = append(landed, r.KilledIn)
			log = append(log, fmt.Sprintf("%s: killed in %s after event %d %q", strings.Join(args, " "), r.KilledIn, r.KilledAt, r.KilledEvent))
		case r.ExitCode == 0:
			// The run finished before the point: the rest of the chain
			// would only kill no-op runs.
			for range chain[i:] {
				landed = append(landed, "")
			}
			log = append(log, fmt.Sprintf("%s: finished before %s", strings.Join(args, " "), k))
			t.Logf("chain: %s", strings.Join(log, "; "))
			checkInvariants("the last run")
			checkChainEnd(t, ctx, h, secrets)
			return landed
		default:
			t.Fatalf("run before kill point %s failed (%s):\n%s", k, strings.Join(log, "; "), r.Tail(40))
		}
		checkInvariants(fmt.Sprintf("kill %d (%s)", i+1, r.KilledIn))
		args = []string{"run", "--resume"}
	}
	// Resume until done: --resume, or --stage all when there is nothing
	// to resume (killed before the run recorded a stage).
	for attempt := 1; ; attempt++ {
		r := run(t, ctx, h, args...)
		if r.ExitCode != 0 {
			t.Fatalf("%s after %s failed:\n%s", strings.Join(args, " "), strings.Join(log, "; "), r.Tail(40))
		}
		log = append(log, strings.Join(args, " ")+": ok, stages "+strings.Join(r.Stages, ","))
		if strings.Contains(r.Stderr, "nothing to resume") && attempt == 1 {
			args = []string{"run", "--stage", "all"}
			continue
		}
		break
	}
	t.Logf("chain: %s", strings.Join(log, "; "))
	checkInvariants("the last run")
	checkChainEnd(t, ctx, h, secrets)
	return landed
}

// checkChainEnd wants the cluster green with exactly one etcd bootstrap,
// exactly the configured VMs, the secrets bundle as first written, and no
// Helm release left pending.
func checkChainEnd(t *testing.T, ctx context.Context, h *e2e.Harness, secrets []byte) {
	t.Helper()
	if err := h.PostcheckGreen(); err != nil {
		t.Fatalf("not green at the end: %v", err)
	}
	c := counters(t, ctx, h)
	if c.EtcdBootstraps != 1 || c.TalosBootstraps != 1 {
		t.Errorf("etcd bootstraps: %d clusters, %d accepted Bootstrap calls; want exactly 1", c.EtcdBootstraps, c.TalosBootstraps)
	}
	if err := checkVMs(h, true); err != nil {
		t.Error(err)
	}
	if b, err := os.ReadFile(h.Paths().Secrets); err != nil || !bytes.Equal(b, secrets) {
		t.Errorf("secrets bundle not as first written (%v)", err)
	}
	// The snapshot server the cluster pulls from is the one recorded, at the
	// recorded hash, even when a run was killed while starting it.
	st, err := state.Load(h.Paths().StateDir, h.Config().Cluster.Name)
	if err != nil {
		t.Fatal(err)
	}
	rec := st.Outputs.GitSnapshot
	if snap, err := gitsnap.Check(ctx, h.Paths().StateDir); err != nil || snap.State == nil || snap.State.PID != rec.PID || !snap.Serves(rec.Hash) {
		t.Errorf("git snapshot server: the run recorded %+v; found %+v (%v)", rec, snap, err)
	}
	if len(c.HelmReleases) == 0 {
		t.Errorf("no Helm release found")
	}
	for name, r := range c.HelmReleases {
		if r.Status != "deployed" || len(r.Pending) > 0 {
			t.Errorf("Helm release %s: revision %d %s, pending revisions %v", name, r.Revision, r.Status, r.Pending)
		}
	}
}

// checkVMs wants no VM outside the config and no name twice; complete also
// wants every configured VM.
func checkVMs(h *e2e.Harness, complete bool) error {
	want := map[int]string{}
	for _, n := range h.Config().Nodes {
		want[n.VMID] = n.Name
	}
	names := map[string]int{}
	ids := h.Lab.PVE.VMIDs()
	for _, id := range ids {
		vm, _ := h.Lab.PVE.VM(id)
		name := vm.Config["name"]
		if want[id] != name {
			return fmt.Errorf("VM %d %q is not in the config", id, name)
		}
		if other, dup := names[name]; dup {
			return fmt.Errorf("VM name %s twice: %d and %d", name, other, id)
		}
		names[name] = id
	}
	if complete && len(ids) != len(want) {
		return fmt.Errorf("VMs %v, want %d: %v", ids, len(want), want)
	}
	return nil
}
