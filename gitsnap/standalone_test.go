package gitsnap

import (
	"context"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestStandaloneServerIsRecorded: `gitsnap serve --state-dir` started
// outside bootstrap (a systemd unit) records itself, so Check (what
// `gitsnap status` and `bootstrap status` print) shows it serving; Ensure
// uses it as is and never replaces it; it removes its record on exit.
func TestStandaloneServerIsRecorded(t *testing.T) {
	fx := newFixture(t)
	want := fx.build(t).Hash.String()
	opts := detachedOptions(t, fx)
	flags := opts.Flags
	flags.StateDir = opts.StateDir
	cmd := exec.Command(os.Args[0], flags.Args()...)
	cmd.Env = append(os.Environ(), serveEnv+"=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	ctx := context.Background()
	var status Status
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		if status, err = Check(ctx, opts.StateDir); err != nil {
			t.Fatal(err)
		}
		if status.Serves(want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if status.State == nil || !status.State.Standalone || status.State.PID != cmd.Process.Pid || !status.Serves(want) {
		t.Fatalf("Check: %+v (state %+v), want the standalone server (pid %d) recorded, serving %s", status, status.State, cmd.Process.Pid, want)
	}
	if status.State.AuthFile != opts.Flags.AuthFile || status.State.URL != opts.Flags.URL {
		t.Errorf("recorded %+v, want the auth file and URL of its flags", status.State)
	}
	st, action, err := Ensure(ctx, opts, want)
	if err != nil || action != EnsureExternal || st.PID != cmd.Process.Pid {
		t.Errorf("Ensure: %+v %s %v, want the standalone server used as is", st, action, err)
	}
	if !processAlive(cmd.Process.Pid) {
		t.Fatal("Ensure ended the standalone server")
	}
	if _, _, err := Ensure(ctx, opts, "0123456789012345678901234567890123456789"); err == nil || !processAlive(cmd.Process.Pid) {
		t.Errorf("Ensure for another hash: %v, alive %v; want an error naming the standalone server, which keeps running", err, processAlive(cmd.Process.Pid))
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	<-exited
	exited <- nil
	if st, err := ReadState(opts.StateDir); err != nil || st != nil {
		t.Errorf("after exit the state records %+v (%v), want nothing", st, err)
	}
}
