package wait

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestUntilTimesOutWithStatus(t *testing.T) {
	var buf bytes.Buffer
	start := time.Now()
	err := Until(context.Background(), Spec{What: "VM 701 start", Timeout: 120 * time.Millisecond, Interval: 10 * time.Millisecond,
		ProgressEvery: 30 * time.Millisecond, Log: zerolog.New(&buf)},
		func(context.Context) (bool, string, error) { return false, "status running", nil })
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("want timeout, got %v", err)
	}
	if !strings.Contains(err.Error(), "VM 701 start") || !strings.Contains(err.Error(), "status running") {
		t.Fatalf("error does not say what it waited for: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("wait not bounded: %v", d)
	}
	if !strings.Contains(buf.String(), "waiting for VM 701 start") {
		t.Fatalf("no progress line: %s", buf.String())
	}
}

// A poll whose call is cut by the wait's own deadline (an HTTP GET in
// flight) returns the context's error; the wait reports its timeout with
// the status the previous poll saw, not the cut call as a fatal error.
func TestUntilDeadlineDuringAPoll(t *testing.T) {
	polls := 0
	err := Until(context.Background(), Spec{What: "deployment available", Timeout: 100 * time.Millisecond, Interval: time.Millisecond},
		func(ctx context.Context) (bool, string, error) {
			polls++
			if polls == 1 {
				return false, "unschedulable: 0/1 nodes available", nil
			}
			<-ctx.Done()
			return false, "", fmt.Errorf("get deployment: %w", ctx.Err())
		})
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("want the wait's timeout, got %v", err)
	}
	if !strings.Contains(err.Error(), "unschedulable: 0/1 nodes available") {
		t.Fatalf("the timeout lost the last status: %v", err)
	}
	// A poll the deadline cuts short that reports a status (the health
	// polls do: every call failed with the deadline) does not replace
	// what the last whole poll saw.
	polls = 0
	err = Until(context.Background(), Spec{What: "cluster healthy", Timeout: 100 * time.Millisecond, Interval: time.Millisecond},
		func(ctx context.Context) (bool, string, error) {
			polls++
			if polls == 1 {
				return false, "wk-1 does not meet memory requirements", nil
			}
			<-ctx.Done()
			return false, "wk-1: context deadline exceeded while waiting for connections to become ready", nil
		})
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "wk-1 does not meet memory requirements") || strings.Contains(err.Error(), "waiting for connections") {
		t.Fatalf("the timeout quotes the cut poll: %v", err)
	}
	// A caller's own cancellation is still reported as such.
	ctx, cancel := context.WithCancel(context.Background())
	err = Until(ctx, Spec{What: "x", Timeout: time.Minute, Interval: time.Millisecond},
		func(c context.Context) (bool, string, error) { cancel(); <-c.Done(); return false, "", c.Err() })
	if errors.Is(err, ErrTimeout) || !errors.Is(err, context.Canceled) {
		t.Fatalf("want the caller's cancellation, got %v", err)
	}
}

func TestUntilDoneAndFatal(t *testing.T) {
	n := 0
	err := Until(context.Background(), Spec{What: "x", Timeout: time.Second, Interval: time.Millisecond},
		func(context.Context) (bool, string, error) { n++; return n == 3, "", nil })
	if err != nil || n != 3 {
		t.Fatalf("err=%v n=%d", err, n)
	}
	boom := errors.New("boom")
	err = Until(context.Background(), Spec{What: "x", Timeout: time.Second},
		func(context.Context) (bool, string, error) { return false, "", boom })
	if !errors.Is(err, boom) {
		t.Fatalf("got %v", err)
	}
	if err := Until(context.Background(), Spec{What: "x"}, nil); err == nil {
		t.Fatal("a wait without a timeout must be refused")
	}
}

func TestTracker(t *testing.T) {
	var buf bytes.Buffer
	tr := NewTracker(zerolog.New(&buf), "Talos API", []string{"cp-1", "cp-2", "w-1"})
	tr.Done("cp-2")
	tr.Done("cp-2")
	if got := tr.Status(); got != "1/3 done, pending: cp-1, w-1" {
		t.Fatalf("status %q", got)
	}
	if !strings.Contains(buf.String(), "(1/3") {
		t.Fatalf("log: %s", buf.String())
	}
}

// TestUntilLogsEveryPollNotDone: each retried poll is accounted for at
// debug level, one line per change of status, with how many polls it
// stands for.
func TestUntilLogsEveryPollNotDone(t *testing.T) {
	var buf bytes.Buffer
	statuses := []string{"connection refused", "connection refused", "connection refused", "1/3 members", "connection refused"}
	n := 0
	err := Until(context.Background(), Spec{What: "etcd", Timeout: time.Second, Interval: time.Millisecond, Log: zerolog.New(&buf)},
		func(context.Context) (bool, string, error) {
			if n == len(statuses) {
				return true, "", nil
			}
			n++
			return false, statuses[n-1], nil
		})
	if err != nil {
		t.Fatal(err)
	}
	polls := map[string]int{}
	lines := 0
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var ev struct {
			Status string
			Polls  int
		}
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Polls > 0 {
			polls[ev.Status] += ev.Polls
			lines++
		}
	}
	if polls["connection refused"] != 4 || polls["1/3 members"] != 1 || lines != 4 {
		t.Fatalf("want 4 refused and 1 other poll on 4 lines (a run of 3 is 2 lines), got %v on %d lines:\n%s", polls, lines, buf.String())
	}
}

func TestEach(t *testing.T) {
	var buf bytes.Buffer
	boom := errors.New("boom")
	errs := Each(context.Background(), zerolog.New(&buf), "nodes up", time.Second, []string{"a", "b", "c"}, func(_ context.Context, name string) error {
		if name == "b" {
			return boom
		}
		return nil
	})
	if len(errs) != 1 || errs["b"] != boom {
		t.Fatalf("errs %v", errs)
	}
	if got := Errors(map[string]error{"z": boom, "a": ErrTimeout}); got[0] != ErrTimeout || got[1] != boom {
		t.Fatalf("order %v", got)
	}
	if !strings.Contains(buf.String(), "nodes up: a ready") || strings.Contains(buf.String(), "b ready") {
		t.Fatalf("progress: %s", buf.String())
	}
}

// TestUntilWakes: a wake polls again at once, not after the interval.
func TestUntilWakes(t *testing.T) {
	wake := make(chan struct{}, 1)
	polls := 0
	start := time.Now()
	err := Until(context.Background(), Spec{What: "woken", Timeout: 10 * time.Second, Interval: time.Hour, Wake: wake},
		func(context.Context) (bool, string, error) {
			polls++
			if polls == 1 {
				wake <- struct{}{}
			}
			return polls == 2, "not yet", nil
		})
	if err != nil || polls != 2 {
		t.Fatalf("err %v after %d polls", err, polls)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the wake did not end the interval: %s", d)
	}
}

// The interval runs from the start of one poll to the start of the next: a
// poll that takes most of it (a node asked several questions) does not add
// its own duration to how late the wait sees what it waits for.
func TestUntilIntervalRunsFromPollStart(t *testing.T) {
	const interval, took = 100 * time.Millisecond, 70 * time.Millisecond
	var starts []time.Time
	err := Until(context.Background(), Spec{What: "slow polls", Timeout: 5 * time.Second, Interval: interval},
		func(context.Context) (bool, string, error) {
			starts = append(starts, time.Now())
			time.Sleep(took)
			return len(starts) == 5, "not yet", nil
		})
	if err != nil {
		t.Fatal(err)
	}
	gap := starts[len(starts)-1].Sub(starts[0]) / time.Duration(len(starts)-1)
	if gap >= interval+took/2 {
		t.Fatalf("polls start %v apart on average with an interval of %v: the poll's %v is added to the interval", gap, interval, took)
	}
	// A poll slower than the interval still leaves a quarter of it idle.
	if d := nextPoll(interval, 3*interval); d != interval/4 {
		t.Fatalf("after a poll of 3 intervals the wait sleeps %v, want %v", d, interval/4)
	}
}

// A backing-off wait lets at most an eighth of the time waited so far pass
// between polls (or one Interval, early on): the end of an ISO download of
// a few seconds is not seen a whole backed-off interval after it came. The
// intervals are checked as computed; the clock only shows that Until uses
// them (a gap between two polls also holds the scheduler's delays, which a
// loaded machine stretches).
func TestUntilBackoffIsAShareOfTheWait(t *testing.T) {
	const base, most = 5 * time.Millisecond, 2 * time.Second
	spec := Spec{What: "download", Timeout: 10 * time.Second, Interval: base, MaxInterval: most}
	for _, c := range []struct{ waited, want time.Duration }{
		{0, base}, {30 * time.Millisecond, base}, {80 * time.Millisecond, 10 * time.Millisecond},
		{800 * time.Millisecond, 100 * time.Millisecond}, {8 * time.Second, time.Second}, {time.Minute, most},
	} {
		if got := backedOff(spec, base, c.waited); got != c.want {
			t.Errorf("after %v the interval is %v, want %v", c.waited, got, c.want)
		}
	}
	if got := backedOff(Spec{Interval: base}, base, time.Minute); got != base {
		t.Errorf("without MaxInterval the interval became %v", got)
	}

	const doneAfter = 800 * time.Millisecond
	start := time.Now()
	polls := 0
	err := Until(context.Background(), spec, func(context.Context) (bool, string, error) {
		polls++
		return time.Since(start) >= doneAfter, "running", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Backing off: a few dozen polls (every 5 ms until 40 ms in, then an
	// eighth of the wait); one every Interval would be 160.
	if limit := int(doneAfter / base / 2); polls > limit {
		t.Fatalf("%d polls in %v with a base interval of %v: it does not back off", polls, doneAfter, base)
	}
}

// IntervalFor picks the next interval from what the poll saw: a state
// known to be short is polled more closely than the rest.
func TestUntilIntervalFor(t *testing.T) {
	var starts []time.Time
	err := Until(context.Background(), Spec{What: "node", Timeout: 5 * time.Second, Interval: 200 * time.Millisecond,
		IntervalFor: func(status string) time.Duration {
			if status == "booted" {
				return 20 * time.Millisecond
			}
			return 0
		}},
		func(context.Context) (bool, string, error) {
			starts = append(starts, time.Now())
			switch {
			case len(starts) < 2:
				return false, "installing", nil
			case len(starts) < 6:
				return false, "booted", nil
			}
			return true, "", nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if gap := starts[1].Sub(starts[0]); gap < 150*time.Millisecond {
		t.Fatalf("after an ordinary status the next poll came %v later, want the interval", gap)
	}
	if gap := starts[5].Sub(starts[2]) / 3; gap > 100*time.Millisecond {
		t.Fatalf("while booted polls came %v apart, want IntervalFor's 20ms", gap)
	}
}
