// Package proc manages the long-lived helper processes bootstrap starts and
// later finds again by pid (the git snapshot server, a detached lab): start
// one in its own session, tell whether a recorded pid is still that process,
// and stop it with SIGTERM, then SIGKILL after a grace period.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/internal/wait"
)

// Alive reports whether pid is a live process that is not a zombie. With
// match set, the process's command line must also satisfy it: a pid reused
// by an unrelated program after ours exited does not count.
func Alive(pid int, match func(args []string) bool) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		// No procfs: the signal check above is all there is.
		return match == nil
	}
	// The state letter follows the parenthesised command name, which may
	// itself contain ") ".
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		if s := stat[i+2]; s == 'Z' || s == 'X' {
			return false
		}
	}
	if match == nil {
		return true
	}
	args, err := Args(pid)
	if err == nil && len(args) == 1 && args[0] == "" {
		// An exiting process has released its memory, and with it its
		// command line, before it becomes a zombie: it is still ours
		// and still alive (a stop that took it for gone returned while
		// it was exiting).
		return true
	}
	return err == nil && match(args)
}

// Args returns the command line of pid.
func Args(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), nil
}

// HasSubcommand returns a matcher for Alive: the command line holds words
// as consecutive arguments after the program name ("gitsnap", "serve").
func HasSubcommand(words ...string) func([]string) bool {
	return func(args []string) bool {
		for i := 1; i+len(words) <= len(args); i++ {
			if slices.Equal(args[i:i+len(words)], words) {
				return true
			}
		}
		return false
	}
}

// Detached is a child started in its own session.
type Detached struct {
	// PID of the child.
	PID int
	// Exited is closed when the child has exited and been reaped; Err then
	// holds what Wait returned.
	Exited <-chan struct{}
	err    *error
}

// Err is the child's exit error once Exited is closed.
func (d *Detached) Err() error { return *d.err }

// StartDetached starts cmd in a new session, so that it outlives the
// caller and its terminal (no SIGHUP when the terminal closes, no SIGINT
// from Ctrl-C), and reaps it if it exits while the caller lives, so it never
// lingers as a zombie.
func StartDetached(cmd *exec.Cmd) (*Detached, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	var err error
	go func() { err = cmd.Wait(); close(exited) }()
	return &Detached{PID: cmd.Process.Pid, Exited: exited, err: &err}, nil
}

// Stop ends pid: SIGTERM, up to grace for it to exit, then SIGKILL and up to
// 5 s more. what names the process in waits and errors ("git snapshot
// server"); match is passed to Alive. It reports whether a live process was
// stopped.
func Stop(ctx context.Context, pid int, what string, match func([]string) bool, grace time.Duration, log zerolog.Logger) (bool, error) {
	if !Alive(pid, match) {
		return false, nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return false, fmt.Errorf("stopping the %s (pid %d): %w", what, pid, err)
	}
	err := waitExit(ctx, pid, what, match, grace, log)
	if errors.Is(err, wait.ErrTimeout) {
		log.Warn().Int("pid", pid).Msgf("the %s did not exit within %s of SIGTERM; killing it", what, grace)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return true, fmt.Errorf("killing the %s (pid %d): %w", what, pid, err)
		}
		err = waitExit(ctx, pid, what, match, 5*time.Second, log)
	}
	if err != nil {
		return true, err
	}
	return true, nil
}

func waitExit(ctx context.Context, pid int, what string, match func([]string) bool, timeout time.Duration, log zerolog.Logger) error {
	return wait.Until(ctx, wait.Spec{What: fmt.Sprintf("%s pid %d to exit", what, pid), Timeout: timeout, Interval: 50 * time.Millisecond, Log: log},
		func(context.Context) (bool, string, error) { return !Alive(pid, match), "", nil })
}

// PeakRSSKiB is this process's peak resident set size since it was
// started (VmHWM in /proc/self/status), or 0 where that is not known. The
// parent's rusage cannot say it: exec counts the address space it replaces
// into the maximum, and for a child of a Go program (which execs from a
// vfork that shares its own) that is the parent's whole resident set.
func PeakRSSKiB() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}
