// Package wait provides bounded waits that say what they wait for, how many
// of how many things are done, and for how long.
package wait

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// ErrTimeout is wrapped by every error returned when a wait runs out of time.
var ErrTimeout = errors.New("timed out")

// Live progress. An event that carries FieldLive is the current state of one
// running wait, named by the field's value; an event with FieldLiveEnd says
// that wait is over. A terminal shows one updating line per running wait
// instead of a new line per event (see ui); other outputs print the
// info-level ones as lines. Between those, a trace-level event every
// liveEvery keeps the elapsed time on a terminal current, and never reaches
// a log file.
const (
	FieldLive    = "live"
	FieldLiveEnd = "live_end"
	liveEvery    = time.Second
)

var liveSeq atomic.Int64

// liveKey names one wait uniquely, even when parallel waits share What.
func liveKey(what string) string { return fmt.Sprintf("%s#%d", what, liveSeq.Add(1)) }

func liveEnd(log zerolog.Logger, key string) {
	log.Trace().Str(FieldLive, key).Bool(FieldLiveEnd, true).Msg("")
}

// Spec describes one bounded wait.
type Spec struct {
	// What is the human description: "VM 701 start task", "nodes Ready".
	What string
	// Timeout bounds the whole wait; it is required.
	Timeout time.Duration
	// Interval from the start of one poll to the start of the next
	// (default 500ms). A poll's own duration is not added to it, so what
	// is waited for is seen at most one interval late however slow the
	// questions are; a poll that outlasts it is still followed by a
	// quarter of an interval without questions.
	Interval time.Duration
	// MaxInterval, when above Interval, makes the wait back off: the
	// interval grows with the time waited so far, an eighth of it, up to
	// MaxInterval. A short wait stays quick; a long one (an ISO download,
	// a slow start) does not ask the same question many times a second,
	// and is seen done at most an eighth of its length late.
	MaxInterval time.Duration
	// Log receives progress lines; the zero logger discards them.
	Log zerolog.Logger
	// ProgressEvery spaces out progress lines (default 5s).
	ProgressEvery time.Duration
	// IntervalFor, when set, chooses the interval after a poll that was
	// not done from what it saw: a state known to end within seconds (a
	// node booted, its services starting) is polled more often than the
	// minutes before it.
	IntervalFor func(status string) time.Duration
	// Wake, when set, polls again at once when it delivers (a watch on
	// what is waited for saw it change), without waiting out the
	// interval. The interval still bounds the time between polls: a
	// watch that drops or misses an event costs at most one interval.
	Wake <-chan struct{}
}

func (s Spec) withDefaults() Spec {
	if s.Interval <= 0 {
		s.Interval = 500 * time.Millisecond
	}
	if s.ProgressEvery <= 0 {
		s.ProgressEvery = 5 * time.Second
	}
	return s
}

// Until polls cond until it reports done, returns an error (fatal, returned
// as is), or the wait's timeout or ctx ends. The status string cond returns
// is kept and quoted in progress lines and in the timeout error, so a user
// sees what the last poll saw. Every poll that is not done is accounted for
// at debug level (see pollLog): a failed call that the next poll retries is
// on record in the run log.
func Until(ctx context.Context, spec Spec, cond func(context.Context) (done bool, status string, err error)) error {
	spec = spec.withDefaults()
	if spec.Timeout <= 0 {
		return fmt.Errorf("waiting for %s: no timeout set", spec.What)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, spec.Timeout)
	defer cancel()
	lastProgress, lastLive := start, start
	var status string
	polls := pollLog{spec: spec}
	defer polls.flush()
	interval := spec.Interval
	key := liveKey(spec.What)
	defer liveEnd(spec.Log, key)
	for poll := 1; ; poll++ {
		pollStart := time.Now()
		done, st, err := cond(ctx)
		// A poll the deadline cut short saw only its own calls fail: the
		// timeout error keeps what the last whole poll saw.
		if st != "" && (ctx.Err() == nil || status == "") {
			status = st
		}
		if err != nil {
			// A deadline that falls while a poll's call is in flight
			// ends that call with the context's error: that is this
			// wait running out (with what the last poll saw), not a
			// failure of the thing waited for.
			if ctx.Err() != nil {
				return timeoutError(ctx, spec, start, status)
			}
			return err
		}
		if done {
			polls.flush()
			spec.Log.Debug().Str("wait", spec.What).Dur("elapsed", time.Since(start)).Msgf("done waiting for %s", spec.What)
			return nil
		}
		polls.notDone(poll, st)
		var ev *zerolog.Event
		switch {
		case time.Since(lastProgress) >= spec.ProgressEvery:
			ev, lastProgress, lastLive = spec.Log.Info(), time.Now(), time.Now()
		case time.Since(lastLive) >= liveEvery:
			ev, lastLive = spec.Log.Trace(), time.Now()
		}
		if ev != nil {
			ev.Str(FieldLive, key).Str("wait", spec.What).Str("status", status).
				Str("elapsed", Round(time.Since(start)).String()).
				Msgf("waiting for %s (%s elapsed)%s", spec.What, Round(time.Since(start)), suffix(status))
		}
		next := interval
		if spec.IntervalFor != nil {
			if d := spec.IntervalFor(st); d > 0 {
				next = d
			}
		}
		t := time.NewTimer(nextPoll(next, time.Since(pollStart)))
		interval = backedOff(spec, interval, time.Since(start))
		select {
		case <-ctx.Done():
			t.Stop()
			return timeoutError(ctx, spec, start, status)
		case <-t.C:
		case <-spec.Wake:
			t.Stop()
		}
	}
}

// backoffShare is the share of the time waited so far that a backing-off
// wait (Spec.MaxInterval) lets pass between polls: the longest it can see
// a change late is an eighth of how long it has waited.
const backoffShare = 8

// backedOff is the interval after waited of a wait that was at interval:
// with MaxInterval above Interval, an eighth of the time waited (never
// below Interval, never above MaxInterval); otherwise interval unchanged.
func backedOff(spec Spec, interval, waited time.Duration) time.Duration {
	if spec.MaxInterval <= spec.Interval {
		return interval
	}
	return min(max(spec.Interval, waited/backoffShare), spec.MaxInterval)
}

// nextPoll is how long to sleep after a poll that took took, for polls
// interval apart from start to start: never less than a quarter of the
// interval, so a poll slower than its interval does not run back to back.
func nextPoll(interval, took time.Duration) time.Duration {
	return max(interval-took, interval/4)
}

// pollLog records the polls of a wait that were not done, one debug line
// per change of what they saw rather than one per poll: the first poll of
// a run of equal statuses is logged as it happens, and the rest of the run
// when it ends ("polls" counts the polls a line stands for). Summing
// "polls" over a status gives how often it was seen, at any poll rate.
type pollLog struct {
	spec   Spec
	status string
	first  int
	n      int
}

func (p *pollLog) notDone(poll int, status string) {
	if p.n > 0 && status == p.status {
		p.n++
		return
	}
	p.flush()
	p.status, p.first, p.n = status, poll, 1
	p.spec.Log.Debug().Str("wait", p.spec.What).Str("status", status).Int("poll", poll).Int("polls", 1).
		Msgf("waiting for %s: poll %d not done%s", p.spec.What, poll, suffix(status))
}

func (p *pollLog) flush() {
	if p.n > 1 {
		last := p.first + p.n - 1
		p.spec.Log.Debug().Str("wait", p.spec.What).Str("status", p.status).Int("poll", last).Int("polls", p.n-1).
			Msgf("waiting for %s: polls %d-%d not done either%s", p.spec.What, p.first+1, last, suffix(p.status))
	}
	p.n = 0
}

func timeoutError(ctx context.Context, spec Spec, start time.Time, status string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) && time.Since(start) >= spec.Timeout-time.Millisecond {
		return fmt.Errorf("waiting for %s: %w after %s%s", spec.What, ErrTimeout, Round(spec.Timeout), suffix(status))
	}
	return fmt.Errorf("waiting for %s: %w%s", spec.What, ctx.Err(), suffix(status))
}

func suffix(status string) string {
	if status == "" {
		return ""
	}
	return ": " + status
}

// Round trims a duration for humans: whole seconds above 10s, tenths below.
func Round(d time.Duration) time.Duration {
	if d >= 10*time.Second {
		return d.Round(time.Second)
	}
	return d.Round(100 * time.Millisecond)
}

// Tracker follows a wait over several named things (nodes, VMs) done in
// parallel and reports "n/m done" with the names still pending.
type Tracker struct {
	what  string
	key   string
	log   zerolog.Logger
	start time.Time

	mu      sync.Mutex
	pending map[string]bool
	total   int
}

// NewTracker starts tracking names for the wait described by what.
func NewTracker(log zerolog.Logger, what string, names []string) *Tracker {
	t := &Tracker{what: what, key: liveKey(what), log: log, start: time.Now(), pending: map[string]bool{}, total: len(names)}
	for _, n := range names {
		t.pending[n] = true
	}
	return t
}

// Done marks name finished and logs the new count.
func (t *Tracker) Done(name string) {
	t.mu.Lock()
	if !t.pending[name] {
		t.mu.Unlock()
		return
	}
	delete(t.pending, name)
	done, total := t.total-len(t.pending), t.total
	t.mu.Unlock()
	t.log.Info().Str(FieldLive, t.key).Str("wait", t.what).Str("item", name).Int("done", done).Int("total", total).
		Msgf("%s: %s ready (%d/%d, %s elapsed)", t.what, name, done, total, Round(time.Since(t.start)))
}

// Close ends the tracker's live line (see FieldLive).
func (t *Tracker) Close() { liveEnd(t.log, t.key) }

// Pending returns the names not done yet, sorted.
func (t *Tracker) Pending() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Sorted(maps.Keys(t.pending))
}

// Status is a one-line summary: "2/3 done, pending: cp-2".
func (t *Tracker) Status() string {
	p := t.Pending()
	s := fmt.Sprintf("%d/%d done", t.total-len(p), t.total)
	if len(p) > 0 {
		s += ", pending: " + strings.Join(p, ", ")
	}
	return s
}

// Report runs until ctx ends, logging the tracker's status every interval
// while something is pending (and keeping a terminal's live line current in
// between). Start it in a goroutine beside the workers.
func (t *Tracker) Report(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = 5 * time.Second
	}
	tick := time.NewTicker(min(every, liveEvery))
	defer tick.Stop()
	lastProgress := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if len(t.Pending()) == 0 {
				return
			}
			ev := t.log.Trace()
			if time.Since(lastProgress) >= every {
				ev, lastProgress = t.log.Info(), time.Now()
			}
			ev.Str(FieldLive, t.key).Str("wait", t.what).Msgf("waiting for %s: %s (%s elapsed)", t.what, t.Status(), Round(time.Since(t.start)))
		}
	}
}

// Each runs fn for every name at once, tracking the group as what ("n/m
// done, pending: …", a progress line every `every`) and marking a name done
// when its fn succeeds. It returns the errors of the names that failed, nil
// when none did.
func Each(ctx context.Context, log zerolog.Logger, what string, every time.Duration, names []string, fn func(ctx context.Context, name string) error) map[string]error {
	tr := NewTracker(log, what, names)
	rctx, stop := context.WithCancel(ctx)
	reported := make(chan struct{})
	go func() { tr.Report(rctx, every); close(reported) }()
	// The live line ends after the last report, never before it.
	defer func() { stop(); <-reported; tr.Close() }()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs map[string]error
	)
	for _, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(ctx, name); err != nil {
				mu.Lock()
				if errs == nil {
					errs = map[string]error{}
				}
				errs[name] = err
				mu.Unlock()
				return
			}
			tr.Done(name)
		}()
	}
	wg.Wait()
	return errs
}

// Errors lists the errors of Each by name, sorted.
func Errors(errs map[string]error) []error {
	names := make([]string, 0, len(errs))
	for n := range errs {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]error, len(names))
	for i, n := range names {
		out[i] = errs[n]
	}
	return out
}
