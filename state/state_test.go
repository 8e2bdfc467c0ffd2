package state

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The crash test re-runs this test binary as a writer that saves state in a
// tight loop until it is killed with SIGKILL.
func TestMain(m *testing.M) {
	if dir := os.Getenv("STATE_TEST_WRITER"); dir != "" {
		s := New("c")
		// Large enough that one write takes milliseconds, so random kills land
		// inside writes often: a non-atomic save is caught within a few kills.
		blob := strings.Repeat("x", 8<<20)
		for i := 0; ; i++ {
			s.Stage("talos").Attempts = i
			s.Stage("talos").Error = blob
			if err := s.Save(dir, time.Now()); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			if i == 0 {
				// Tells the test a complete file exists, so its kill lands in
				// a later write however slow the machine's first one was.
				fmt.Println("saved")
			}
		}
	}
	if dir := os.Getenv("STATE_TEST_HOLDER"); dir != "" {
		if _, err := Acquire(dir, Holder{PID: os.Getpid(), Command: "bootstrap run --stage all", Started: time.Now()}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("locked")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestSaveLoadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	s := New("c")
	s.Stage("provision").Status = OK
	s.Outputs.Nodes = map[string]Node{"cp-1": {Name: "cp-1", VMID: 701, IP: "10.0.0.11"}}
	if err := s.Save(dir, time.Now()); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(filepath.Join(dir, FileName))
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("state mode %v", fi.Mode())
	}
	got, err := Load(dir, "c")
	if err != nil || got.Stage("provision").Status != OK || got.Outputs.Nodes["cp-1"].VMID != 701 {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := Load(dir, "other"); err == nil {
		t.Fatal("state of another cluster accepted")
	}
	os.WriteFile(filepath.Join(dir, FileName), []byte(`{"schema_version": 99}`), 0o600)
	if _, err := Load(dir, "c"); err == nil || !strings.Contains(err.Error(), "upgrade") {
		t.Fatalf("newer schema: %v", err)
	}
	if s := (&StageRecord{Status: Running}).EffectiveStatus(); s != Interrupted {
		t.Fatalf("a running record left behind must read as interrupted, got %s", s)
	}
}

// TestStateSurvivesKillMidWrite kills a writer at random moments after its
// first complete save; every time the state file must still parse completely.
// The kill is timed from the writer's first save, not from its start: on a
// loaded machine (CI on 2 cores) starting the process and the first 8 MiB
// write can outlast any fixed delay, and a test that never saw a save proved
// nothing.
func TestStateSurvivesKillMidWrite(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "STATE_TEST_WRITER="+dir)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		first := make(chan error, 1)
		go func() {
			line, err := bufio.NewReader(out).ReadString('\n')
			if err == nil && line != "saved\n" {
				err = fmt.Errorf("writer printed %q", line)
			}
			first <- err
		}()
		select {
		case err := <-first:
			if err != nil {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("kill %d: the writer failed before its first save: %v", i, err)
			}
		case <-time.After(2 * time.Minute):
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("kill %d: no complete save within 2m", i)
		}
		time.Sleep(time.Duration(rng.IntN(120)) * time.Millisecond)
		cmd.Process.Kill()
		cmd.Wait()
		b, err := os.ReadFile(filepath.Join(dir, FileName))
		if err != nil {
			t.Fatalf("kill %d: a save completed, yet: %v", i, err)
		}
		var s State
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatalf("kill %d left a torn state file (%d bytes): %v", i, len(b), err)
		}
		if _, err := Load(dir, "c"); err != nil {
			t.Fatalf("kill %d: %v", i, err)
		}
	}
}

func TestLockContentionNamesHolder(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "STATE_TEST_HOLDER="+dir)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 7)
	if _, err := out.Read(buf); err != nil || string(buf) != "locked\n" {
		t.Fatalf("holder did not lock: %q %v", buf, err)
	}
	_, err := Acquire(dir, Holder{PID: os.Getpid(), Command: "bootstrap run --stage postcheck"})
	var le *LockedError
	if !errors.As(err, &le) {
		t.Fatalf("want LockedError, got %v", err)
	}
	if le.Holder.PID != cmd.Process.Pid || !strings.Contains(err.Error(), "pid "+strconv.Itoa(cmd.Process.Pid)) || !strings.Contains(err.Error(), "--stage all") {
		t.Fatalf("holder not named: %v", err)
	}
	// The OS drops the lock with the process: no stale lock after a crash.
	cmd.Process.Kill()
	cmd.Wait()
	l, err := Acquire(dir, Holder{PID: os.Getpid()})
	if err != nil {
		t.Fatalf("lock of a dead process still held: %v", err)
	}
	l.Release()
}

func TestKeepNewest(t *testing.T) {
	dir := t.TempDir()
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 0; i < 5; i++ {
		if _, err := NewRunDir(dir, base.Add(time.Duration(i)*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	p, _ := NewRunDir(dir, base) // same second as the first: suffixed
	if !strings.HasSuffix(p, "-1") {
		t.Fatalf("collision not suffixed: %s", p)
	}
	removed, err := KeepNewest(filepath.Join(dir, RunsDirName), 3)
	if err != nil || len(removed) != 3 {
		t.Fatalf("removed %v, %v", removed, err)
	}
	left, _ := os.ReadDir(filepath.Join(dir, RunsDirName))
	if len(left) != 3 || left[0].Name() != "20260101T020000Z" {
		t.Fatalf("kept the wrong ones: %v", left)
	}
}

// Many directories within one second, pruned as they come (postchecks a
// second apart or less, keep 2): each new one is the newest by name, so
// pruning never removes the one just made, and "-10" sorts after "-9".
func TestTimestampDirsWithinOneSecond(t *testing.T) {
	parent := t.TempDir()
	now := time.Date(2026, 11, 27, 14, 43, 7, 0, time.UTC)
	for i := 0; i < 12; i++ {
		p, err := NewTimestampDir(parent, now)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := KeepNewest(parent, 2); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("directory %d, just made, is gone after pruning: %v", i+1, err)
		}
	}
	left, _ := os.ReadDir(parent)
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	if want := []string{"20261127T144307Z-10", "20261127T144307Z-11"}; !slices.Equal(names, want) {
		t.Fatalf("kept %v, want the two newest %v", names, want)
	}
}
