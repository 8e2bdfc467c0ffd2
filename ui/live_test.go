package ui

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/internal/wait"
)

// screen replays what a terminal would show for out: text, newlines, and the
// two controls the live console uses (cursor up n, clear to the end).
func screen(t *testing.T, out string) []string {
	t.Helper()
	var rows []string
	row := 0
	ctl := regexp.MustCompile(`^\x1b\[(\d*)([AJ])`)
	for len(out) > 0 {
		if m := ctl.FindStringSubmatch(out); m != nil {
			switch m[2] {
			case "A":
				n, _ := strconv.Atoi(m[1])
				row -= n
				if row < 0 {
					t.Fatalf("cursor moved above the first row")
				}
			case "J":
				rows = rows[:row]
			}
			out = out[len(m[0]):]
			continue
		}
		if out[0] == '\x1b' {
			t.Fatalf("unexpected control sequence %q", out[:min(len(out), 8)])
		}
		line, rest, nl := strings.Cut(out, "\n")
		for len(rows) <= row {
			rows = append(rows, "")
		}
		rows[row] += line
		if nl {
			row++
		}
		out = rest
	}
	return rows[:min(row, len(rows))]
}

func liveLogger(t *testing.T, tty bool) (zerolog.Logger, *bytes.Buffer, *bytes.Buffer) {
	t.Helper()
	var term, file bytes.Buffer
	c := newLiveConsole(&term, nil, zerolog.InfoLevel, tty, true)
	log := zerolog.New(zerolog.MultiLevelWriter(c, &levelFilter{w: &file, min: zerolog.DebugLevel})).Level(zerolog.TraceLevel)
	return log, &term, &file
}

func TestLiveLinesOnATerminal(t *testing.T) {
	log, term, file := liveLogger(t, true)
	r := NewReporter(log)
	r.StageStart(3, 6, "talos")
	log.Trace().Str(wait.FieldLive, "a#1").Msg("waiting for nodes configured: 0/3 done, pending: cp-1, cp-2, cp-3 (1s elapsed)")
	log.Trace().Str(wait.FieldLive, "b#2").Msg("waiting for etcd (1s elapsed)")
	log.Info().Str(wait.FieldLive, "a#1").Msg("nodes configured: cp-1 ready (1/3, 2s elapsed)")
	r.Change("bootstrap etcd on cp-1")
	log.Trace().Str(wait.FieldLive, "a#1").Msg("waiting for nodes configured: 2/3 done, pending: cp-3 (3s elapsed)")

	got := screen(t, term.String())
	if len(got) != 4 || !strings.Contains(got[0], "[3/6] talos") || !strings.Contains(got[1], "bootstrap etcd on cp-1") ||
		got[2] != "◎ waiting for nodes configured: 2/3 done, pending: cp-3 (3s elapsed)" || got[3] != "◎ waiting for etcd (1s elapsed)" {
		t.Fatalf("screen while waiting:\n%s", strings.Join(got, "\n"))
	}

	log.Trace().Str(wait.FieldLive, "b#2").Bool(wait.FieldLiveEnd, true).Msg("")
	if got := screen(t, term.String()); len(got) != 3 || !strings.HasPrefix(got[2], "◎ waiting for nodes configured") {
		t.Fatalf("an ended wait must leave the screen:\n%s", strings.Join(got, "\n"))
	}
	r.StageDone("talos", 0, 1, nil, false)
	got = screen(t, term.String())
	if len(got) != 3 || !strings.Contains(got[2], "talos done in") {
		t.Fatalf("a stage's end clears its waits:\n%s", strings.Join(got, "\n"))
	}
	// The run log has the info-level progress, never the ticks.
	if strings.Contains(file.String(), "1s elapsed") || !strings.Contains(file.String(), "cp-1 ready (1/3") {
		t.Fatalf("run log:\n%s", file.String())
	}
}

func TestLiveLinesWithoutATerminal(t *testing.T) {
	log, term, _ := liveLogger(t, false)
	log.Trace().Str(wait.FieldLive, "a#1").Msg("tick 1s")
	log.Info().Str(wait.FieldLive, "a#1").Msg("progress 10s")
	log.Trace().Str(wait.FieldLive, "a#1").Bool(wait.FieldLiveEnd, true).Msg("")
	out := term.String()
	if strings.Contains(out, "\x1b[") || strings.Contains(out, "tick") || strings.Count(out, "\n") != 1 || !strings.Contains(out, "progress 10s") {
		t.Fatalf("plain console output: %q", out)
	}
}

func TestJSONOutputKeepsProgressLines(t *testing.T) {
	var term bytes.Buffer
	log, err := NewLogger(Options{Format: FormatJSON, Level: "info", Out: &term, Redact: &redact.Set{}})
	if err != nil {
		t.Fatal(err)
	}
	log.Trace().Str(wait.FieldLive, "a#1").Msg("tick")
	log.Info().Str(wait.FieldLive, "a#1").Msg("progress")
	if strings.Contains(term.String(), "tick") || !strings.Contains(term.String(), `"message":"progress"`) {
		t.Fatalf("JSON output: %s", term.String())
	}
}
