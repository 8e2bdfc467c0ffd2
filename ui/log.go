// Package ui sets up logging and human progress output: zerolog with a
// console rendering on a terminal and JSON lines otherwise, a full JSON copy
// in the run's log file, secrets masked on every path.
package ui

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/internal/wait"
)

// Log formats.
const (
	FormatAuto    = "auto"
	FormatConsole = "console"
	FormatJSON    = "json"
)

// Options configure NewLogger.
type Options struct {
	// Format is auto (console on a TTY, JSON otherwise), console or json.
	Format string
	// Level is the minimum level on the terminal: debug, info, warn, error.
	Level string
	// Out is the terminal stream (stderr).
	Out io.Writer
	// File, when set, receives every event at debug level as JSON lines.
	File io.Writer
	// Redact masks secrets on every output.
	Redact *redact.Set
	// Warnings, when set, keeps every warn-level line, masked as the
	// other outputs are.
	Warnings *Warnings
}

// ParseLevel maps a --log-level value to a zerolog level.
func ParseLevel(s string) (zerolog.Level, error) {
	switch strings.ToLower(s) {
	case "", "info":
		return zerolog.InfoLevel, nil
	case "debug":
		return zerolog.DebugLevel, nil
	case "trace":
		return zerolog.TraceLevel, nil
	case "warn", "warning":
		return zerolog.WarnLevel, nil
	case "error":
		return zerolog.ErrorLevel, nil
	}
	return zerolog.NoLevel, fmt.Errorf("unknown log level %q: use debug, info, warn or error", s)
}

// IsTerminal reports whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// NewLogger builds the run's logger.
func NewLogger(o Options) (zerolog.Logger, error) {
	lvl, err := ParseLevel(o.Level)
	if err != nil {
		return zerolog.Nop(), err
	}
	if o.Out == nil {
		o.Out = os.Stderr
	}
	red := o.Redact
	if red == nil {
		red = &redact.Set{}
	}
	var term io.Writer
	tty := IsTerminal(o.Out)
	switch o.Format {
	case "", FormatAuto:
		if tty {
			term = newLiveConsole(red.Writer(o.Out), o.Out, lvl, true, false)
		} else {
			term = &levelFilter{w: red.Writer(o.Out), min: lvl}
		}
	case FormatConsole:
		term = newLiveConsole(red.Writer(o.Out), o.Out, lvl, tty, !tty)
	case FormatJSON:
		term = &levelFilter{w: red.Writer(o.Out), min: lvl}
	default:
		return zerolog.Nop(), fmt.Errorf("unknown log format %q: use auto, console or json", o.Format)
	}
	writers := []io.Writer{term}
	min := lvl
	if _, live := term.(*liveConsole); live && tty {
		// The terminal's live lines are fed by trace-level ticks.
		min = zerolog.TraceLevel
	}
	if o.File != nil {
		writers = append(writers, &levelFilter{w: red.Writer(o.File), min: zerolog.DebugLevel})
		if zerolog.DebugLevel < min {
			min = zerolog.DebugLevel
		}
	}
	if o.Warnings != nil {
		writers = append(writers, &levelFilter{w: red.Writer(o.Warnings), min: zerolog.WarnLevel})
		if zerolog.WarnLevel < min {
			min = zerolog.WarnLevel
		}
	}
	return zerolog.New(zerolog.MultiLevelWriter(writers...)).Level(min).Hook(millisTimestamp{}), nil
}

// millisTimestamp stamps every event with the time to the millisecond
// (zerolog's default is whole seconds): the run log is what the timing of
// a run's waits is read from.
type millisTimestamp struct{}

func (millisTimestamp) Run(e *zerolog.Event, _ zerolog.Level, _ string) {
	e.Str(zerolog.TimestampFieldName, time.Now().UTC().Format("2006-01-02T15:04:05.000Z07:00"))
}

// levelFilter drops events below min for one output.
type levelFilter struct {
	w   io.Writer
	min zerolog.Level
}

func (f *levelFilter) Write(p []byte) (int, error) { return f.w.Write(p) }

func (f *levelFilter) WriteLevel(l zerolog.Level, p []byte) (int, error) {
	if l < f.min {
		return len(p), nil
	}
	return f.w.Write(p)
}

// Glyphs mark the kinds of progress lines on the console.
var glyphs = map[string]string{
	kindHeader: "▶",
	kindChange: "✚",
	kindWould:  "◇",
	kindWait:   "◎",
	kindOK:     "✔",
	kindWarn:   "⚠",
	kindFail:   "✗",
}

// consoleWriter renders JSON events for humans: time, a glyph, the message
// and the few fields that matter.
func consoleWriter(w io.Writer, noColor bool) zerolog.ConsoleWriter {
	cw := zerolog.ConsoleWriter{Out: w, NoColor: noColor, TimeFormat: time.TimeOnly,
		FieldsExclude: []string{FieldUI, FieldStageEnd, wait.FieldLive, "stage", "wait", "elapsed", "status", "item", "done", "total", "duration", "pos", "of", "check", "result", "field", "changes"}}
	cw.FormatLevel = func(i any) string {
		switch fmt.Sprint(i) {
		case "debug":
			return "·"
		case "warn":
			return glyphs[kindWarn]
		case "error", "fatal", "panic":
			return glyphs[kindFail]
		}
		return " "
	}
	cw.FormatPrepare = func(ev map[string]any) error {
		if k, ok := ev[FieldUI].(string); ok {
			// A warning or failure already shows its glyph in the level
			// column: the message does not repeat it.
			level := fmt.Sprint(ev[zerolog.LevelFieldName])
			if k == kindWarn && level == "warn" || k == kindFail && (level == "error" || level == "fatal") {
				return nil
			}
			if g, ok := glyphs[k]; ok {
				ev[zerolog.MessageFieldName] = g + " " + fmt.Sprint(ev[zerolog.MessageFieldName])
			}
		}
		return nil
	}
	return cw
}
