package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// LockFileName is the lock file inside a cluster's state directory.
const LockFileName = "lock"

// Holder identifies the process holding a cluster lock.
type Holder struct {
	PID     int       `json:"pid"`
	Command string    `json:"command"`
	Started time.Time `json:"started"`
	Host    string    `json:"host,omitempty"`
}

func (h Holder) String() string {
	return fmt.Sprintf("pid %d (%s), started %s", h.PID, h.Command, h.Started.UTC().Format(time.RFC3339))
}

// LockedError says another process holds the cluster lock.
type LockedError struct {
	Path   string
	Holder Holder
}

func (e *LockedError) Error() string {
	return fmt.Sprintf("another bootstrap run holds the lock %s: %s", e.Path, e.Holder)
}

// Lock is an exclusive OS file lock on a cluster's state directory. The
// kernel drops it when the process dies, so a stale lock is never a problem.
type Lock struct {
	f *os.File
}

// Acquire takes the cluster lock in dir without blocking. When another
// process holds it, the error is a *LockedError naming that process.
func Acquire(dir string, me Holder) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, LockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			le := &LockedError{Path: path}
			// The holder writes its identity right after locking; a racing
			// reader may see an empty file, which still names the lock path.
			if b, rerr := os.ReadFile(path); rerr == nil {
				_ = json.Unmarshal(b, &le.Holder)
			}
			return nil, le
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	b, _ := json.Marshal(me)
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt(append(b, '\n'), 0)
		_ = f.Sync()
	}
	return &Lock{f: f}, nil
}

// Release drops the lock. The file stays; its content is only informative.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	_ = l.f.Truncate(0)
	err := unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
	cerr := l.f.Close()
	l.f = nil
	if err != nil {
		return err
	}
	return cerr
}
