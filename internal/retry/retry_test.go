package retry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestDoRetriesOnlyRetryable(t *testing.T) {
	fast := Policy{Attempts: 4, Initial: time.Millisecond, Max: 2 * time.Millisecond}
	calls := 0
	err := Do(context.Background(), fast, zerolog.Nop(), "x", func(context.Context) error {
		calls++
		if calls < 3 {
			return Retryable(errors.New("503"))
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("err=%v calls=%d", err, calls)
	}

	calls = 0
	fatal := errors.New("400 bad")
	err = Do(context.Background(), fast, zerolog.Nop(), "x", func(context.Context) error { calls++; return fatal })
	if !errors.Is(err, fatal) || calls != 1 {
		t.Fatalf("fatal error retried: err=%v calls=%d", err, calls)
	}

	calls = 0
	err = Do(context.Background(), fast, zerolog.Nop(), "x", func(context.Context) error {
		calls++
		return Retryable(fmt.Errorf("wrapped: %w", fatal))
	})
	if calls != 4 || !errors.Is(err, fatal) || !IsRetryable(err) {
		t.Fatalf("exhaustion: err=%v calls=%d", err, calls)
	}
}

func TestDoStopsOnContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Do(ctx, Policy{Attempts: 10, Initial: time.Hour}, zerolog.Nop(), "x", func(context.Context) error {
		return Retryable(errors.New("busy"))
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v", err)
	}
	if IsRetryable(nil) || Retryable(nil) != nil {
		t.Fatal("nil handling")
	}
}

// Named's errors name the operation exactly once, however the loop ended,
// so a caller returning them as they are never doubles the prefix (a
// postcheck row once read "reading the extensions of 10.0.0.1: reading the
// extensions of 10.0.0.1: …").
func TestNamedNamesTheOperationOnce(t *testing.T) {
	fast := Policy{Attempts: 2, Initial: time.Millisecond, Max: time.Millisecond}
	const what = "reading the extensions of 10.0.0.1"
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for name, tc := range map[string]struct {
		ctx context.Context
		err error
	}{
		"fatal":     {context.Background(), errors.New("permission denied")},
		"exhausted": {context.Background(), Retryable(errors.New("connection refused"))},
		"cancelled": {cancelled, Retryable(errors.New("connection refused"))},
	} {
		err := Named(tc.ctx, fast, zerolog.Nop(), what, func(context.Context) error { return tc.err })
		if err == nil || !strings.HasPrefix(err.Error(), what+": ") || strings.Count(err.Error(), what) != 1 {
			t.Errorf("%s: %v", name, err)
		}
		if name != "cancelled" && !errors.Is(err, tc.err) {
			t.Errorf("%s: %v does not wrap %v", name, err, tc.err)
		}
	}
}
