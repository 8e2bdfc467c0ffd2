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
	ticket, err := takeTicket(filepath.Join(dir, "queue"))
	if err != nil {
		t.Fatalf("lab slots: %v", err)
	}
	defer ticket.done()
	var f *os.File
	for f == nil {
		if ticket.first() {
			for i := 0; i < n && f == nil; i++ {
				f = tryLock(t, filepath.Join(dir, fmt.Sprintf("slot-%d", i)))
			}
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

// ticket is a place in the machine's queue for lab slots: a file named by
// when its test asked and the process that asked. Only the first live
// ticket tries the slots, so they go out in the order asked, across test
// binaries. Polling alone let a package whose tests follow one another
// close behind (e2e: the next test asks within milliseconds of the last
// one's end) starve another binary's single test: a flux test waited the
// whole 10 minutes for one.
type ticket struct {
	dir, name string
}

func takeTicket(dir string) (*ticket, error) {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, err
	}
	for {
		name := fmt.Sprintf("%020d-%d", time.Now().UnixNano(), os.Getpid())
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o666)
		if errors.Is(err, os.ErrExist) {
			continue // two tests of one binary in the same nanosecond
		}
		if err != nil {
			return nil, err
		}
		f.Close()
		return &ticket{dir: dir, name: name}, nil
	}
}

// first reports whether no live ticket is older; the tickets of processes
// that are gone (a killed test binary) are removed on the way.
func (k *ticket) first() bool {
	entries, err := os.ReadDir(k.dir)
	if err != nil {
		return true // no queue to read: poll as before
	}
	for _, e := range entries { // sorted by name: oldest first
		if e.Name() >= k.name {
			return true
		}
		var nanos int64
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d-%d", &nanos, &pid); err != nil {
			continue
		}
		if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
			_ = os.Remove(filepath.Join(k.dir, e.Name()))
			continue
		}
		return false
	}
	return true
}

func (k *ticket) done() { _ = os.Remove(filepath.Join(k.dir, k.name)) }
