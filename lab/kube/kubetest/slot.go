package kubetest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// SlotsEnv sets how many tests on this machine may run a lab at once,
// across every test binary (`make test` runs several packages, and the
// tests of a package, side by side). Default: one and a half per CPU.
const SlotsEnv = "BOOTSTRAP_TEST_LABS"

// slotWaitLimit bounds the wait for a slot: a test that still finds none
// runs anyway (and says so) rather than risk a wait nobody ends.
const slotWaitLimit = 10 * time.Minute

var (
	slotMu   sync.Mutex
	slotHeld = map[string]bool{}
)

// Slot holds one of the machine's lab slots for the rest of the test,
// waiting for one while others are taken. A test that already holds one
// keeps it. The slots are flock(2)ed files, so a test binary that dies
// gives its slots back.
func Slot(t testing.TB) {
	t.Helper()
	slotMu.Lock()
	held := slotHeld[t.Name()]
	slotHeld[t.Name()] = true
	slotMu.Unlock()
	if held {
		return
	}
	n := slotCount()
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("bootstrap-test-labs-%d", n))
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatalf("lab slots: %v", err)
	}
	start := time.Now()
	var f *os.File
	for f == nil {
		for i := 0; i < n && f == nil; i++ {
			f = tryLock(t, filepath.Join(dir, fmt.Sprintf("slot-%d", i)))
		}
		if f != nil {
			break
		}
		if time.Since(start) > slotWaitLimit {
			t.Logf("no lab slot free after %s (%d in use): running anyway", slotWaitLimit, n)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Logf("waited %s for one of the machine's %d lab slots", waited.Round(100*time.Millisecond), n)
	}
	t.Cleanup(func() {
		if f != nil {
			_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
			f.Close()
		}
		slotMu.Lock()
		delete(slotHeld, t.Name())
		slotMu.Unlock()
	})
}

func tryLock(t testing.TB, path string) *os.File {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("lab slots: %v", err)
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		return f
	}
	f.Close()
	if !errors.Is(err, unix.EWOULDBLOCK) {
		t.Fatalf("lab slots: locking %s: %v", path, err)
	}
	return nil
}

func slotCount() int {
	if n, err := strconv.Atoi(os.Getenv(SlotsEnv)); err == nil && n > 0 {
		return n
	}
	return max(2, (3*runtime.NumCPU()+1)/2)
}
