package postcheck

import (
	"slices"
	"strings"

	"github.com/homelab/bootstrap/check"
)

// CheckRunWarnings is the row for the warnings the run logged while the
// checks ran that no check owns. It is there only when there are some.
const CheckRunWarnings = "run-warnings"

// Warning is a warning the run logged while the checks ran: Check names
// the check it was logged for ("" or a name no row has: the run's).
type Warning struct {
	Check, Text string
}

// WithWarnings puts each warning on the row of the check it was logged
// for, and the others on a CheckRunWarnings row appended at the end: what
// the console warned about reaches report.json, the history page and the
// metrics too. A passing row that warned becomes a warning; a row keeps a
// worse status. A warning logged twice is told once. The texts are as
// masked as the log they were read from.
func WithWarnings(results []check.Result, warnings []Warning) []check.Result {
	if len(warnings) == 0 {
		return results
	}
	byCheck := map[string][]string{}
	for _, w := range warnings {
		name := w.Check
		if !slices.ContainsFunc(results, func(r check.Result) bool { return r.Name == name }) {
			name = CheckRunWarnings
		}
		if !slices.Contains(byCheck[name], w.Text) {
			byCheck[name] = append(byCheck[name], w.Text)
		}
	}
	out := make([]check.Result, 0, len(results)+1)
	for _, r := range results {
		if texts := byCheck[r.Name]; len(texts) > 0 {
			if r.Status == check.Pass {
				r.Status = check.Warn
			}
			r.Reason += "; warned: " + strings.Join(texts, "; ")
		}
		out = append(out, r)
	}
	if texts := byCheck[CheckRunWarnings]; len(texts) > 0 {
		out = append(out, check.Result{Name: CheckRunWarnings, Status: check.Warn, Reason: "the run warned: " + strings.Join(texts, "; ")})
	}
	return out
}
