package gitsnap

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// detachedOptions starts this test binary as `bootstrap gitsnap serve`.
func detachedOptions(t *testing.T, fx fixture, env ...string) StartOptions {
	t.Helper()
	addr := freeAddr(t)
	stateDir := filepath.Join(t.TempDir(), "ai", "state", "homelab")
	// Detached servers run with the cluster's credential, as the flux
	// stage starts them.
	_, authFile, err := EnsureAuth(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	opts := StartOptions{
		Flags: ServeFlags{
			Repo: fx.dir, Listen: addr, URL: "http://" + addr + "/homelab.git",
			Branch: testRepoBranch, Interval: time.Hour, Exclude: fx.excludes, Protect: fx.protect, Path: fixtureFluxPath, Tree: true, AuthFile: authFile,
		},
		StateDir:   stateDir,
		Executable: os.Args[0],
		Env:        append([]string{serveEnv + "=1"}, env...),
		Timeout:    30 * time.Second,
		Log:        zerolog.New(zerolog.NewTestWriter(t)),
	}
	t.Cleanup(func() {
		if _, err := Stop(context.Background(), stateDir, 2*time.Second, zerolog.Nop()); err != nil {
			t.Errorf("cleanup Stop: %v", err)
		}
	})
	return opts
}

func procSession(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	sid, err := strconv.Atoi(fields[3]) // state ppid pgrp session
	if err != nil {
		t.Fatal(err)
	}
	return sid
}

func TestDetachedServerLifecycle(t *testing.T) {
	fx := newFixture(t)
	want := fx.build(t).Hash.String()
	opts := detachedOptions(t, fx)
	ctx := context.Background()

	st, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if st.PID <= 0 || st.Hash != want || st.URL != opts.Flags.URL || st.Listen != opts.Flags.Listen {
		t.Fatalf("Start recorded %+v, want a pid, hash %s, %s, %s", st, want, opts.Flags.URL, opts.Flags.Listen)
	}
	recorded, err := ReadState(opts.StateDir)
	if err != nil || recorded == nil || recorded.PID != st.PID || recorded.Hash != want {
		t.Fatalf("state file: %+v %v", recorded, err)
	}
	if fi, err := os.Stat(filepath.Join(opts.StateDir, StateFileName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("state file mode: %v %v", fi, err)
	}
	if sid := procSession(t, st.PID); sid != st.PID {
		t.Errorf("server session = %d, want its own session %d (setsid)", sid, st.PID)
	}
	auth, err := ReadAuth(opts.Flags.AuthFile)
	if err != nil {
		t.Fatal(err)
	}
	if out := git(t, "", "ls-remote", withAuth(st.URL, auth), "refs/heads/main"); !strings.HasPrefix(out, want) {
		t.Errorf("ls-remote of the detached server: %s", out)
	}
	dst := filepath.Join(t.TempDir(), "clone")
	git(t, "", "clone", "-q", "--depth", "1", withAuth(st.URL, auth), dst)
	checkClone(t, fx, dst)

	status, err := Check(ctx, opts.StateDir)
	if err != nil || !status.Alive || !status.Serves(want) {
		t.Fatalf("Check: %+v %v, want alive and serving %s", status, err, want)
	}
	if status.ServedByPID != st.PID {
		t.Errorf("the URL is answered by pid %d, want %d", status.ServedByPID, st.PID)
	}
	if status.Serves(strings.Repeat("0", 40)) {
		t.Error("Serves() is true for a hash that is not served")
	}
	if _, err := Start(ctx, opts); !errors.Is(err, ErrAlreadyRunning) {
		t.Errorf("a second Start: %v, want ErrAlreadyRunning", err)
	}

	got, action, err := Ensure(ctx, opts, want)
	if err != nil || action != EnsureReused || got.PID != st.PID {
		t.Fatalf("Ensure of a serving server: %v %v %v, want reused pid %d", got, action, err, st.PID)
	}

	// A stale hash is refreshed in place (SIGHUP), keeping pid and URL.
	writeFile(t, fx.dir, "infra/app.yaml", "kind: Detached\n", 0o644)
	newHash := fx.build(t).Hash.String()
	got, action, err = Ensure(ctx, opts, newHash)
	if err != nil || action != EnsureRefreshed || got.PID != st.PID {
		t.Fatalf("Ensure after an edit: %+v %v %v, want refreshed pid %d", got, action, err, st.PID)
	}
	if h, err := Probe(ctx, st.URL, testRepoBranch, &auth); err != nil || h.String() != newHash {
		t.Errorf("served after refresh: %s %v, want %s", h, err, newHash)
	}
	waitFor(t, "the state file to record the refreshed hash", func() bool {
		s, err := ReadState(opts.StateDir)
		return err == nil && s != nil && s.Hash == newHash
	})

	// Other settings replace the server.
	changed := opts
	changed.Flags.Interval = time.Minute
	got, action, err = Ensure(ctx, changed, newHash)
	if err != nil || action != EnsureRestarted || got.PID == st.PID {
		t.Fatalf("Ensure with another interval: %+v %v %v, want a restarted server", got, action, err)
	}
	if processAlive(st.PID) {
		t.Errorf("the replaced server (pid %d) is still alive", st.PID)
	}

	stopped, err := Stop(ctx, opts.StateDir, 5*time.Second, zerolog.Nop())
	if err != nil || !stopped {
		t.Fatalf("Stop: %v %v", stopped, err)
	}
	if processAlive(got.PID) {
		t.Errorf("pid %d alive after Stop", got.PID)
	}
	if s, err := ReadState(opts.StateDir); s != nil || err != nil {
		t.Errorf("state after Stop: %+v %v", s, err)
	}
	if _, err := Probe(ctx, st.URL, testRepoBranch, &auth); err == nil {
		t.Error("the URL still answers after Stop")
	}
	if stopped, err := Stop(ctx, opts.StateDir, time.Second, zerolog.Nop()); stopped || err != nil {
		t.Errorf("Stop with nothing running: %v %v", stopped, err)
	}
	if log, err := os.ReadFile(filepath.Join(opts.StateDir, LogFileName)); err != nil || !strings.Contains(string(log), "snapshot changed") {
		t.Errorf("the server log lacks the refresh line (%v):\n%s", err, log)
	}
}

func TestDetachedStopKillsAServerIgnoringSIGTERM(t *testing.T) {
	fx := newFixture(t)
	opts := detachedOptions(t, fx, ignoreTermEnv+"=1")
	st, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	start := time.Now()
	stopped, err := Stop(context.Background(), opts.StateDir, 500*time.Millisecond, zerolog.New(zerolog.NewTestWriter(t)))
	if err != nil || !stopped {
		t.Fatalf("Stop: %v %v", stopped, err)
	}
	if elapsed := time.Since(start); elapsed < 500*time.Millisecond {
		t.Errorf("Stop returned after %s: the server should have outlived SIGTERM", elapsed)
	}
	if processAlive(st.PID) {
		t.Errorf("pid %d alive after SIGKILL", st.PID)
	}
}

func TestDetachedStartFailureQuotesTheLog(t *testing.T) {
	fx := newFixture(t)
	for _, tc := range []struct {
		name string
		// occupy holds the port with ln and returns a func that frees it.
		occupy func(t *testing.T, ln net.Listener, opts StartOptions) func()
	}{
		{"silent listener", func(t *testing.T, ln net.Listener, opts StartOptions) func() {
			return func() { ln.Close() }
		}},
		{"another git server", func(t *testing.T, ln net.Listener, opts StartOptions) func() {
			srv, err := NewServer(context.Background(), ServerOptions{Build: BuildOptions{Dir: fx.dir, FluxPath: fixtureFluxPath, ServeWholeTree: true}, URL: opts.Flags.URL})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Serve(ctx, ln, nil) }()
			return func() { cancel(); <-done }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The port is bound here and then handed to the server, not
			// picked free and bound later: in between, under a loaded
			// make test, another process took it ("bind: address already
			// in use" in the test's own Listen, the third cold CI run).
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			opts := detachedOptions(t, fx)
			opts.Flags.Listen = ln.Addr().String()
			opts.Flags.URL = "http://" + opts.Flags.Listen + "/homelab.git"
			defer tc.occupy(t, ln, opts)()
			start := time.Now()
			_, err = Start(context.Background(), opts)
			if err == nil {
				t.Fatal("Start on a busy port succeeded")
			}
			if !strings.Contains(err.Error(), "address already in use") || !strings.Contains(err.Error(), "exited") {
				t.Errorf("Start error does not say the server exited and why: %v", err)
			}
			// Noticed by the child's exit, not by the answer wait running
			// out: a clock bound here failed a loaded make test (5.4 s),
			// where the child itself takes that long to start and exit.
			if strings.Contains(err.Error(), "timed out") {
				t.Errorf("Start waited out its bound (%s) instead of noticing the exit: %v", time.Since(start).Round(time.Millisecond), err)
			}
			if s, _ := ReadState(opts.StateDir); s != nil {
				t.Errorf("a failed Start recorded %+v", s)
			}
		})
	}
}

func TestEnsureStaleStateAndExternalServer(t *testing.T) {
	fx := newFixture(t)
	want := fx.build(t).Hash.String()
	opts := detachedOptions(t, fx)
	ctx := context.Background()

	// Recorded pids that are gone, or reused by another program, are not alive.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{dead.Process.Pid, os.Getpid()} {
		if err := writeState(opts.StateDir, &State{PID: pid, URL: opts.Flags.URL, Listen: opts.Flags.Listen, Branch: testRepoBranch}); err != nil {
			t.Fatal(err)
		}
		if status, err := Check(ctx, opts.StateDir); err != nil || status.Alive {
			t.Errorf("pid %d recorded: Check = %+v %v, want not alive", pid, status, err)
		}
	}

	// A server bootstrap did not start (a systemd unit) is used when it serves the wanted hash.
	ln, err := net.Listen("tcp", opts.Flags.Listen)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ctx, ServerOptions{Build: BuildOptions{Dir: fx.dir, Branch: testRepoBranch, Excludes: fx.excludes, Protect: fx.protect, FluxPath: fixtureFluxPath, ServeWholeTree: true}, URL: opts.Flags.URL})
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(sctx, ln, nil) }()
	got, action, err := Ensure(ctx, opts, want)
	if err != nil || action != EnsureExternal || got.Hash != want {
		t.Errorf("Ensure with an external server: %+v %v %v, want external", got, action, err)
	}
	if _, _, err := Ensure(ctx, opts, strings.Repeat("1", 40)); err == nil || !strings.Contains(err.Error(), "not started by bootstrap") {
		t.Errorf("Ensure with an external server serving another hash: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// With the stale record and no server, Ensure starts one.
	if err := writeState(opts.StateDir, &State{PID: dead.Process.Pid, URL: opts.Flags.URL}); err != nil {
		t.Fatal(err)
	}
	got, action, err = Ensure(ctx, opts, want)
	if err != nil || action != EnsureStarted || got.Hash != want || !processAlive(got.PID) {
		t.Fatalf("Ensure with a stale record: %+v %v %v, want started", got, action, err)
	}
}

func TestServeFlagsArgsRoundTrip(t *testing.T) {
	repo, stateDir := t.TempDir(), t.TempDir()
	f := ServeFlags{Repo: repo, Listen: "0.0.0.0:8089", URL: "http://192.168.1.10:8089/homelab.git",
		Branch: "main", Interval: 90 * time.Second, Exclude: []string{"-odd,pattern", "docs/"}, StateDir: stateDir,
		Path: "./clusters/home", Plaintext: []string{"apps/*/scrape-config.yaml"}}
	want := []string{"gitsnap", "serve", "--repo=" + repo, "--listen=0.0.0.0:8089",
		"--url=http://192.168.1.10:8089/homelab.git", "--branch=main", "--interval=1m30s",
		"--exclude=-odd,pattern", "--exclude=docs/", "--path=./clusters/home", "--serve-plaintext=apps/*/scrape-config.yaml", "--state-dir=" + stateDir}
	if got := f.Args(); !slices.Equal(got, want) {
		t.Errorf("Args() =\n %q\nwant\n %q", got, want)
	}
	parsed, err := parseServeArgs(f.Args())
	if err != nil {
		t.Fatalf("parsing Args() with kong: %v", err)
	}
	if !reflect.DeepEqual(parsed, f) {
		t.Errorf("kong parsed Args() as %+v, want %+v", parsed, f)
	}
	if _, err := parseServeArgs([]string{"gitsnap", "serve", "--listen=:1"}); err == nil {
		t.Error("kong accepted serve without --repo and --url")
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 10s waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSystemdUnitExample keeps the shipped unit in step with ServeFlags.
func TestSystemdUnitExample(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "deploy", "systemd", "bootstrap-gitsnap.service"))
	if err != nil {
		t.Fatal(err)
	}
	unit := strings.ReplaceAll(string(b), "\\\n", " ")
	var execStart, execReload string
	for _, line := range strings.Split(unit, "\n") {
		if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
			execStart = v
		}
		if v, ok := strings.CutPrefix(line, "ExecReload="); ok {
			execReload = v
		}
	}
	args := strings.Fields(execStart)
	if len(args) < 3 || filepath.Base(args[0]) != "bootstrap" || args[1] != "gitsnap" || args[2] != "serve" {
		t.Fatalf("ExecStart is not `bootstrap gitsnap serve`: %q", execStart)
	}
	repo := t.TempDir()
	for i, a := range args {
		if strings.HasPrefix(a, "--repo=") {
			args[i] = "--repo=" + repo // the example path does not exist here
		}
	}
	f, err := parseServeArgs(args[1:])
	if err != nil {
		t.Fatalf("the unit's ExecStart does not parse: %v", err)
	}
	if _, err := repoPathOf(f.URL); err != nil || f.Listen == "" {
		t.Errorf("the unit's URL/listen are unusable: %q %q %v", f.URL, f.Listen, err)
	}
	if !strings.Contains(execReload, "-HUP $MAINPID") {
		t.Errorf("ExecReload does not send SIGHUP: %q", execReload)
	}
}

// A caller killed while Start waits for its server to answer must leave the
// server recorded (Stop can end it, Ensure adopts it), not an orphan that
// answers at the URL with nothing to stop it.
func TestDetachedServerRecordedBeforeItAnswers(t *testing.T) {
	fx := newFixture(t)
	opts := detachedOptions(t, fx, serveDelayEnv+"=1500ms")
	ctx := context.Background()
	type started struct {
		st  *State
		err error
	}
	done := make(chan started, 1)
	go func() {
		st, err := Start(ctx, opts)
		done <- started{st, err}
	}()
	var rec *State
	for deadline := time.Now().Add(10 * time.Second); rec == nil && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var err error
		if rec, err = ReadState(opts.StateDir); err != nil {
			t.Fatal(err)
		}
	}
	if rec == nil {
		t.Fatal("no server recorded within 10s of Start")
	}
	select {
	case r := <-done:
		t.Fatalf("Start returned (%v) before the delayed server could answer: the early record was not seen", r.err)
	default:
	}
	if rec.Hash != "" || rec.URL != opts.Flags.URL || !processAlive(rec.PID) {
		t.Fatalf("record while starting: %+v (alive %v), want the live pid, the URL and no hash yet", rec, processAlive(rec.PID))
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("Start: %v", r.err)
	}
	if r.st.PID != rec.PID || r.st.Hash == "" {
		t.Fatalf("Start returned %+v; recorded pid %d", r.st, rec.PID)
	}
	if now, _ := ReadState(opts.StateDir); now == nil || now.Hash != r.st.Hash {
		t.Fatalf("record once serving: %+v, want hash %s", now, r.st.Hash)
	}

	// As a resumed run finds it after its predecessor died mid-Start.
	hashless := *r.st
	hashless.Hash = ""
	if err := writeState(opts.StateDir, &hashless); err != nil {
		t.Fatal(err)
	}
	st, action, err := Ensure(ctx, opts, r.st.Hash)
	if err != nil || action != EnsureReused || st.PID != r.st.PID {
		t.Fatalf("Ensure on the recorded server: %v %s %+v", err, action, st)
	}
	if now, _ := ReadState(opts.StateDir); now == nil || now.Hash != r.st.Hash {
		t.Fatalf("Ensure did not record the hash it found served: %+v", now)
	}
}

// Ensure finds a recorded server alive but not answering yet (its starting
// run was killed): it waits for it instead of signalling it, adopts it and
// records the hash.
func TestEnsureWaitsForARecordedServerStillStarting(t *testing.T) {
	fx := newFixture(t)
	opts := detachedOptions(t, fx, serveDelayEnv+"=1s")
	if err := opts.normalize(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(opts.Executable, opts.Flags.Args()...)
	cmd.Env = append(os.Environ(), opts.Env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	if err := os.MkdirAll(opts.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	rec := &State{PID: cmd.Process.Pid, Listen: opts.Flags.Listen, URL: opts.Flags.URL, Branch: opts.Flags.Branch, Path: opts.Flags.Path,
		Repo: opts.Flags.Repo, Interval: opts.Flags.Interval, Excludes: opts.Flags.Exclude, Protect: opts.Flags.Protect, AuthFile: opts.Flags.AuthFile}
	if err := writeState(opts.StateDir, rec); err != nil {
		t.Fatal(err)
	}
	// The hash the server will serve: what Build makes of the same options.
	snap, err := Build(context.Background(), BuildOptions{Dir: opts.Flags.Repo, Branch: opts.Flags.Branch, Excludes: opts.Flags.Exclude, Protect: opts.Flags.Protect, FluxPath: opts.Flags.Path, ServeWholeTree: opts.Flags.Tree})
	if err != nil {
		t.Fatal(err)
	}
	st, action, err := Ensure(context.Background(), opts, snap.Hash.String())
	if err != nil || action != EnsureReused || st.PID != rec.PID {
		t.Fatalf("Ensure on a server still starting: %v %s %+v (recorded pid %d)", err, action, st, rec.PID)
	}
	if now, _ := ReadState(opts.StateDir); now == nil || now.Hash != snap.Hash.String() {
		t.Fatalf("Ensure did not record the hash: %+v", now)
	}
}
