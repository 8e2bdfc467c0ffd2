package ui

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/rs/zerolog"
)

// FieldCheck names the check a line was logged for: the postcheck puts a
// warning logged with it on that check's row.
const FieldCheck = "check"

// Warning is one warn-level line the run logged, as masked as the log.
type Warning struct {
	// Stage and Check are the line's stage and check fields ("" without).
	Stage, Check string
	// Text is the message followed by the line's other fields
	// (key=value), so an error or the object named in a field is kept.
	Text string
}

// Warnings keeps the warn-level lines of a run (NewLogger's
// Options.Warnings), so a command can put what it warned about in its
// record as well as on the console: a warning only printed is read by
// nobody the morning after. Safe for concurrent use.
type Warnings struct {
	mu    sync.Mutex
	lines []Warning
}

// Mark is a position in the lines: Since(Mark()) are the lines logged
// after it.
func (w *Warnings) Mark() int {
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.lines)
}

// Since returns the lines logged after mark (nil on a nil Warnings).
func (w *Warnings) Since(mark int) []Warning {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if mark > len(w.lines) {
		return nil
	}
	return append([]Warning(nil), w.lines[mark:]...)
}

// Write takes one JSON line of the logger; lines that are not warnings, or
// not JSON, are ignored.
func (w *Warnings) Write(p []byte) (int, error) {
	var fields map[string]any
	if err := json.Unmarshal(p, &fields); err != nil {
		return len(p), nil
	}
	if fields[zerolog.LevelFieldName] != zerolog.LevelWarnValue {
		return len(p), nil
	}
	line := Warning{}
	line.Stage, _ = fields["stage"].(string)
	line.Check, _ = fields[FieldCheck].(string)
	msg, _ := fields[zerolog.MessageFieldName].(string)
	var extra []string
	for k, v := range fields {
		switch k {
		case zerolog.LevelFieldName, zerolog.TimestampFieldName, zerolog.MessageFieldName, "stage", FieldCheck, FieldUI:
			continue
		}
		extra = append(extra, fmt.Sprintf("%s=%v", k, v))
	}
	sort.Strings(extra)
	line.Text = msg
	if len(extra) > 0 {
		line.Text += " (" + strings.Join(extra, ", ") + ")"
	}
	w.mu.Lock()
	w.lines = append(w.lines, line)
	w.mu.Unlock()
	return len(p), nil
}
