package stages

import (
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	"github.com/homelab/bootstrap/internal/wait"
)

// Preparer is an optional ability of a Stage: work that needs only the
// config and the files it names, not an earlier stage's result, which the
// runner starts in the background as the run starts so that it overlaps the
// stages before it (the talos stage's secrets bundle while the VMs boot,
// Flux's manifests while Talos installs; work that keeps a core busy waits
// for the precheck, prepareCPU). Prepare only computes and reads:
// it changes nothing, so a dry run and a run that fails earlier are exactly
// what they were without it. The stage takes the result with takePrepared
// and checks that it was made from the inputs it has now; otherwise it does
// the work in line, as it would without a Preparer.
type Preparer interface {
	Prepare(ctx context.Context, env *Env)
}

// background is one piece of work a Preparer started.
type background struct {
	what    string
	started time.Time
	done    chan struct{}
	val     any
	err     error
}

// prepare starts fn in the background under key. A panic in fn becomes its
// error, with the stack in the log, as runStage does for a stage.
func (e *Env) prepare(ctx context.Context, key, what string, fn func(context.Context) (any, error)) {
	b := &background{what: what, started: time.Now(), done: make(chan struct{})}
	r := e.shared()
	r.mu.Lock()
	if r.prepared == nil {
		r.prepared = map[string]*background{}
	}
	r.prepared[key] = b
	r.mu.Unlock()
	log := e.Log
	go func() {
		defer close(b.done)
		defer func() {
			if r := recover(); r != nil {
				log.Error().Str("stack", string(debug.Stack())).Msgf("preparing %s panicked: %v", what, r)
				b.err = fmt.Errorf("internal error (panic) preparing %s: %v", what, r)
			}
		}()
		b.val, b.err = fn(ctx)
	}()
}

// prepareCPU is prepare for work that keeps a core busy (an RSA key, a
// kustomize build, unpacking charts): it starts once the run's precheck has
// passed, at once without one, and after the CPU work prepared before it.
// The precheck's checks are many short round trips on the critical path,
// and on a two-core host such work beside them delays their answers; after
// the precheck it has the ISO download and the VMs' creation and boot to
// run in, one piece after another in the order the stages need them, so
// their transient heaps do not add up. A precheck that fails starts none
// of it.
func (e *Env) prepareCPU(ctx context.Context, key, what string, fn func(context.Context) (any, error)) {
	r := e.shared()
	gate := r.prechecked
	done := make(chan struct{})
	r.mu.Lock()
	prev := r.cpuTail
	r.cpuTail = done
	r.mu.Unlock()
	e.prepare(ctx, key, what, func(ctx context.Context) (any, error) {
		defer close(done)
		for _, before := range []chan struct{}{gate, prev} {
			if before == nil {
				continue
			}
			select {
			case <-before:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return fn(ctx)
	})
}

// precheckPassed lets the CPU work waiting for the precheck start.
func (e *Env) precheckPassed() {
	r := e.shared()
	if r.prechecked != nil {
		r.precheckOnce.Do(func() { close(r.prechecked) })
	}
}

// takePrepared returns what was prepared under key, waiting at most limit
// for it to finish, and forgets it (each result has one taker). ok is
// false when nothing was started under key, or it ended in an error that
// the stage should meet in line (the work is then done again, where the
// error is reported as without a Preparer). A result of another type is a
// bug and reads as not prepared.
func takePrepared[T any](ctx context.Context, e *Env, key string, limit time.Duration) (v T, ok bool, err error) {
	r := e.shared()
	r.mu.Lock()
	b := r.prepared[key]
	delete(r.prepared, key)
	r.mu.Unlock()
	if b == nil {
		return v, false, nil
	}
	waited := time.Now()
	select {
	case <-b.done:
	default:
		e.Log.Debug().Msgf("waiting for %s, started in the background %s ago (at most %s)", b.what, wait.Round(time.Since(b.started)), limit)
		t := time.NewTimer(limit)
		defer t.Stop()
		select {
		case <-b.done:
		case <-ctx.Done():
			return v, false, ctx.Err()
		case <-t.C:
			return v, false, fmt.Errorf("%s: not done %s after it started in the background: %w", b.what, wait.Round(time.Since(b.started)), wait.ErrTimeout)
		}
	}
	if b.err != nil {
		e.Log.Debug().Err(b.err).Msgf("%s failed in the background; the stage does it again in line", b.what)
		return v, false, nil
	}
	v, ok = b.val.(T)
	e.Log.Debug().Dur("waited", time.Since(waited)).Msgf("%s was prepared in the background (waited %s for it)", b.what, wait.Round(time.Since(waited)))
	return v, ok, nil
}

// startPreparers starts the background work of every selected stage that
// has some. The work stops when ctx ends (the run is over).
func startPreparers(ctx context.Context, env *Env, selected []Stage) {
	if slices.ContainsFunc(selected, func(s Stage) bool { return s.Name() == Precheck }) {
		env.shared().prechecked = make(chan struct{})
	}
	for _, s := range selected {
		if p, ok := s.(Preparer); ok {
			p.Prepare(ctx, env)
		}
	}
}
