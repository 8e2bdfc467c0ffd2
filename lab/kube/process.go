package kube

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"time"
)

// process is one lab server running as a child process in its own process
// group, its stdout and stderr going to a log file.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string

	done    chan struct{} // closed once the process has been reaped
	mu      sync.Mutex
	exitErr error
}

// Process describes a running lab server.
type Process struct {
	Name    string
	PID     int
	LogPath string
}

// spawner starts child processes from one OS thread that stays alive, locked,
// for the lab's lifetime. The kernel's parent-death signal fires when the
// thread that forked a child exits, not the process, so forking from
// arbitrary Go threads could kill children whenever the runtime retires a
// thread; this way it fires only when the lab (or the whole program) ends.
type spawner struct {
	reqs chan spawnReq
	quit chan struct{}
	done chan struct{}
}

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan spawnReq), quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		// Never unlocked: when this goroutine returns the thread exits with
		// it, which is what delivers the parent-death signal to stragglers.
		runtime.LockOSThread()
		defer close(s.done)
		for {
			select {
			case r := <-s.reqs:
				r.err <- r.cmd.Start()
			case <-s.quit:
				return
			}
		}
	}()
	return s
}

func (s *spawner) start(cmd *exec.Cmd) error {
	r := spawnReq{cmd: cmd, err: make(chan error, 1)}
	select {
	case s.reqs <- r:
		return <-r.err
	case <-s.done:
		return errors.New("lab is stopping")
	}
}

func (s *spawner) close() {
	select {
	case <-s.quit:
	default:
		close(s.quit)
	}
	<-s.done
}

// startProcess runs bin with args (and extra environment) from the spawner,
// logging to logPath.
func startProcess(sp *spawner, name, bin string, args, env []string, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("starting %s: opening its log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = sysProcAttr()
	if err := sp.start(cmd); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		logFile.Close()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.exitErr == nil {
			return true, fmt.Errorf("%s exited", p.name)
		}
		return true, fmt.Errorf("%s exited: %w", p.name, p.exitErr)
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group, then SIGKILL after grace, and
// waits until the process has been reaped.
func (p *process) stop(grace time.Duration) error {
	pid := p.cmd.Process.Pid
	if done, _ := p.exited(); !done {
		_ = signalGroup(pid, sigTerm)
		t := time.NewTimer(grace)
		select {
		case <-p.done:
			t.Stop()
		case <-t.C:
			_ = signalGroup(pid, sigKill)
		}
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("stopping %s (pid %d): still running 10s after SIGKILL", p.name, pid)
	}
	// Anything the server itself started is in its group: make sure it goes too.
	_ = signalGroup(pid, sigKill)
	return nil
}

// tail returns up to the last n lines of the process log.
func (p *process) tail(n int) string { return tailFile(p.logPath, n) }

func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	data = bytes.TrimRight(data, "\n")
	lines := strings.Split(string(data), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
