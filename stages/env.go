package stages

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/talos"
	"github.com/homelab/bootstrap/ui"
)

// Env is everything a stage runs with. The runner owns it; a stage reads the
// config, reads and updates State.Outputs, and makes changes through Wet.
type Env struct {
	Config *config.Config
	Paths  config.Paths
	State  *state.State
	// Log carries stage=<name> while a stage runs.
	Log zerolog.Logger
	UI  *ui.Reporter
	// Out is where reports and tables meant for the user go (stdout).
	Out io.Writer
	// DryRun makes Wet record instead of act, and SaveState a no-op.
	DryRun bool
	// Secrets masks every secret the run learns (tokens, keys) in all output.
	Secrets *redact.Set
	// Options are run-wide flags from the command line.
	Options Options
	// Now is the clock (time.Now in production).
	Now func() time.Time
	// LogPath is this run's JSON log file ("" in a dry run).
	LogPath string
	// Warnings, when set, keeps the warn-level lines Log writes (the
	// logger's ui.Options.Warnings): the postcheck puts those logged while
	// its checks run on its rows.
	Warnings *ui.Warnings

	// run is the Env of the whole run when this one is a stage's view of
	// it (forStage): the view has its own Log, UI and stage, and shares
	// everything below with the run's. nil on the run's own Env.
	run *Env
	// stage names the stage this Env is the view of ("" outside one):
	// the changes made through it are that stage's.
	stage string

	// The run's shared part, used through shared(): a stage's view
	// leaves its own unused.
	mu      sync.Mutex
	changes []Change

	clientsMu sync.Mutex
	clients   map[string]any

	// prepared is the Preparers' background work, by key (under mu).
	prepared map[string]*background
	// prechecked, when not nil, is closed once the run's precheck has
	// passed: CPU work in the background waits for it (prepareCPU).
	prechecked chan struct{}
	// schematicMu makes the run's ensureSchematic calls one at a time.
	schematicMu sync.Mutex
	// cpuTail is closed when the CPU work prepared last has ended (under
	// mu): the next waits for it.
	cpuTail      chan struct{}
	precheckOnce sync.Once
	// boot is the run's boot choice (proxmox.boot), once made (under mu).
	boot *bootDecision
	// aheadWarned are the bucket copies named after now already warned
	// about in this run (under mu): a run lists the bucket more than once.
	aheadWarned map[string]bool
}

// shared is the Env holding the run's shared part: the run's own.
func (e *Env) shared() *Env {
	if e.run != nil {
		return e.run
	}
	return e
}

// forStage returns stage name's view of the run's Env: the same config,
// state, clients and background work; its own logger (log) and stage, so
// that stages running beside each other record and report as
// themselves.
func (e *Env) forStage(name string, log zerolog.Logger) *Env {
	return &Env{
		Config: e.Config, Paths: e.Paths, State: e.State, Log: log, UI: e.UI.With(log), Out: e.Out,
		DryRun: e.DryRun, Secrets: e.Secrets, Options: e.Options, Now: e.Now, LogPath: e.LogPath,
		Warnings: e.Warnings, run: e.shared(), stage: name,
	}
}

// inCheck returns the view of e for the check ctx runs (check.Name): its
// log lines carry check=<name>, so a warning logged through it lands on
// that check's row. Outside a check it is e.
func (e *Env) inCheck(ctx context.Context) *Env {
	name := check.Name(ctx)
	if name == "" {
		return e
	}
	return e.forStage(e.stage, e.Log.With().Str(ui.FieldCheck, name).Logger())
}

// withState runs fn on the run's state under the lock SaveState takes:
// a stage writing its outputs while another saves the state (stages that
// run beside each other) does so here.
func (e *Env) withState(fn func(*state.State)) {
	r := e.shared()
	r.mu.Lock()
	defer r.mu.Unlock()
	fn(e.State)
}

// Options are command-line switches that stages read.
type Options struct {
	// MergeConfigs merges talosconfig/kubeconfig into the user's home configs.
	MergeConfigs bool
	// AllowDowngrade lets the talos stage roll nodes back to an older Talos
	// or Kubernetes.
	AllowDowngrade bool
	// NewEtcd lets the talos stage bootstrap an empty etcd where an earlier
	// one was lost with its VMs (refused otherwise).
	NewEtcd bool
	// Recover makes the talos stage start etcd from a snapshot (bootstrap
	// restore).
	Recover *talos.Recovery
	// RecoverNode is the control plane a Recover starts etcd on (empty:
	// the one etcd was last bootstrapped or restored on, else the first).
	RecoverNode string
}

// Change is one mutation a stage made, or would make in a dry run.
type Change struct {
	Stage  string `json:"stage"`
	Action string `json:"action"`
}

// Wet performs a mutation. In a dry run it only records "would <action>";
// otherwise it reports the action, runs fn and records the change when fn
// succeeds. Safe for concurrent use by a stage's parallel workers.
func (e *Env) Wet(action string, fn func() error) error {
	if e.DryRun {
		e.UI.Would(action)
		e.record(action)
		return nil
	}
	e.UI.Change(action)
	if err := fn(); err != nil {
		return err
	}
	e.record(action)
	return nil
}

func (e *Env) record(action string) {
	r := e.shared()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.changes = append(r.changes, Change{Stage: e.stage, Action: action})
}

// Changes returns the changes recorded so far in this run.
func (e *Env) Changes() []Change {
	r := e.shared()
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Change(nil), r.changes...)
}

func (e *Env) changesOf(stage string) []string {
	var out []string
	for _, c := range e.Changes() {
		if c.Stage == stage {
			out = append(out, c.Action)
		}
	}
	return out
}

// SaveState persists the state now, so a crash later in the stage keeps what
// was learned (a created VM's id, an applied config). No-op in a dry run.
func (e *Env) SaveState() error {
	if e.DryRun {
		return nil
	}
	r := e.shared()
	r.mu.Lock()
	defer r.mu.Unlock()
	return e.State.Save(e.Paths.StateDir, e.now())
}

func (e *Env) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

// Node returns the recorded outputs for a node, creating the entry.
func (e *Env) Node(name string) state.Node {
	r := e.shared()
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.State.Outputs.Nodes == nil {
		e.State.Outputs.Nodes = map[string]state.Node{}
	}
	n := e.State.Outputs.Nodes[name]
	n.Name = name
	return n
}

// ForgetVM drops the recorded outputs of the node whose VM was vmid (the
// VM is gone); safe for parallel workers.
func (e *Env) ForgetVM(vmid int) {
	r := e.shared()
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, n := range e.State.Outputs.Nodes {
		if n.VMID == vmid {
			delete(e.State.Outputs.Nodes, name)
		}
	}
}

// forgetNode drops the recorded outputs of the node called name.
func (e *Env) forgetNode(name string) {
	r := e.shared()
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(e.State.Outputs.Nodes, name)
}

// SetNode records a node's outputs; safe for parallel workers.
func (e *Env) SetNode(n state.Node) {
	r := e.shared()
	r.mu.Lock()
	defer r.mu.Unlock()
	if e.State.Outputs.Nodes == nil {
		e.State.Outputs.Nodes = map[string]state.Node{}
	}
	e.State.Outputs.Nodes[n.Name] = n
}
