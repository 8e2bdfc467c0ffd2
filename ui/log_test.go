package ui

import (
	"bytes"
	"encoding/json"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/internal/redact"
)

func TestLoggerJSONFileAndRedaction(t *testing.T) {
	var term, file bytes.Buffer
	secrets := &redact.Set{}
	secrets.Add("tok-3f9a-secret")
	log, err := NewLogger(Options{Format: FormatAuto, Level: "info", Out: &term, File: &file, Redact: secrets})
	if err != nil {
		t.Fatal(err)
	}
	log.Debug().Msg("detail only for the file")
	NewReporter(log).Change("create VM 701 with token tok-3f9a-secret")

	// Not a terminal: JSON lines on the terminal stream too.
	lines := strings.Split(strings.TrimSpace(term.String()), "\n")
	if len(lines) != 1 || !json.Valid([]byte(lines[0])) {
		t.Fatalf("terminal output: %q", term.String())
	}
	if strings.Contains(term.String()+file.String(), "tok-3f9a-secret") {
		t.Fatal("secret leaked into a log")
	}
	if !strings.Contains(file.String(), "detail only for the file") || strings.Contains(term.String(), "detail only") {
		t.Fatal("debug events belong in the run log only")
	}
	if !strings.Contains(term.String(), `"ui":"change"`) {
		t.Fatalf("change not tagged: %s", term.String())
	}
	var ev struct{ Time string }
	if err := json.Unmarshal([]byte(lines[0]), &ev); err != nil || !regexp.MustCompile(`T\d\d:\d\d:\d\d\.\d{3}Z$`).MatchString(ev.Time) {
		t.Fatalf("time %q: want UTC to the millisecond (%v)", ev.Time, err)
	}
}

func TestConsoleRendering(t *testing.T) {
	var term bytes.Buffer
	log, err := NewLogger(Options{Format: FormatConsole, Level: "info", Out: &term})
	if err != nil {
		t.Fatal(err)
	}
	r := NewReporter(log.With().Str("stage", "provision").Logger())
	r.StageStart(2, 6, "provision")
	r.Would("create VM 701 cp-1")
	out := term.String()
	if !strings.Contains(out, "▶ [2/6] provision") || !strings.Contains(out, "◇ would create VM 701 cp-1") || strings.Contains(out, "stage=") {
		t.Fatalf("console output:\n%s", out)
	}
	// Warnings and failures carry their glyph once, in the level column.
	term.Reset()
	r.Warn("disk is small")
	r.StageDone("talos", time.Second, 0, errors.New("boom"), false)
	out = term.String()
	if strings.Count(out, "⚠") != 1 || strings.Count(out, "✗") != 1 || !strings.Contains(out, "disk is small") {
		t.Fatalf("console output:\n%s", out)
	}
	if _, err := NewLogger(Options{Format: "xml"}); err == nil {
		t.Fatal("bad format accepted")
	}
	if _, err := NewLogger(Options{Level: "loud"}); err == nil {
		t.Fatal("bad level accepted")
	}
}
