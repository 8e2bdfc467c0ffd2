// Package check runs named checks that end in pass, warn or fail with a
// one-line reason. Precheck and postcheck both report through it: every check
// runs (none short-circuits), then the results are shown as one table.
package check

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Status is the verdict of one check.
type Status string

// The verdicts, from best to worst. Skip is a check that could not run
// because another one failed (the API it needs is unreachable): the cause
// is counted once, as the failure it is, and its dependents are shown as
// skipped instead of as failures of their own.
const (
	Pass Status = "pass"
	Skip Status = "skip"
	Warn Status = "warn"
	Fail Status = "fail"
)

func (s Status) rank() int {
	switch s {
	case Pass, Skip:
		return 0
	case Warn:
		return 1
	default:
		return 2
	}
}

// Check is one named probe. Run returns its verdict and a one-line reason.
type Check struct {
	Name string
	Run  func(ctx context.Context) (Status, string)
}

// Result is what a check concluded and how long it took.
type Result struct {
	Name     string        `json:"name"`
	Status   Status        `json:"status"`
	Reason   string        `json:"reason"`
	Duration time.Duration `json:"duration_ns"`
}

// Passf, Warnf and Failf build a check outcome with a formatted reason.
func Passf(format string, a ...any) (Status, string) { return Pass, fmt.Sprintf(format, a...) }

// Warnf returns a warning outcome.
func Warnf(format string, a ...any) (Status, string) { return Warn, fmt.Sprintf(format, a...) }

// Failf returns a failing outcome.
func Failf(format string, a ...any) (Status, string) { return Fail, fmt.Sprintf(format, a...) }

// Skipf returns the outcome of a check that could not run because of
// another check's failure, which the reason names.
func Skipf(format string, a ...any) (Status, string) { return Skip, fmt.Sprintf(format, a...) }

// RunAll runs every check, at most parallel at a time (1 if parallel < 1),
// and returns the results in the order of checks. A panicking check fails
// with the panic as its reason instead of taking the run down.
func RunAll(ctx context.Context, checks []Check, parallel int) []Result {
	if parallel < 1 {
		parallel = 1
	}
	out := make([]Result, len(checks))
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			start := time.Now()
			st, reason := runOne(context.WithValue(ctx, nameKey{}, c.Name), c)
			out[i] = Result{Name: c.Name, Status: st, Reason: reason, Duration: time.Since(start)}
		}()
	}
	wg.Wait()
	return out
}

type nameKey struct{}

// Name is the name of the check whose Run was given ctx by RunAll ("" for
// a context of none): what a check calls can say whose work it does (the
// postcheck puts a warning logged with it on that check's row).
func Name(ctx context.Context) string {
	name, _ := ctx.Value(nameKey{}).(string)
	return name
}

func runOne(ctx context.Context, c Check) (st Status, reason string) {
	defer func() {
		if r := recover(); r != nil {
			st, reason = Fail, fmt.Sprintf("check panicked: %v", r)
		}
	}()
	return c.Run(ctx)
}

// Overall is the worst status among results (Pass when there are none).
func Overall(results []Result) Status {
	worst := Pass
	for _, r := range results {
		if r.Status.rank() > worst.rank() {
			worst = r.Status
		}
	}
	return worst
}

// Count returns how many results have status s.
func Count(results []Result, s Status) int {
	n := 0
	for _, r := range results {
		if r.Status == s {
			n++
		}
	}
	return n
}

// Table writes the results as an aligned table with a summary line.
func Table(w io.Writer, results []Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSTATUS\tTIME\tREASON")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Name, strings.ToUpper(string(r.Status)), roundDur(r.Duration), r.Reason)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	summary := fmt.Sprintf("%d passed, %d warnings, %d failed", Count(results, Pass), Count(results, Warn), Count(results, Fail))
	if n := Count(results, Skip); n > 0 {
		summary += fmt.Sprintf(", %d skipped because of a failure above", n)
	}
	_, err := fmt.Fprintln(w, summary)
	return err
}

func roundDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(time.Millisecond).String()
	default:
		return d.Round(time.Microsecond).String()
	}
}
