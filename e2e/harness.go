// Package e2e runs bootstrap the way a user does: the built binary, a
// config file, and the lab standing in for the N100 host. The lab runs in
// this process so that its counters (Proxmox calls, Talos applies and
// bootstraps, the API server's audit log, Helm releases) can be read
// between runs. The tests prove the pipeline end to end (convergence,
// no-op re-runs, kill and resume, faults, bad input); cmd/bench measures it.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/gitsnap"
	"github.com/homelab/bootstrap/lab"
	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/talossim"
	"github.com/homelab/bootstrap/stages"
	"github.com/homelab/bootstrap/state"
)

// Options shape a harness: a lab plus the binary that runs against it.
type Options struct {
	// Dir holds the lab (config, token file, NFS export, git tree), the
	// cluster's state and every run's output.
	Dir string
	// Binary is the bootstrap executable under test.
	Binary string
	// Lab sizing and timing (see lab.Options).
	ControlPlanes int
	Workers       int
	VIP           bool
	// ProxmoxHosts runs a Proxmox cluster of that many members (lab.Options).
	ProxmoxHosts int
	// ProxmoxHA turns on proxmox.ha (lab.Options).
	ProxmoxHA bool
	// ProxmoxWithoutPrivileges leaves privileges out of the lab token's
	// role (lab.Options).
	ProxmoxWithoutPrivileges []string
	// ProxmoxVersion is the pve-manager version the lab's Proxmox runs
	// (lab.Options; default 8.2.4).
	ProxmoxVersion string
	// ProxmoxImport and ProxmoxBoot: the 'import' content type on the
	// host's local storage, and proxmox.boot (lab.Options).
	ProxmoxImport bool
	ProxmoxBoot   string
	// CNI is flannel (default) or cilium (the real Cilium chart).
	CNI string
	// TalosVersion the nodes boot and the config names (lab.Options).
	TalosVersion string
	// KubernetesVersion the config names (lab.Options).
	KubernetesVersion string
	// FluxVersion the config names (lab.Options: the lab serves only the
	// default one).
	FluxVersion string
	// ServiceAccountKey the config names (lab.Options).
	ServiceAccountKey string
	Profile           string
	TimeScale         float64
	Seed              int64
	// BinDir holds the lab binaries (default kube.DefaultBinDir()).
	BinDir string
	// KeepKubeData keeps the control plane's data and server logs in
	// Dir/kube after Stop.
	KeepKubeData bool
	// OnNodeBoot sees every Talos node as its VM starts (to inject faults).
	OnNodeBoot func(*talossim.Node)
	// NodeMonitorGracePeriod is how long a node may miss heartbeats
	// before it turns NotReady (lab.Options; the lab's default when zero).
	NodeMonitorGracePeriod time.Duration
	// Log receives the lab's own lines (keep it out of a test's output:
	// a file is best).
	Log zerolog.Logger
}

// Harness is a running lab and the way to run bootstrap against it.
type Harness struct {
	Lab   *lab.Lab
	opts  Options
	cfg   *config.Config
	paths config.Paths

	mu   sync.Mutex
	runs int
}

// Start brings up a lab with an audit log for the harness.
func Start(ctx context.Context, o Options) (*Harness, error) {
	if o.Binary == "" {
		return nil, errors.New("e2e: Options.Binary is required")
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	kubeData := ""
	if o.KeepKubeData {
		kubeData = filepath.Join(o.Dir, "kube")
	}
	l, err := lab.Start(ctx, lab.Options{KubeDataDir: kubeData,
		Dir: filepath.Join(o.Dir, "lab"), ControlPlanes: o.ControlPlanes, Workers: o.Workers, VIP: o.VIP, ProxmoxHosts: o.ProxmoxHosts, ProxmoxHA: o.ProxmoxHA, ProxmoxWithoutPrivileges: o.ProxmoxWithoutPrivileges, ProxmoxVersion: o.ProxmoxVersion, ProxmoxImport: o.ProxmoxImport, ProxmoxBoot: o.ProxmoxBoot, CNI: o.CNI, TalosVersion: o.TalosVersion, KubernetesVersion: o.KubernetesVersion, FluxVersion: o.FluxVersion, ServiceAccountKey: o.ServiceAccountKey,
		Profile: o.Profile, TimeScale: o.TimeScale, Seed: o.Seed, BinDir: o.BinDir, Audit: true,
		OnNodeBoot: o.OnNodeBoot, Log: o.Log, NodeMonitorGracePeriod: o.NodeMonitorGracePeriod,
	})
	if err != nil {
		return nil, err
	}
	h := &Harness{Lab: l, opts: o}
	if err := h.reload(); err != nil {
		l.Stop()
		return nil, err
	}
	return h, nil
}

func (h *Harness) reload() error {
	cfg, err := config.Load(h.Lab.ConfigPath(), func(string) (string, bool) { return "", false })
	if err != nil {
		return fmt.Errorf("loading the lab's config: %w", err)
	}
	h.cfg, h.paths = cfg, cfg.Paths()
	return nil
}

// Stop stops the cluster's git snapshot server (started by the flux stage,
// it outlives bootstrap on purpose) and the lab.
func (h *Harness) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	_, serr := gitsnap.Stop(ctx, h.paths.StateDir, 5*time.Second, zerolog.Nop())
	return errors.Join(serr, h.Lab.Stop())
}

// Leftovers lists the processes still running with the harness directory in
// their command line ("pid: cmdline"): after Stop there must be none, or a
// run (or a run killed halfway) left something behind that nothing records.
func (h *Harness) Leftovers() []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(b, []byte(h.opts.Dir)) {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && bytes.Contains(st, []byte(") Z ")) {
			continue // a zombie: already exited
		}
		out = append(out, fmt.Sprintf("%d: %s", pid, strings.TrimSpace(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))))
	}
	return out
}

// Binary is the bootstrap executable under test.
func (h *Harness) Binary() string { return h.opts.Binary }

// ConfigPath is the cluster config the binary runs with.
func (h *Harness) ConfigPath() string { return h.Lab.ConfigPath() }

// Config is the loaded cluster config.
func (h *Harness) Config() *config.Config { return h.cfg }

// Paths are the cluster's resolved locations (state dir, Talos dir…).
func (h *Harness) Paths() config.Paths { return h.paths }

// EditConfig rewrites the cluster config's text (e.g. to set a key the lab
// does not write) and reloads it.
func (h *Harness) EditConfig(edit func(string) (string, error)) error {
	b, err := os.ReadFile(h.ConfigPath())
	if err != nil {
		return err
	}
	out, err := edit(string(b))
	if err != nil {
		return err
	}
	if err := os.WriteFile(h.ConfigPath(), []byte(out), 0o644); err != nil {
		return err
	}
	return h.reload()
}

// KillPoint says when to kill -9 a run, by the run's own progress rather
// than by the clock, so that where a kill lands does not depend on how busy
// the machine is: right after the Event-th progress event of Stage (0 is
// its header; see ProgressEvent), or at the stage's last event when it has
// fewer (a resumed stage skips what is done), or at the first event of a
// later stage when the run passes Stage without running it.
type KillPoint struct {
	Stage string
	Event int
}

func (k KillPoint) String() string {
	return fmt.Sprintf("%s#%d", k.Stage, k.Event)
}

// Event is one line of the binary's JSON log that marks progress.
type Event struct {
	// Stage is the stage the line names, or the one running when it names
	// none (some packages log without the stage field).
	Stage   string
	Message string
	// Header marks a stage's first line ("[3/6] talos"), StageEnd its last
	// ("talos done in …").
	Header, StageEnd bool
}

// ProgressEvent decodes a line of the binary's JSON log and reports
// whether it marks progress: every event except those a clock produces (a
// wait's periodic progress line, a poll that was not done yet, trace),
// whose number depends on how fast the machine is.
func ProgressEvent(line []byte) (Event, bool) {
	var ev struct {
		Stage    string          `json:"stage"`
		Message  string          `json:"message"`
		UI       string          `json:"ui"`
		StageEnd bool            `json:"stage_end"`
		Live     string          `json:"live"`
		Item     string          `json:"item"`
		Poll     json.RawMessage `json:"poll"`
		Level    string          `json:"level"`
	}
	if json.Unmarshal(line, &ev) != nil || ev.Level == "trace" || ev.Poll != nil || (ev.Live != "" && ev.Item == "") {
		return Event{}, false
	}
	return Event{Stage: ev.Stage, Message: ev.Message, Header: ev.UI == "header" && ev.Stage != "", StageEnd: ev.StageEnd}, true
}

// Result is one invocation of the binary.
type Result struct {
	Args     []string
	ExitCode int
	Wall     time.Duration
	// MaxRSSKiB is the process's peak resident set size.
	MaxRSSKiB int64
	Stdout    string
	// Stderr holds the log lines (JSON).
	Stderr string
	// Killed is true when the harness killed the process; KilledIn is the
	// stage that was running then, KilledAt the index of the progress event
	// the kill followed (KilledEvent its message) and KilledAfter how long
	// the stage had run.
	Killed      bool
	KilledIn    string
	KilledAt    int
	KilledEvent string
	KilledAfter time.Duration
	// Events are the run's progress events (see ProgressEvent), in order.
	Events []Event
	// Stages lists the stage headers the run printed, in order.
	Stages []string
	// Dir holds stdout.txt and stderr.log of this run.
	Dir string
}

// Tail returns the last n lines of the run's output, for failure messages.
func (r *Result) Tail(n int) string {
	return fmt.Sprintf("bootstrap %s → exit %d in %s\n--- stdout\n%s\n--- stderr (last %d lines)\n%s",
		strings.Join(r.Args, " "), r.ExitCode, r.Wall.Round(time.Millisecond), r.Stdout, n, lastLines(r.Stderr, n))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Run runs `bootstrap <args> --config <lab config> --log-format json`.
func (h *Harness) Run(ctx context.Context, args ...string) (*Result, error) {
	return h.RunKill(ctx, nil, args...)
}

// RunKill runs the binary like Run and, when kill is set, kills it with
// SIGKILL at that point of the pipeline (if the run gets there).
func (h *Harness) RunKill(ctx context.Context, kill *KillPoint, args ...string) (*Result, error) {
	return h.RunWith(ctx, RunOptions{Kill: kill}, args...)
}

// RunOptions are what RunWith does beside running the binary.
type RunOptions struct {
	// Kill, when set, kills the run with SIGKILL at that point.
	Kill *KillPoint
	// Debug logs at debug level, as a run with a kill point does (to count
	// the same progress events as one).
	Debug bool
	// OnStage is called as each stage starts.
	OnStage func(stage string)
	// Env is added to the run's environment (e.g. HOME for a run that
	// merges into the user's configs).
	Env []string
	// KillWhen, when set, kills the run with SIGKILL at the first progress
	// event it accepts, stage or not (for commands that run no stage).
	KillWhen func(Event) bool
	// OnEvent is called with each progress event as it is read, for a
	// test that acts while the run goes on.
	OnEvent func(Event)
}

// RunWith runs `bootstrap <args> --config <lab config> --log-format json`
// with the given options. A run with a kill point logs at debug level: its
// progress events are finer (each file written, each wait done).
func (h *Harness) RunWith(ctx context.Context, ro RunOptions, args ...string) (*Result, error) {
	kill := ro.Kill
	h.mu.Lock()
	h.runs++
	n := h.runs
	h.mu.Unlock()
	res := &Result{Args: args, Dir: filepath.Join(h.opts.Dir, "runs", fmt.Sprintf("%03d-%s", n, argsName(args)))}
	if err := os.MkdirAll(res.Dir, 0o755); err != nil {
		return nil, err
	}
	full := append(slices.Clone(args), "--config", h.ConfigPath(), "--log-format", "json")
	if kill != nil || ro.Debug {
		full = append(full, "--log-level", "debug")
	}
	cmd := exec.CommandContext(ctx, h.opts.Binary, full...)
	cmd.Dir = h.opts.Dir
	cmd.Env = append(h.childEnv(), ro.Env...)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderrPipe, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	errFile, err := os.Create(filepath.Join(res.Dir, "stderr.log"))
	if err != nil {
		return nil, err
	}
	defer errFile.Close()

	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", h.opts.Binary, err)
	}
	var (
		stderr  bytes.Buffer
		current string
		stageAt time.Time
		index   int
		killed  bool
	)
	sc := bufio.NewScanner(io.TeeReader(stderrPipe, errFile))
	sc.Buffer(make([]byte, 0, 64<<10), 8<<20)
	for sc.Scan() {
		line := sc.Bytes()
		stderr.Write(line)
		stderr.WriteByte('\n')
		ev, ok := ProgressEvent(line)
		if ok && ro.OnEvent != nil {
			ro.OnEvent(ev)
		}
		if ok && ro.KillWhen != nil && !killed && ro.KillWhen(ev) {
			killed = true
			if cmd.Process.Signal(syscall.SIGKILL) == nil {
				res.KilledIn, res.KilledEvent = current, ev.Message
			}
		}
		switch {
		case !ok:
			continue
		case ev.Header:
			current, stageAt, index = ev.Stage, time.Now(), 0
			res.Stages = append(res.Stages, ev.Stage)
			if ro.OnStage != nil {
				ro.OnStage(ev.Stage)
			}
		case current == "" || (ev.Stage != "" && ev.Stage != current):
			continue // before the first stage, or another stage's (none runs in parallel)
		default:
			ev.Stage = current
			index++
		}
		res.Events = append(res.Events, ev)
		if ev.StageEnd {
			// Lines after a stage's end and before the next header (the
			// run's own summary) belong to no stage.
			current = ""
		}
		if kill == nil || killed {
			continue
		}
		pos, want := stages.Position(ev.Stage), stages.Position(kill.Stage)
		if pos > want || (pos == want && (index >= kill.Event || ev.StageEnd)) {
			killed = true
			if cmd.Process.Signal(syscall.SIGKILL) == nil {
				res.KilledIn, res.KilledAt, res.KilledEvent, res.KilledAfter = ev.Stage, index, ev.Message, time.Since(stageAt)
			}
		}
	}
	werr := cmd.Wait()
	res.Wall = time.Since(start)
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	_ = os.WriteFile(filepath.Join(res.Dir, "stdout.txt"), stdout.Bytes(), 0o644)
	// The run reports its own peak (peak_rss_kib on its last line): the
	// rusage of a child of this process counts this process's resident
	// set too, which exec replaced (proc.PeakRSSKiB), so it is only the
	// fallback for commands that do not report one.
	if n := reportedPeakRSS(stderr.Bytes()); n > 0 {
		res.MaxRSSKiB = n
	} else if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		res.MaxRSSKiB = ru.Maxrss
	}
	res.ExitCode = cmd.ProcessState.ExitCode()
	var ee *exec.ExitError
	if werr != nil && !errors.As(werr, &ee) {
		return res, werr
	}
	// A kill that reached a process that had just exited changed nothing.
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
		res.Killed, res.ExitCode = true, -9
	} else {
		res.KilledIn, res.KilledAt, res.KilledEvent, res.KilledAfter = "", 0, "", 0
	}
	return res, nil
}

func argsName(args []string) string {
	s := strings.Join(args, "_")
	s = strings.NewReplacer("-", "", "/", "_", " ", "_").Replace(s)
	if len(s) > 40 {
		s = s[:40]
	}
	return s
}

// reportedPeakRSS is the peak_rss_kib a run logged at its end, or 0.
func reportedPeakRSS(stderr []byte) int64 {
	lines := bytes.Split(bytes.TrimSpace(stderr), []byte("\n"))
	for i := len(lines) - 1; i >= 0 && i >= len(lines)-5; i-- {
		var l struct {
			PeakRSSKiB int64 `json:"peak_rss_kib"`
		}
		if json.Unmarshal(lines[i], &l) == nil && l.PeakRSSKiB > 0 {
			return l.PeakRSSKiB
		}
	}
	return 0
}

// childEnv is this process's environment without anything that would
// change what the binary does (config overrides, a token, kubeconfigs),
// with Helm's directories and the user cache (Flux's rendered installs)
// inside the harness dir, so each harness's first run starts cold as on a
// new machine.
func (h *Harness) childEnv() []string {
	drop := []string{"PROXMOX_TOKEN_SECRET=", "TALOS_", "GIT_REPO=", "GIT_BRANCH=", "USE_LOCAL_GIT_SNAPSHOT=",
		"BOOTSTRAP_CONFIG=", "KUBECONFIG=", "TALOSCONFIG=", "HELM_", "XDG_CACHE_HOME="}
	var env []string
	for _, kv := range os.Environ() {
		if !slices.ContainsFunc(drop, func(p string) bool { return strings.HasPrefix(kv, p) }) {
			env = append(env, kv)
		}
	}
	helm := filepath.Join(h.opts.Dir, "helm")
	return append(env, "HELM_CACHE_HOME="+helm+"/cache", "HELM_CONFIG_HOME="+helm+"/config", "HELM_DATA_HOME="+helm+"/data",
		"XDG_CACHE_HOME="+filepath.Join(h.opts.Dir, "cache"))
}

// State reads the cluster's state.json.
func (h *Harness) State() (*state.State, error) {
	return state.Load(h.paths.StateDir, h.cfg.Cluster.Name)
}

// RunLogs returns the run logs (ai/state/<cluster>/runs/*/run.log), oldest
// first.
func (h *Harness) RunLogs() ([]string, error) {
	m, err := filepath.Glob(filepath.Join(h.paths.StateDir, state.RunsDirName, "*", "run.log"))
	slices.Sort(m)
	return m, err
}

// Counters is what the lab counted so far.
type Counters struct {
	// ProxmoxCalls counts every API request; ProxmoxMutating POST, PUT
	// and DELETE (logins excepted).
	ProxmoxCalls    int
	ProxmoxMutating int
	// ProxmoxList names the mutating calls ("POST /nodes/pve/qemu ×2").
	ProxmoxList []string
	// TalosCalls, TalosApplies (not dry runs) and TalosBootstraps
	// (accepted) summed over the nodes that run.
	TalosCalls      int
	TalosApplies    int
	TalosBootstraps int
	// EtcdBootstraps counts etcd clusters started, including second ones
	// (split brains), over every node that ever ran.
	EtcdBootstraps int
	// HelmReleases maps namespace/name to the latest revision and its status.
	HelmReleases map[string]HelmRelease
	// RunnerWrites are the API server writes (not dry runs) made with an
	// issued admin kubeconfig: the runner's.
	RunnerWrites []kube.AuditEvent
}

// HelmRelease is one release's latest revision as Helm stores it.
type HelmRelease struct {
	Revision int
	Status   string
	// Pending lists revisions in a pending-* state (history included).
	Pending []int
}

// Counters reads the lab's counters now.
func (h *Harness) Counters(ctx context.Context) (Counters, error) {
	l := h.Lab
	c := Counters{ProxmoxMutating: l.PVE.MutatingCalls(), ProxmoxList: l.PVE.MutatingCallList(), EtcdBootstraps: l.Talos.Bootstraps()}
	for _, v := range l.PVE.Counts() {
		c.ProxmoxCalls += v
	}
	for _, n := range l.Talos.Nodes() {
		nc := n.Counters()
		c.TalosCalls += nc.Calls
		c.TalosApplies += nc.Applies
		c.TalosBootstraps += nc.Bootstraps
	}
	evs, err := kube.ReadAuditLog(l.AuditLogPath())
	if err != nil {
		return c, err
	}
	for _, e := range evs {
		if e.User.Username == kube.AdminUser && !e.DryRun() {
			c.RunnerWrites = append(c.RunnerWrites, e)
		}
	}
	c.HelmReleases, err = h.helmReleases(ctx)
	return c, err
}

// helmReleases reads Helm's release records (Secrets owned by helm).
func (h *Harness) helmReleases(ctx context.Context) (map[string]HelmRelease, error) {
	out := map[string]HelmRelease{}
	kc, err := h.Lab.Kube.Cluster()
	if err != nil {
		return out, nil // not bootstrapped yet: no releases
	}
	list, err := kc.Client().CoreV1().Secrets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm"})
	if err != nil {
		return nil, fmt.Errorf("listing Helm release secrets: %w", err)
	}
	for _, s := range list.Items {
		key := s.Namespace + "/" + s.Labels["name"]
		rel := out[key]
		var rev int
		fmt.Sscan(s.Labels["version"], &rev)
		st := s.Labels["status"]
		if strings.HasPrefix(st, "pending") {
			rel.Pending = append(rel.Pending, rev)
		}
		if rev > rel.Revision {
			rel.Revision, rel.Status = rev, st
		}
		out[key] = rel
	}
	return out, nil
}

// NewWrites returns the runner's writes made since before was read.
func (c Counters) NewWrites(before Counters) []kube.AuditEvent {
	if len(c.RunnerWrites) < len(before.RunnerWrites) {
		return c.RunnerWrites
	}
	return c.RunnerWrites[len(before.RunnerWrites):]
}

// IsPostcheckPVC tells the postcheck's own test PVC (its create and
// delete) from any other write.
func IsPostcheckPVC(e kube.AuditEvent) bool {
	return e.ObjectRef.Resource == "persistentvolumeclaims" && e.ObjectRef.Namespace == stages.NFSNamespace &&
		strings.HasPrefix(e.ObjectRef.Name, "postcheck-") && (e.Verb == "create" || e.Verb == "delete")
}

// PostcheckGreen says whether the last postcheck recorded in state passed
// (warnings allowed) with every stage of the pipeline ok.
func (h *Harness) PostcheckGreen() error {
	st, err := h.State()
	if err != nil {
		return err
	}
	for _, name := range stages.Order {
		if s := st.Stage(name).EffectiveStatus(); s != state.OK {
			return fmt.Errorf("stage %s is %s", name, s)
		}
	}
	pc := st.Outputs.Postcheck
	if pc == nil {
		return errors.New("no postcheck recorded")
	}
	if pc.Failed != 0 || pc.Overall != "pass" && pc.Overall != "warn" {
		return fmt.Errorf("postcheck %s: %d passed, %d warned, %d failed", pc.Overall, pc.Passed, pc.Warned, pc.Failed)
	}
	return nil
}

// PVCs lists the claims in the postcheck's namespace (the test PVC must
// not be left behind).
func (h *Harness) PVCs(ctx context.Context) ([]corev1.PersistentVolumeClaim, error) {
	kc, err := h.Lab.Kube.Cluster()
	if err != nil {
		return nil, err
	}
	l, err := kc.Client().CoreV1().PersistentVolumeClaims(stages.NFSNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}
