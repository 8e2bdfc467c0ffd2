package postcheck

import (
	"testing"

	"github.com/homelab/bootstrap/check"
)

func TestWithWarnings(t *testing.T) {
	results := []check.Result{
		{Name: CheckEtcdBackup, Status: check.Pass, Reason: "took one"},
		{Name: CheckNFS, Status: check.Fail, Reason: "pending"},
		{Name: CheckCerts, Status: check.Pass, Reason: "fine"},
	}
	got := WithWarnings(results, []Warning{
		{Check: CheckEtcdBackup, Text: "ahead"},
		{Check: CheckEtcdBackup, Text: "ahead"},
		{Check: CheckNFS, Text: "slow"},
		{Check: "", Text: "loose"},
		{Check: "no-such-row", Text: "stray"},
	})
	want := []check.Result{
		{Name: CheckEtcdBackup, Status: check.Warn, Reason: "took one; warned: ahead"},
		{Name: CheckNFS, Status: check.Fail, Reason: "pending; warned: slow"},
		{Name: CheckCerts, Status: check.Pass, Reason: "fine"},
		{Name: CheckRunWarnings, Status: check.Warn, Reason: "the run warned: loose; stray"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
	if results[0].Status != check.Pass {
		t.Error("the results given were changed")
	}
}
