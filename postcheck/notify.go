package postcheck

import (
	"fmt"
	"strings"

	"github.com/homelab/bootstrap/check"
)

// ShouldNotify says whether a night's result is sent (postcheck.notify):
// when it changed, failing where the previous night passed (no previous
// night counts as passing) or passing where it failed, and on every
// failure with everyFailure. A warning is not a failure: it changes
// nothing here. prev is the previous night's overall status ("" when
// there was none).
func ShouldNotify(prev check.Status, r Report, everyFailure bool) bool {
	failed, wasFailed := r.Overall == check.Fail, prev == check.Fail
	return failed != wasFailed || (failed && everyFailure)
}

// Message is the notification of a night: the cluster and the verdict in
// the title; the failing checks (each with its reason and what to do
// next), the archive and the history page in the body.
func Message(r Report, archive, page string) (title, body string) {
	var b strings.Builder
	failed := 0
	for _, c := range r.Checks {
		if c.Status == check.Fail {
			failed++
		}
	}
	if failed > 0 {
		title = fmt.Sprintf("bootstrap postcheck of %s FAILED: %d of %d checks", r.Cluster, failed, len(r.Checks))
		fmt.Fprintf(&b, "The nightly postcheck of cluster %s failed (%s).\n", r.Cluster, r.Started.Format("2006-01-02 15:04 MST"))
		for _, c := range r.Checks {
			if c.Status != check.Fail {
				continue
			}
			fmt.Fprintf(&b, "\n✗ %s: %s\n", c.Name, strings.Join(strings.Fields(c.Reason), " "))
			if c.Next != "" {
				fmt.Fprintf(&b, "  next: %s\n", c.Next)
			}
		}
	} else {
		title = fmt.Sprintf("bootstrap postcheck of %s passes again", r.Cluster)
		fmt.Fprintf(&b, "The nightly postcheck of cluster %s passes again (%s): %d checks", r.Cluster, r.Started.Format("2006-01-02 15:04 MST"), len(r.Checks))
		if w := check.Count(r.results(), check.Warn); w > 0 {
			fmt.Fprintf(&b, ", %d with a warning", w)
		}
		b.WriteString(".\n")
	}
	if archive != "" {
		fmt.Fprintf(&b, "\nArchive: %s\n", archive)
	} else {
		b.WriteString("\nArchive: none written tonight (see the archive row)\n")
	}
	if page != "" {
		fmt.Fprintf(&b, "History: %s\n", page)
	}
	return title, b.String()
}

// results are the report's checks as check results (statuses only).
func (r Report) results() []check.Result {
	out := make([]check.Result, len(r.Checks))
	for i, c := range r.Checks {
		out[i] = check.Result{Name: c.Name, Status: c.Status}
	}
	return out
}
