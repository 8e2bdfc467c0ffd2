package pvesim

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

type task struct {
	upid    string
	node    string
	typ     string
	id      string
	user    string
	tokenID string
	pid     int
	pstart  int
	start   time.Time

	// fault is an injected exit status that replaces the task's work.
	fault string

	mu    sync.Mutex
	done  bool
	exit  string
	end   time.Time
	lines []string
}

// injected returns the task-error fault injected for this task, if any.
// Each worker asks at the point where the real task would fail, so a
// failing create still cleans up like PVE does.
func (t *task) injected() error {
	if t.fault == "" {
		return nil
	}
	return errors.New(t.fault)
}

func (t *task) logf(format string, a ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, fmt.Sprintf(format, a...))
}

// startTask forks a worker like PVE's fork_worker and returns its UPID. The
// worker's error text becomes the exit status; a task-error fault on the
// request replaces the work.
func (s *Server) startTask(r *request, typ, id string, work func(ctx context.Context, t *task) error) string {
	return s.startTaskOn(r, s.node.Name, typ, id, work)
}

// startTaskOn starts a task on node (another cluster node's guests: see
// other.go); its UPID names that node.
func (s *Server) startTaskOn(r *request, node, typ, id string, work func(ctx context.Context, t *task) error) string {
	s.mu.Lock()
	s.pid++
	pid := s.pid
	s.mu.Unlock()
	now := time.Now()
	user := r.who.user
	t := &task{
		node:   node,
		typ:    typ,
		id:     id,
		user:   user,
		pid:    pid,
		pstart: int(now.Sub(s.bootTime) / (10 * time.Millisecond)),
		start:  now,
		fault:  r.taskFault,
	}
	if r.who.tokenID != "" {
		_, t.tokenID, _ = strings.Cut(r.who.tokenID, "!")
	}
	ident := r.who.name()
	t.upid = fmt.Sprintf("UPID:%s:%08X:%08X:%08X:%s:%s:%s:", node, pid, t.pstart, now.Unix(), typ, id, ident)
	s.mu.Lock()
	s.tasks[t.upid] = t
	s.mu.Unlock()

	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := work(s.ctx, t)
		exit := "OK"
		if err != nil {
			exit = strings.TrimSpace(strings.SplitN(strings.TrimSpace(err.Error()), "\n", 2)[0])
			t.logf("TASK ERROR: %s", exit)
		} else {
			t.logf("TASK OK")
		}
		t.mu.Lock()
		t.done, t.exit, t.end = true, exit, time.Now()
		t.mu.Unlock()
		s.log.Debug().Str("upid", t.upid).Str("exitstatus", exit).Dur("took", time.Since(now)).Msg("pvesim task finished")
	}()
	return t.upid
}

func (s *Server) taskByUPID(r *request, upid string) (*task, *apiError) {
	s.mu.Lock()
	t := s.tasks[upid]
	s.mu.Unlock()
	if t == nil {
		if !strings.HasPrefix(upid, "UPID:") {
			return nil, paramErr(map[string]string{"upid": "value does not match the regex pattern"})
		}
		// raise_param_exc (pve-manager PVE/API2/Tasks.pm): a 400.
		return nil, paramErr(map[string]string{"upid": "no such task"})
	}
	if t.user != r.who.user || (r.who.tokenID != "" && t.user+"!"+t.tokenID != r.who.tokenID) {
		if err := r.who.check("/nodes/"+t.node, "Sys.Audit"); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func (s *Server) taskStatus(r *request, upid string) (any, *apiError) {
	t, err := s.taskByUPID(r, upid)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]any{
		"upid":      t.upid,
		"node":      t.node,
		"pid":       t.pid,
		"pstart":    t.pstart,
		"starttime": t.start.Unix(),
		"type":      t.typ,
		"id":        t.id,
		"user":      t.user,
		"status":    "running",
	}
	if t.tokenID != "" {
		out["tokenid"] = t.tokenID
	}
	if t.done {
		out["status"] = "stopped"
		out["exitstatus"] = t.exit
		out["endtime"] = t.end.Unix()
	}
	return out, nil
}

func (s *Server) taskLog(r *request, upid string) (any, *apiError) {
	t, err := s.taskByUPID(r, upid)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]any, 0, len(t.lines))
	for i, l := range t.lines {
		out = append(out, map[string]any{"n": i + 1, "t": l})
	}
	return out, nil
}

// TaskCount counts tasks of a type ("qmcreate", "qmstart", ...) started so
// far; "" counts all.
func (s *Server) TaskCount(typ string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, t := range s.tasks {
		if typ == "" || t.typ == typ {
			n++
		}
	}
	return n
}

// Span is when a task ran.
type Span struct{ Start, End time.Time }

// tasksOf lists the tasks of a type, in the order they started.
func (s *Server) tasksOf(typ string) []*task {
	s.mu.Lock()
	tasks := make([]*task, 0, len(s.tasks))
	for _, t := range s.tasks {
		if t.typ == typ {
			tasks = append(tasks, t)
		}
	}
	s.mu.Unlock()
	sort.Slice(tasks, func(i, j int) bool { return tasks[i].start.Before(tasks[j].start) })
	return tasks
}

// TaskSpans returns when each finished task of a type ran on this host.
func (s *Server) TaskSpans(typ string) []Span {
	var out []Span
	for _, t := range s.tasksOf(typ) {
		t.mu.Lock()
		if t.done {
			out = append(out, Span{t.start, t.end})
		}
		t.mu.Unlock()
	}
	return out
}

// TaskDurations returns how long each finished task of a type ran
// ("download", "qmcreate"), as this host ran it: the profile's time plus
// the simulator's own work (a download-url task also fetches and hashes
// the file), which a benchmark counts as the hardware's, not the runner's.
func (s *Server) TaskDurations(typ string) []time.Duration {
	var out []time.Duration
	for _, sp := range s.TaskSpans(typ) {
		out = append(out, sp.End.Sub(sp.Start))
	}
	return out
}

// TaskExits returns the exit status of each finished task of a type, in
// the order they started.
func (s *Server) TaskExits(typ string) []string {
	var out []string
	for _, t := range s.tasksOf(typ) {
		t.mu.Lock()
		if t.done {
			out = append(out, t.exit)
		}
		t.mu.Unlock()
	}
	return out
}

// RunningTasks counts the tasks of a type that have not ended yet.
func (s *Server) RunningTasks(typ string) int {
	n := 0
	for _, t := range s.tasksOf(typ) {
		t.mu.Lock()
		if !t.done {
			n++
		}
		t.mu.Unlock()
	}
	return n
}
