// Command testtimes reads `go test -json` and tells where the suite's time
// went. `make test` pipes the run through it: it prints what plain
// `go test` prints (a line per package, the output of failing tests only),
// keeps the whole stream in a file, and ends with the time of each
// package and the run's wall time, failing the run when that passes the
// budget. `make test-times` reads the kept file back and prints the
// slowest tests and packages, with what each test spent waiting for a lab
// slot and starting its control plane (the lines kubetest logs).
//
//	go test -json ./... | testtimes -save FILE -budget 8m
//	testtimes -report FILE [-n 30]
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// event is one line of `go test -json` (cmd/test2json's TestEvent, with
// the build events of go 1.24+).
type event struct {
	Time        time.Time
	Action      string
	Package     string
	ImportPath  string
	Test        string
	Elapsed     float64
	Output      string
	FailedBuild string
}

func main() {
	save := flag.String("save", "", "keep the go test -json stream read from stdin in `file`")
	budget := flag.Duration("budget", 0, "fail when the run's wall time passes this (0: no budget)")
	report := flag.String("report", "", "print the slowest tests and packages of a kept `file` instead of reading stdin")
	n := flag.Int("n", 30, "how many of the slowest tests and packages -report prints")
	flag.Parse()
	if *report != "" {
		f, err := os.Open(*report)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testtimes: %v (make test keeps the last run's times)\n", err)
			os.Exit(1)
		}
		defer f.Close()
		r := newRun()
		if err := r.read(f, io.Discard); err != nil {
			fmt.Fprintf(os.Stderr, "testtimes: %s: %v\n", *report, err)
			os.Exit(1)
		}
		r.printSlowest(os.Stdout, *n)
		return
	}
	start := time.Now()
	in := io.Reader(os.Stdin)
	if *save != "" {
		f, err := os.Create(*save)
		if err != nil {
			fmt.Fprintf(os.Stderr, "testtimes: %v\n", err)
			os.Exit(1)
		}
		defer f.Close()
		in = io.TeeReader(os.Stdin, f)
	}
	r := newRun()
	if err := r.read(in, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "testtimes: %v\n", err)
		os.Exit(1)
	}
	wall := time.Since(start)
	r.printPackages(os.Stdout, wall)
	r.printWhy(os.Stdout)
	code := 0
	if r.failed {
		code = 1
	}
	if *budget > 0 && wall > *budget {
		fmt.Printf("FAIL: the tests took %s, over the budget of %s (TEST_BUDGET in the Makefile; `make test-times` shows the slowest tests)\n",
			wall.Round(time.Second), *budget)
		code = 1
	}
	os.Exit(code)
}

// test is what the run says of one test.
type test struct {
	pkg, name string
	elapsed   time.Duration
	result    string
	// slotWait and labStart add up what kubetest logged: waiting for a lab
	// slot and starting a control plane.
	slotWait, labStart time.Duration
	labs               int
}

type pkg struct {
	name    string
	elapsed time.Duration
	result  string
}

type run struct {
	tests  map[string]*test // by package and test name
	pkgs   map[string]*pkg
	order  []string // packages as they ended
	output map[string][]string
	failed bool
	// why keeps, per failing test, the messages its own checks wrote
	// (see reasons): printed again at the very end, where a CI log's
	// tail is read.
	why []failure
}

// failure is a failing test and what its checks said.
type failure struct {
	pkg, name string
	reasons   []string
}

func newRun() *run {
	return &run{tests: map[string]*test{}, pkgs: map[string]*pkg{}, output: map[string][]string{}}
}

var (
	slotWaitLine = regexp.MustCompile(`waited (\S+) for one of the machine's \d+ lab slots`)
	labReadyLine = regexp.MustCompile(`lab control plane \(Kubernetes \S+\) ready at \S+ in (\S+)`)
)

// read takes the events of r, printing to out what plain `go test` prints.
func (r *run) read(in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			// Not an event (go vet's or the linker's words): as it came.
			fmt.Fprintf(out, "%s\n", line)
			continue
		}
		r.event(e, out)
	}
	return sc.Err()
}

func (r *run) event(e event, out io.Writer) {
	switch e.Action {
	case "build-output":
		fmt.Fprint(out, e.Output)
		return
	case "build-fail":
		r.failed = true
		return
	}
	key := e.Package + "\x00" + e.Test
	if e.Test == "" {
		switch e.Action {
		case "output":
			// The package's own lines: "ok  pkg 1.2s", "FAIL pkg", a
			// panic outside a test; not the bare PASS.
			if e.Output != "PASS\n" {
				fmt.Fprint(out, e.Output)
			}
		case "pass", "fail", "skip":
			p := &pkg{name: e.Package, elapsed: seconds(e.Elapsed), result: e.Action}
			r.pkgs[e.Package] = p
			r.order = append(r.order, e.Package)
			if e.Action == "fail" {
				r.failed = true
				// Tests that never ended (a panic, the timeout) say why.
				for k, lines := range r.output {
					if strings.HasPrefix(k, e.Package+"\x00") {
						fmt.Fprint(out, strings.Join(lines, ""))
						delete(r.output, k)
					}
				}
			}
		}
		return
	}
	t := r.tests[key]
	if t == nil {
		t = &test{pkg: e.Package, name: e.Test}
		r.tests[key] = t
	}
	switch e.Action {
	case "output":
		if m := slotWaitLine.FindStringSubmatch(e.Output); m != nil {
			d, _ := time.ParseDuration(m[1])
			t.slotWait += d
		}
		if m := labReadyLine.FindStringSubmatch(e.Output); m != nil {
			d, _ := time.ParseDuration(m[1])
			t.labStart += d
			t.labs++
		}
		if framing(e.Output) {
			return
		}
		r.output[key] = append(r.output[key], e.Output)
	case "pass", "skip":
		t.elapsed, t.result = seconds(e.Elapsed), e.Action
		delete(r.output, key)
	case "fail":
		t.elapsed, t.result = seconds(e.Elapsed), e.Action
		// A subtest's lines are printed with its own failure, before
		// its parent's.
		fmt.Fprint(out, strings.Join(r.output[key], ""))
		if why := reasons(r.output[key]); len(why) > 0 {
			r.why = append(r.why, failure{pkg: e.Package, name: e.Test, reasons: why})
		}
		delete(r.output, key)
	}
}

// A message a test wrote: "    file_test.go:12: text" (four spaces, at
// any subtest depth), its further lines indented deeper.
var messageLine = regexp.MustCompile(`^    (\S+\.go:\d+): (.*)$`)

// dumpMessage is a message that carries logs for context (the lab's, the
// control plane's: "lab log (last 40 lines …):", "control plane logs:"),
// written when a test fails, after the check that failed it.
var dumpMessage = regexp.MustCompile(`(?i)\blogs?\b.*:$`)

// reasons picks from a failing test's output what its checks said: each
// message but the log dumps, cut to its first line and its last few (a
// failed command's tail ends with its error), so a CI log's last screen
// names why every test failed.
func reasons(lines []string) []string {
	const keep = 6
	var out []string
	var cur []string
	flush := func() {
		if len(cur) == 0 {
			return
		}
		if m := messageLine.FindStringSubmatch(strings.TrimRight(cur[0], "\n")); m != nil && !dumpMessage.MatchString(m[2]) {
			head := strings.TrimSpace(cur[0])
			rest := cur[1:]
			if len(rest) > keep {
				head += fmt.Sprintf(" [… %d lines]", len(rest)-keep)
				rest = rest[len(rest)-keep:]
			}
			out = append(out, head)
			for _, l := range rest {
				out = append(out, "    "+strings.TrimSpace(l))
			}
		}
		cur = nil
	}
	for _, l := range lines {
		if messageLine.MatchString(strings.TrimRight(l, "\n")) || strings.HasPrefix(strings.TrimSpace(l), "--- FAIL") {
			flush()
		}
		if strings.HasPrefix(strings.TrimSpace(l), "--- FAIL") {
			continue
		}
		cur = append(cur, l)
	}
	flush()
	return out
}

// printWhy ends a failed run with why each test failed (the leaves: a
// parent fails with its subtests and says nothing of its own).
func (r *run) printWhy(out io.Writer) {
	if len(r.why) == 0 {
		return
	}
	// Enough for a handful of failures; a run where everything failed
	// has one cause, found in its first few.
	const most = 120
	fmt.Fprintf(out, "\nwhy %d tests failed (their checks' messages; the whole output is above):\n", len(r.why))
	lines := 0
	for i, f := range r.why {
		if lines > most {
			fmt.Fprintf(out, "… and %d more failing tests\n", len(r.why)-i)
			return
		}
		lines += 1 + len(f.reasons)
		fmt.Fprintf(out, "%s %s:\n", short(f.pkg), f.name)
		for _, l := range f.reasons {
			fmt.Fprintf(out, "  %s\n", l)
		}
	}
}

// framing is test2json's bookkeeping, which plain go test does not print.
func framing(line string) bool {
	for _, p := range []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME"} {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return false
}

func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(10 * time.Millisecond)
}

// printPackages is the table make test ends with: every package that ran
// tests, slowest first, and the wall time of the run.
func (r *run) printPackages(out io.Writer, wall time.Duration) {
	pkgs := r.sortedPackages()
	var sum time.Duration
	quick := 0
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(out, "\ntime per package (running its tests; packages run side by side):")
	for _, p := range pkgs {
		sum += p.elapsed
		if p.elapsed < time.Second && p.result != "fail" {
			quick++
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", p.elapsed.Round(100*time.Millisecond), p.result, p.name)
	}
	w.Flush()
	fmt.Fprintf(out, "%d packages (%d under 1s not listed), %s of package time, %s wall\n", len(pkgs), quick, sum.Round(time.Second), wall.Round(time.Second))
}

func (r *run) sortedPackages() []*pkg {
	var pkgs []*pkg
	for _, name := range r.order {
		pkgs = append(pkgs, r.pkgs[name])
	}
	slices.SortStableFunc(pkgs, func(a, b *pkg) int { return int(b.elapsed - a.elapsed) })
	return pkgs
}

// printSlowest is make test-times: the n slowest tests (top-level tests
// and subtests alike) with their lab slot waits and lab starts, and the n
// slowest packages.
func (r *run) printSlowest(out io.Writer, n int) {
	var tests []*test
	for _, t := range r.tests {
		if t.result != "" {
			tests = append(tests, t)
		}
	}
	slices.SortFunc(tests, func(a, b *test) int {
		if a.elapsed != b.elapsed {
			return int(b.elapsed - a.elapsed)
		}
		return strings.Compare(a.pkg+a.name, b.pkg+b.name)
	})
	fmt.Fprintf(out, "slowest %d tests (slot: waiting for a lab slot; labs: control planes started, their start time):\n", min(n, len(tests)))
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "time\tslot\tlabs\tresult\tpackage\ttest")
	for _, t := range tests[:min(n, len(tests))] {
		labs := ""
		if t.labs > 0 {
			labs = fmt.Sprintf("%d in %s", t.labs, t.labStart.Round(100*time.Millisecond))
		}
		slot := ""
		if t.slotWait > 0 {
			slot = t.slotWait.Round(time.Second).String()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", t.elapsed.Round(100*time.Millisecond), slot, labs, t.result, short(t.pkg), t.name)
	}
	w.Flush()
	pkgs := r.sortedPackages()
	fmt.Fprintf(out, "\nslowest %d packages:\n", min(n, len(pkgs)))
	w = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, p := range pkgs[:min(n, len(pkgs))] {
		fmt.Fprintf(w, "%s\t%s\t%s\n", p.elapsed.Round(100*time.Millisecond), p.result, p.name)
	}
	w.Flush()
}

// short drops the module path from a package's import path.
func short(p string) string {
	if i := strings.Index(p, "/bootstrap/"); i >= 0 {
		return p[i+len("/bootstrap/"):]
	}
	return p
}
