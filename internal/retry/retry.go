// Package retry marks errors as transient at the client boundary and retries
// single calls that failed with such errors. Anything not marked is fatal:
// the runner never retries a whole stage silently.
package retry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
)

type retryable struct{ err error }

func (r *retryable) Error() string { return r.err.Error() }
func (r *retryable) Unwrap() error { return r.err }

// Retryable marks err as transient. A nil err stays nil.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return &retryable{err: err}
}

// IsRetryable reports whether err, or anything it wraps, was marked transient.
func IsRetryable(err error) bool {
	var r *retryable
	return errors.As(err, &r)
}

// Policy bounds a retry loop. Attempts counts calls, not retries; zero values
// take the defaults (5 attempts, 250ms doubling up to 5s).
type Policy struct {
	Attempts int
	Initial  time.Duration
	Max      time.Duration
}

func (p Policy) withDefaults() Policy {
	if p.Attempts <= 0 {
		p.Attempts = 5
	}
	if p.Initial <= 0 {
		p.Initial = 250 * time.Millisecond
	}
	if p.Max <= 0 {
		p.Max = 5 * time.Second
	}
	return p
}

// Do calls fn until it succeeds, fails with an error not marked retryable,
// runs out of attempts, or ctx ends. Every retry is logged at warn level with
// what was being done, so a run that recovered still shows what it recovered from.
func Do(ctx context.Context, p Policy, log zerolog.Logger, what string, fn func(context.Context) error) error {
	return do(ctx, p, log, what, fn, false)
}

// Named is Do for a caller that adds no context of its own: every error it
// returns starts with what, a fatal one too, so the caller returns it as it
// is instead of naming the operation a second time.
func Named(ctx context.Context, p Policy, log zerolog.Logger, what string, fn func(context.Context) error) error {
	return do(ctx, p, log, what, fn, true)
}

func do(ctx context.Context, p Policy, log zerolog.Logger, what string, fn func(context.Context) error, nameFatal bool) error {
	p = p.withDefaults()
	delay := p.Initial
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		if !IsRetryable(err) {
			if nameFatal {
				return fmt.Errorf("%s: %w", what, err)
			}
			return err
		}
		if attempt >= p.Attempts {
			return fmt.Errorf("%s: giving up after %d attempts: %w", what, attempt, err)
		}
		log.Warn().Err(err).Str("what", what).Int("attempt", attempt).Int("of", p.Attempts).
			Dur("next_in", delay).Msgf("retrying %s", what)
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w (last error: %v)", what, ctx.Err(), err)
		case <-t.C:
		}
		delay *= 2
		if delay > p.Max {
			delay = p.Max
		}
	}
}
