package ui

import (
	"io"
	"testing"

	"github.com/homelab/bootstrap/internal/redact"
)

// The warn-level lines are kept, masked, with their fields; other levels
// are not.
func TestWarningsKeepsWarnLines(t *testing.T) {
	secrets := &redact.Set{}
	secrets.Add("hunter2")
	w := &Warnings{}
	log, err := NewLogger(Options{Format: FormatJSON, Level: "error", Out: io.Discard, Redact: secrets, Warnings: w})
	if err != nil {
		t.Fatal(err)
	}
	log.Info().Msg("an info line")
	mark := w.Mark()
	log.Warn().Str("stage", "postcheck").Str(FieldCheck, "etcd-backup").Str("copy", "s3://b/x").Msg("password hunter2 seen")
	log.Error().Msg("an error line")
	got := w.Since(mark)
	if len(got) != 1 {
		t.Fatalf("got %+v", got)
	}
	if want := (Warning{Stage: "postcheck", Check: "etcd-backup", Text: "password " + redact.Mask + " seen (copy=s3://b/x)"}); got[0] != want {
		t.Errorf("got %+v, want %+v", got[0], want)
	}
	var nilW *Warnings
	if nilW.Mark() != 0 || nilW.Since(0) != nil {
		t.Error("a nil Warnings keeps nothing")
	}
}
