package ui

import (
	"fmt"
	"strings"
	"time"

	"github.com/rs/zerolog"
)

// FieldUI tags an event with the kind of progress line it is, so the console
// can mark it and JSON consumers can filter it.
const FieldUI = "ui"

// FieldStageEnd marks the event that ends a stage.
const FieldStageEnd = "stage_end"

const (
	kindHeader = "header"
	kindChange = "change"
	kindWould  = "would"
	kindWait   = "wait"
	kindOK     = "ok"
	kindWarn   = "warn"
	kindFail   = "fail"
)

// Reporter emits the human progress of a run as log events: stage headers,
// changes, planned changes, and per-stage outcomes with durations.
type Reporter struct {
	log zerolog.Logger
}

// NewReporter reports through log.
func NewReporter(log zerolog.Logger) *Reporter { return &Reporter{log: log} }

// With returns a reporter whose events carry the logger's context (stage=…).
func (r *Reporter) With(log zerolog.Logger) *Reporter { return &Reporter{log: log} }

// StageStart prints "[2/6] provision", or "[5/6] flux, beside infra" for
// a stage that starts while the stages beside still run.
func (r *Reporter) StageStart(pos, total int, name string, beside ...string) {
	msg := fmt.Sprintf("[%d/%d] %s", pos, total, name)
	if len(beside) > 0 {
		msg += ", beside " + strings.Join(beside, " and ")
	}
	r.log.Info().Str(FieldUI, kindHeader).Int("pos", pos).Int("of", total).Msg(msg)
}

// StageDone prints a stage's outcome and duration.
func (r *Reporter) StageDone(name string, d time.Duration, changes int, err error, interrupted bool) {
	dur := d.Round(10 * time.Millisecond)
	log := r.log.With().Bool(FieldStageEnd, true).Logger()
	switch {
	case interrupted:
		log.Warn().Str(FieldUI, kindWarn).Dur("duration", d).Msgf("%s interrupted after %s", name, dur)
	case err != nil:
		log.Error().Str(FieldUI, kindFail).Dur("duration", d).Err(err).Msgf("%s failed after %s", name, dur)
	case changes == 0:
		log.Info().Str(FieldUI, kindOK).Dur("duration", d).Msgf("%s done in %s, no changes", name, dur)
	default:
		log.Info().Str(FieldUI, kindOK).Dur("duration", d).Int("changes", changes).Msgf("%s done in %s, %d change(s)", name, dur, changes)
	}
}

// Change reports a mutation being made.
func (r *Reporter) Change(action string) {
	r.log.Info().Str(FieldUI, kindChange).Msg(action)
}

// Would reports a mutation a dry run skipped.
func (r *Reporter) Would(action string) {
	r.log.Info().Str(FieldUI, kindWould).Msg("would " + action)
}

// OK reports something verified or already in place.
func (r *Reporter) OK(format string, a ...any) {
	r.log.Info().Str(FieldUI, kindOK).Msg(fmt.Sprintf(format, a...))
}

// Warn reports something the user should look at; the run goes on.
func (r *Reporter) Warn(format string, a ...any) {
	r.log.Warn().Str(FieldUI, kindWarn).Msg(fmt.Sprintf(format, a...))
}
