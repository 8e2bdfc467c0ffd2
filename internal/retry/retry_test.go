package retry

import (
	"context"
	"errors"
	"fmt"
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
