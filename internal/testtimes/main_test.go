package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// A run of two packages as `go test -json` writes it: one passing, one
// with a failing subtest beside a passing test that waited for a lab slot
// and started two labs.
const stream = `{"Action":"start","Package":"example/bootstrap/flux"}
{"Action":"run","Package":"example/bootstrap/flux","Test":"TestA"}
{"Action":"output","Package":"example/bootstrap/flux","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"output","Package":"example/bootstrap/flux","Test":"TestA","Output":"    slot.go:66: waited 12.3s for one of the machine's 3 lab slots\n"}
{"Action":"output","Package":"example/bootstrap/flux","Test":"TestA","Output":"    kubetest.go:116: lab control plane (Kubernetes v1.36.1) ready at https://127.1.2.1:6443 in 4.5s\n"}
{"Action":"output","Package":"example/bootstrap/flux","Test":"TestA","Output":"    kubetest.go:116: lab control plane (Kubernetes v1.36.1) ready at https://127.1.3.1:6443 in 7s\n"}
{"Action":"output","Package":"example/bootstrap/flux","Test":"TestA","Output":"    passing test's noise\n"}
{"Action":"pass","Package":"example/bootstrap/flux","Test":"TestA","Elapsed":40.5}
{"Action":"run","Package":"example/bootstrap/flux","Test":"TestB"}
{"Action":"run","Package":"example/bootstrap/flux","Test":"TestB/sub"}
{"Action":"output","Package":"example/bootstrap/flux","Test":"TestB/sub","Output":"    b_test.go:9: the reason it failed\n"}
{"Action":"output","Package":"example/bootstrap/flux","Test":"TestB/sub","Output":"    --- FAIL: TestB/sub (1.00s)\n"}
{"Action":"fail","Package":"example/bootstrap/flux","Test":"TestB/sub","Elapsed":1}
{"Action":"output","Package":"example/bootstrap/flux","Test":"TestB","Output":"--- FAIL: TestB (1.00s)\n"}
{"Action":"fail","Package":"example/bootstrap/flux","Test":"TestB","Elapsed":1}
{"Action":"output","Package":"example/bootstrap/flux","Output":"FAIL\n"}
{"Action":"output","Package":"example/bootstrap/flux","Output":"FAIL\texample/bootstrap/flux\t41.6s\n"}
{"Action":"fail","Package":"example/bootstrap/flux","Elapsed":41.6}
{"Action":"start","Package":"example/bootstrap/infra"}
{"Action":"run","Package":"example/bootstrap/infra","Test":"TestC"}
{"Action":"pass","Package":"example/bootstrap/infra","Test":"TestC","Elapsed":90}
{"Action":"output","Package":"example/bootstrap/infra","Output":"PASS\n"}
{"Action":"output","Package":"example/bootstrap/infra","Output":"ok  \texample/bootstrap/infra\t90.1s\n"}
{"Action":"pass","Package":"example/bootstrap/infra","Elapsed":90.1}
not an event: a vet line
`

func TestPrintsWhatGoTestPrintsAndTheTimes(t *testing.T) {
	r := newRun()
	var out strings.Builder
	if err := r.read(strings.NewReader(stream), &out); err != nil {
		t.Fatal(err)
	}
	if !r.failed {
		t.Error("a run with a failing package not marked failed")
	}
	got := out.String()
	for _, want := range []string{"b_test.go:9: the reason it failed", "--- FAIL: TestB (1.00s)", "FAIL\texample/bootstrap/flux", "ok  \texample/bootstrap/infra", "not an event: a vet line"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, noise := range []string{"passing test's noise", "=== RUN", "PASS\n"} {
		if strings.Contains(got, noise) {
			t.Errorf("output holds %q, which plain go test does not print:\n%s", noise, got)
		}
	}

	var table strings.Builder
	r.printPackages(&table, 95*time.Second)
	lines := strings.Split(table.String(), "\n")
	if len(lines) < 4 || !strings.Contains(lines[2], "infra") || !strings.Contains(lines[3], "flux") {
		t.Errorf("package table not slowest first:\n%s", table.String())
	}
	if !strings.Contains(table.String(), "2 packages (0 under 1s not listed), 2m12s of package time, 1m35s wall") {
		t.Errorf("package table's total:\n%s", table.String())
	}

	var slow strings.Builder
	r.printSlowest(&slow, 2)
	s := slow.String()
	if !strings.Contains(s, "slowest 2 tests") || strings.Contains(s, "TestB/sub") {
		t.Errorf("the two slowest tests are TestC and TestA:\n%s", s)
	}
	if !strings.Contains(s, "12s") || !strings.Contains(s, "2 in 11.5s") {
		t.Errorf("TestA's slot wait (12s) and two labs (11.5s) not reported:\n%s", s)
	}
}

// A CI log is read from its end: a failed run ends with each failing
// test's messages, not the logs it dumped on failing, each cut to its
// first line and its last ones.
func TestEndsWithWhyTestsFailed(t *testing.T) {
	ev := func(test, out string) string {
		b, _ := json.Marshal(event{Action: "output", Package: "example/bootstrap/e2e", Test: test, Output: out})
		return string(b) + "\n"
	}
	var in strings.Builder
	in.WriteString(ev("TestUp/3cp", "=== RUN   TestUp/3cp\n"))
	in.WriteString(ev("TestUp/3cp", "    upgrade_test.go:87: dry-run plan:\n"))
	in.WriteString(ev("TestUp/3cp", "        upgrade Talos on cp-1\n"))
	in.WriteString(ev("TestUp/3cp", "    upgrade_test.go:113: upgrade run:\n"))
	for i := 1; i <= 20; i++ {
		in.WriteString(ev("TestUp/3cp", fmt.Sprintf("        line %d\n", i)))
	}
	in.WriteString(ev("TestUp/3cp", "        error: draining the Kubernetes node wk-2 (at most 5m0s): timed out\n"))
	in.WriteString(ev("TestUp/3cp", "    helpers_test.go:55: lab log (last 40 lines of /tmp/x/lab.log):\n"))
	in.WriteString(ev("TestUp/3cp", "        2026-12-03T13:43:14Z INFO controller-runtime.metrics Starting metrics server\n"))
	in.WriteString(ev("TestUp/3cp", "    helpers_test.go:57: control plane logs:\n"))
	in.WriteString(ev("TestUp/3cp", "        kube-apiserver: noise\n"))
	in.WriteString(ev("TestUp/3cp", "    --- FAIL: TestUp/3cp (347.63s)\n"))
	in.WriteString(`{"Action":"fail","Package":"example/bootstrap/e2e","Test":"TestUp/3cp","Elapsed":347.63}` + "\n")
	in.WriteString(ev("TestUp", "--- FAIL: TestUp (0.00s)\n"))
	in.WriteString(`{"Action":"fail","Package":"example/bootstrap/e2e","Test":"TestUp","Elapsed":0}` + "\n")
	in.WriteString(`{"Action":"fail","Package":"example/bootstrap/e2e","Elapsed":400}` + "\n")

	r := newRun()
	if err := r.read(strings.NewReader(in.String()), io.Discard); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	r.printPackages(&out, time.Minute)
	r.printWhy(&out)
	got := out.String()
	why := got[strings.Index(got, "why 1 tests failed"):]
	for _, want := range []string{"e2e TestUp/3cp:", "upgrade_test.go:113: upgrade run: [… 15 lines]", "line 20", "draining the Kubernetes node wk-2", "upgrade_test.go:87: dry-run plan:"} {
		if !strings.Contains(why, want) {
			t.Errorf("the failure summary lacks %q:\n%s", want, why)
		}
	}
	for _, noise := range []string{"line 15\n", "Starting metrics server", "kube-apiserver: noise", "TestUp:", "--- FAIL"} {
		if strings.Contains(why, noise) {
			t.Errorf("the failure summary holds %q:\n%s", noise, why)
		}
	}
	if !strings.HasSuffix(strings.TrimSpace(got), "draining the Kubernetes node wk-2 (at most 5m0s): timed out") {
		t.Errorf("the run does not end with the reason:\n%s", got)
	}
}
