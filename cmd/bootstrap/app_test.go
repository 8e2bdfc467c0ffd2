package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/gitsnap"
	"github.com/homelab/bootstrap/stages"
	"github.com/homelab/bootstrap/state"
)

// fakeStage records its runs and does what its test tells it to.
type fakeStage struct {
	name string
	h    *harness
}

func (f fakeStage) Name() string { return f.name }

func (f fakeStage) Run(ctx context.Context, env *stages.Env) error {
	f.h.mu.Lock()
	f.h.ran = append(f.h.ran, f.name)
	behave := f.h.behave[f.name]
	f.h.mu.Unlock()
	if err := env.Wet("touch "+f.name, func() error {
		return os.WriteFile(filepath.Join(f.h.dir, "touched-"+f.name), nil, 0o600)
	}); err != nil {
		return err
	}
	switch behave {
	case "fail":
		return errors.New("boom in " + f.name)
	case "block":
		close(f.h.blocked)
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

type harness struct {
	t       *testing.T
	dir     string
	cfg     string
	mu      sync.Mutex
	ran     []string
	behave  map[string]string
	blocked chan struct{}
	// env is the environment the command sees (empty by default).
	env    map[string]string
	stdout bytes.Buffer
	stderr bytes.Buffer
}

func newHarness(t *testing.T) *harness {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "bootstrap.yaml")
	if err := os.WriteFile(cfg, config.Example, 0o600); err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, dir: dir, cfg: cfg, behave: map[string]string{}, blocked: make(chan struct{})}
}

func (h *harness) run(ctx context.Context, args ...string) int {
	h.mu.Lock()
	h.ran = nil
	h.mu.Unlock()
	h.stdout.Reset()
	h.stderr.Reset()
	app := &App{Stdout: &h.stdout, Stderr: &h.stderr, LookupEnv: func(k string) (string, bool) { v, ok := h.env[k]; return v, ok },
		Stages: func() []stages.Stage {
			var out []stages.Stage
			for _, n := range stages.Order {
				out = append(out, fakeStage{name: n, h: h})
			}
			return out
		}}
	return app.Main(ctx, append([]string{"--config", h.cfg, "--log-format", "json"}, args...))
}

func (h *harness) ranStr() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.ran, ",")
}

func (h *harness) state() *state.State {
	st, err := state.Load(filepath.Join(h.dir, "ai/state/homelab"), "homelab")
	if err != nil {
		h.t.Fatal(err)
	}
	return st
}

func TestRunOrderSelectionAndResume(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	all := strings.Join(stages.Order, ",")

	if code := h.run(ctx, "run"); code != 0 || h.ranStr() != all {
		t.Fatalf("run all: code %d ran %s\n%s", code, h.ranStr(), h.stderr.String())
	}
	if code := h.run(ctx, "run", "--stage", "k3s"); code != 0 || h.ranStr() != "talos" {
		t.Fatalf("alias: code %d ran %s", code, h.ranStr())
	}
	if code := h.run(ctx, "run", "--from", "apps"); code != 0 || h.ranStr() != "flux,postcheck" {
		t.Fatalf("from: code %d ran %s", code, h.ranStr())
	}

	// A failure is recorded, exits 1 and stops the pipeline.
	h.behave["infra"] = "fail"
	if code := h.run(ctx, "run", "--stage", "all"); code != 1 || h.ranStr() != "precheck,provision,talos,infra" {
		t.Fatalf("failure: code %d ran %s", code, h.ranStr())
	}
	st := h.state()
	if r := st.Stage("infra"); r.Status != state.Failed || !strings.Contains(r.Error, "boom in infra") || r.Attempts != 2 {
		t.Fatalf("failure not recorded: %+v", r)
	}
	if st.LastRun.ExitCode != 1 || !strings.HasSuffix(st.LastRun.LogPath, "run.log") {
		t.Fatalf("last run: %+v", st.LastRun)
	}
	log, err := os.ReadFile(st.LastRun.LogPath)
	if err != nil || !bytes.Contains(log, []byte("boom in infra")) {
		t.Fatalf("run log lacks the failure: %v", err)
	}

	// Resume starts at the failed stage and finishes the pipeline.
	delete(h.behave, "infra")
	if code := h.run(ctx, "run", "--resume"); code != 0 || h.ranStr() != "infra,flux,postcheck" {
		t.Fatalf("resume: code %d ran %s\n%s", code, h.ranStr(), h.stderr.String())
	}
	if code := h.run(ctx, "run", "--resume"); code != 0 || h.ranStr() != "" || !strings.Contains(h.stderr.String(), "nothing to resume") {
		t.Fatalf("nothing to resume: code %d ran %s stderr %s", code, h.ranStr(), h.stderr.String())
	}
}

func TestUnknownStageFailsBeforeAnything(t *testing.T) {
	h := newHarness(t)
	for _, args := range [][]string{{"run", "--stage", "k8s"}, {"run", "--from", "deploy"}} {
		code := h.run(context.Background(), args...)
		if code != 2 || h.ranStr() != "" {
			t.Fatalf("%v: code %d ran %s", args, code, h.ranStr())
		}
		if !strings.Contains(h.stderr.String(), "valid names are all, precheck, provision, talos, infra, flux, postcheck") {
			t.Fatalf("valid names not listed: %s", h.stderr.String())
		}
	}
	if _, err := os.Stat(filepath.Join(h.dir, "ai")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a rejected command wrote state")
	}
}

func TestBadConfigExits2AndWritesNothing(t *testing.T) {
	h := newHarness(t)
	os.WriteFile(h.cfg, []byte("cluster:\n  nmae: x\n"), 0o600)
	if code := h.run(context.Background(), "run"); code != 2 || h.ranStr() != "" {
		t.Fatalf("code %d ran %s", code, h.ranStr())
	}
	if !strings.Contains(h.stderr.String(), `cluster.nmae: unknown field "nmae"`) {
		t.Fatalf("stderr: %s", h.stderr.String())
	}
	entries, _ := os.ReadDir(h.dir)
	if len(entries) != 1 {
		t.Fatalf("bad config left files behind: %v", entries)
	}
}

func TestDryRunWritesNothing(t *testing.T) {
	h := newHarness(t)
	code := h.run(context.Background(), "run", "--dry-run")
	if code != 0 || h.ranStr() != strings.Join(stages.Order, ",") {
		t.Fatalf("code %d ran %s", code, h.ranStr())
	}
	entries, _ := os.ReadDir(h.dir)
	if len(entries) != 1 {
		t.Fatalf("dry run wrote files: %v", entries)
	}
	out := h.stdout.String()
	if !strings.Contains(out, "Plan (dry run: nothing was changed)") || !strings.Contains(out, "  provision:\n    would touch provision\n") {
		t.Fatalf("plan not grouped by stage:\n%s", out)
	}
}

// A dry run whose planning fails says so in the plan: the failed stage's
// plan is incomplete (not "no changes"), the stages after it unplanned.
func TestFailedDryRunPlan(t *testing.T) {
	h := newHarness(t)
	h.behave["talos"] = "fail"
	if code := h.run(context.Background(), "run", "--dry-run"); code != 1 {
		t.Fatalf("code %d", code)
	}
	out := h.stdout.String()
	for _, want := range []string{
		"  provision:\n    would touch provision\n",
		"  talos:\n    would touch talos\n    FAILED, the plan stops here: boom in talos\n",
		"  infra:\n    not planned: talos failed first\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("plan lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "no changes") {
		t.Errorf("a failed plan says no changes:\n%s", out)
	}
}

func TestInterruptIsRecorded(t *testing.T) {
	h := newHarness(t)
	h.behave["talos"] = "block"
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-h.blocked; cancel() }()
	if code := h.run(ctx, "run"); code != 130 {
		t.Fatalf("code %d, want 130\n%s", code, h.stderr.String())
	}
	st := h.state()
	if st.Stage("talos").Status != state.Interrupted || st.Stage("provision").Status != state.OK || st.Stage("infra").Status != "" && st.Stage("infra").Status != state.Never {
		t.Fatalf("stages: talos %s provision %s infra %s", st.Stage("talos").Status, st.Stage("provision").Status, st.Stage("infra").Status)
	}
	delete(h.behave, "talos")
	if code := h.run(context.Background(), "run", "--resume"); code != 0 || h.ranStr() != "talos,infra,flux,postcheck" {
		t.Fatalf("resume after interrupt: code %d ran %s", code, h.ranStr())
	}
}

func TestLockContentionExits3(t *testing.T) {
	h := newHarness(t)
	dir := filepath.Join(h.dir, "ai/state/homelab")
	lock, err := state.Acquire(dir, state.Holder{PID: 4242, Command: "bootstrap run --stage all", Started: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Release()
	if code := h.run(context.Background(), "run", "--stage", "postcheck"); code != 3 || h.ranStr() != "" {
		t.Fatalf("code %d ran %s", code, h.ranStr())
	}
	if !strings.Contains(h.stderr.String(), "pid 4242 (bootstrap run --stage all)") {
		t.Fatalf("holder not named: %s", h.stderr.String())
	}
	// status reads without the lock.
	if code := h.run(context.Background(), "status"); code != 0 {
		t.Fatalf("status while locked: %d %s", code, h.stderr.String())
	}
}

func TestStatus(t *testing.T) {
	h := newHarness(t)
	h.behave["talos"] = "fail"
	h.run(context.Background(), "run")
	if code := h.run(context.Background(), "status"); code != 0 {
		t.Fatal(h.stderr.String())
	}
	out := h.stdout.String()
	for _, want := range []string{"talos      failed", "boom in talos", "infra      never", "Next: bootstrap run --resume   (restarts at talos"} {
		if !strings.Contains(out, want) {
			t.Fatalf("status lacks %q:\n%s", want, out)
		}
	}
	if code := h.run(context.Background(), "status", "--output", "json"); code != 0 {
		t.Fatal(h.stderr.String())
	}
	var rep statusReport
	if err := json.Unmarshal(h.stdout.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Stages) != 6 || rep.Stages[2].Status != "failed" || rep.Stages[2].Attempts != 1 || !strings.Contains(rep.Next, "--resume") {
		t.Fatalf("json status: %+v", rep)
	}
}

// status shows the snapshot server the state directory records, a
// standalone one (gitsnap serve --state-dir from a systemd unit) included.
func TestStatusShowsAStandaloneSnapshotServer(t *testing.T) {
	h := newHarness(t)
	dir := filepath.Join(h.dir, "ai/state/homelab")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	rec := `{"pid": 999999, "standalone": true, "url": "http://127.0.0.1:1/homelab.git", "listen": "127.0.0.1:1", "branch": "main", "withheld": [{"path": "a.env", "rule": ".env"}]}`
	if err := os.WriteFile(filepath.Join(dir, gitsnap.StateFileName), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := h.run(context.Background(), "status"); code != 0 {
		t.Fatal(h.stderr.String())
	}
	if out := h.stdout.String(); !strings.Contains(out, "Snapshot server: pid 999999 (standalone) alive=false at http://127.0.0.1:1/homelab.git, not answering") {
		t.Errorf("status lacks the standalone server:\n%s", out)
	}
	h.stdout.Reset()
	if code := h.run(context.Background(), "gitsnap", "status"); code != 0 {
		t.Fatal(h.stderr.String())
	}
	if out := h.stdout.String(); !strings.Contains(out, "pid 999999 alive=false") || !strings.Contains(out, "standalone") || !strings.Contains(out, "withheld a.env") {
		t.Errorf("gitsnap status:\n%s", out)
	}
}

// status --all lists every cluster with state under state.dir, whichever
// config named it: here the harness's cluster after a run, and another one.
func TestStatusAll(t *testing.T) {
	h := newHarness(t)
	h.run(context.Background(), "run")
	other := state.New("other")
	other.LastRun = &state.Run{Command: "bootstrap run --stage all", Started: time.Now(), Finished: time.Now(), ExitCode: 1}
	if err := other.Save(filepath.Join(h.dir, "ai/state/other"), time.Now()); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(h.dir, "ai/state/empty"), 0o700)
	if code := h.run(context.Background(), "status", "--all"); code != 0 {
		t.Fatal(h.stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(h.stdout.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "homelab ") || !strings.Contains(lines[1], " 0 ") ||
		!strings.HasPrefix(lines[2], "other ") || !strings.Contains(lines[2], " 1 ") || !strings.Contains(lines[2], "never") {
		t.Fatalf("status --all:\n%s", h.stdout.String())
	}
	if code := h.run(context.Background(), "status", "--all", "--output", "json"); code != 0 {
		t.Fatal(h.stderr.String())
	}
	var all []clusterLine
	if err := json.Unmarshal(h.stdout.Bytes(), &all); err != nil || len(all) != 2 || all[1].LastRun.ExitCode != 1 {
		t.Fatalf("json: %v %s", err, h.stdout.String())
	}
}

func TestConfigCommands(t *testing.T) {
	h := newHarness(t)
	out := filepath.Join(h.dir, "new.yaml")
	if code := h.run(context.Background(), "config", "init", "--output", out); code != 0 {
		t.Fatal(h.stderr.String())
	}
	if code := h.run(context.Background(), "config", "init", "--output", out); code != 2 || !strings.Contains(h.stderr.String(), "already exists") {
		t.Fatalf("init over an existing file: %d %s", code, h.stderr.String())
	}
	if code := h.run(context.Background(), "--config", out, "config", "validate"); code != 0 || !strings.Contains(h.stdout.String(), "is valid") {
		t.Fatalf("validate: %d %s %s", code, h.stdout.String(), h.stderr.String())
	}
	if code := h.run(context.Background(), "config", "schema"); code != 0 || !json.Valid(h.stdout.Bytes()) {
		t.Fatalf("schema: %d", code)
	}
	if code := h.run(context.Background(), "version"); code != 0 || !strings.HasPrefix(h.stdout.String(), "bootstrap ") {
		t.Fatalf("version: %d %s", code, h.stdout.String())
	}
	if code := h.run(context.Background(), "frobnicate"); code != 2 {
		t.Fatalf("unknown command: %d", code)
	}
}

func TestGitsnapServeCommand(t *testing.T) {
	h := newHarness(t)
	repo := filepath.Join(h.dir, "repo")
	os.MkdirAll(filepath.Join(repo, "infra"), 0o755)
	os.WriteFile(filepath.Join(repo, "infra", "ns.yaml"), []byte("kind: Namespace\n"), 0o644)
	os.WriteFile(filepath.Join(repo, "kubeconfig"), []byte("secret"), 0o600)
	for _, args := range [][]string{{"init", "-q", "-b", "main"}, {"add", "."}} {
		if out, err := exec.Command("git", append([]string{"-C", repo}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	serve := []string{"gitsnap", "serve", "--repo", repo, "--listen", addr, "--url", "http://" + addr + "/homelab.git", "--interval", "0"}
	// Secure by default: no credential source, no server.
	if code := h.run(context.Background(), serve...); code == 0 || !strings.Contains(h.stderr.String(), "--anonymous") {
		t.Fatalf("serve without a credential: exit %d, %s", code, h.stderr.String())
	}
	stateDir := filepath.Join(h.dir, "state")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() {
		done <- h.run(ctx, append(serve, "--state-dir", stateDir)...)
	}()
	clone := filepath.Join(h.dir, "clone")
	var out []byte
	var err error
	for i := 0; i < 100; i++ {
		// The credential the server created in --state-dir.
		cred, rerr := os.ReadFile(filepath.Join(stateDir, "gitsnap-auth"))
		if rerr == nil {
			if out, err = exec.Command("git", "clone", "-q", "--depth", "1", "http://"+strings.TrimSpace(string(cred))+"@"+addr+"/homelab.git", clone).CombinedOutput(); err == nil {
				break
			}
		} else {
			err = rerr
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != 0 && code != 130 {
		t.Fatalf("serve exited %d: %s", code, h.stderr.String())
	}
	if err != nil {
		t.Fatalf("clone: %v %s", err, out)
	}
	if _, err := os.Stat(filepath.Join(clone, "infra", "ns.yaml")); err != nil {
		t.Fatal("snapshot lacks infra/ns.yaml")
	}
	if _, err := os.Stat(filepath.Join(clone, "kubeconfig")); err == nil {
		t.Fatal("a kubeconfig was served")
	}
}

func TestShellCompletion(t *testing.T) {
	h := newHarness(t)
	for line, want := range map[string]string{
		"bootstrap ru":            "run\n",
		"bootstrap run --from ta": "talos\n",
		"bootstrap gitsnap se":    "serve\n",
	} {
		t.Setenv("COMP_LINE", line)
		t.Setenv("COMP_POINT", strconv.Itoa(len(line)))
		h.stdout.Reset()
		app := &App{Stdout: &h.stdout, Stderr: &h.stderr, LookupEnv: func(k string) (string, bool) { v, ok := h.env[k]; return v, ok }, Stages: registeredStagesForTest}
		if code := app.Main(context.Background(), nil); code != 0 || h.stdout.String() != want {
			t.Errorf("%q: code %d, completed %q, want %q", line, code, h.stdout.String(), want)
		}
	}
}

func registeredStagesForTest() []stages.Stage { return nil }
