package gitsnap

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/transport"
	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/internal/fsutil"
	"github.com/homelab/bootstrap/internal/proc"
	"github.com/homelab/bootstrap/internal/wait"
)

// File names inside the state directory (ai/state/<cluster>/).
const (
	StateFileName = "gitsnap.json"
	LogFileName   = "gitsnap.log"
)

// ErrAlreadyRunning is returned by Start when the state directory records a
// live server.
var ErrAlreadyRunning = errors.New("a git snapshot server is already running")

// ServeFlags are the flags of `bootstrap gitsnap serve`. The CLI embeds this
// struct as its kong command, and Start builds the detached child's argv
// from it, so both always agree.
type ServeFlags struct {
	Repo      string        `help:"Work tree to snapshot." required:"" type:"existingdir"`
	Listen    string        `help:"Address to listen on (host:port), reachable from the cluster's pods." required:""`
	URL       string        `name:"url" help:"Clone URL to announce, as used by Flux's GitRepository." required:""`
	Branch    string        `help:"Branch the snapshot is published under." default:"main"`
	Interval  time.Duration `help:"Re-snapshot interval (0 disables; SIGHUP always re-snapshots)." default:"1m"`
	Exclude   []string      `help:"Extra gitignore-style pattern to leave out of the snapshot (repeatable)." sep:"none"`
	Path      string        `help:"Path Flux builds (flux.path): a snapshot that withholds a file the build reads there is refused, naming it. Default: the tree's root."`
	Plaintext []string      `name:"serve-plaintext" help:"Gitignore-style pattern of files served although they hold a plaintext Secret value (flux.localSnapshot.servePlaintext; repeatable)." sep:"none"`
	Tree      bool          `name:"serve-tree" help:"Serve every file git lists, not only what the build reads from --path (flux.localSnapshot.serve: tree)."`
	StateDir  string        `help:"State directory of a detached server (kept current by the server)." type:"path"`
	Protect   []string      `help:"Path never served, with everything under it and its .bak-* backups (repeatable): state, Talos files, credential files." sep:"none" type:"path"`
	AuthFile  string        `help:"File holding user:password (mode 0600) that clients must present with HTTP basic auth. Default: the credential in --state-dir (created once, 0600)." type:"path"`
	Anonymous bool          `help:"Serve without a credential, to anyone who can reach the port (needs no --auth-file)."`
	TLSCert   string        `name:"tls-cert" help:"Serve HTTPS with this PEM certificate (chain); --url must be https://." type:"path"`
	TLSKey    string        `name:"tls-key" help:"PEM private key of --tls-cert." type:"path"`
}

// Args is the argv of `bootstrap gitsnap serve` for these flags, without
// the program name.
func (f ServeFlags) Args() []string {
	args := []string{"gitsnap", "serve",
		"--repo=" + f.Repo,
		"--listen=" + f.Listen,
		"--url=" + f.URL,
		"--branch=" + f.branch(),
		"--interval=" + f.Interval.String(),
	}
	for _, e := range f.Exclude {
		args = append(args, "--exclude="+e)
	}
	if f.Path != "" {
		args = append(args, "--path="+f.Path)
	}
	for _, p := range f.Plaintext {
		args = append(args, "--serve-plaintext="+p)
	}
	if f.Tree {
		args = append(args, "--serve-tree")
	}
	for _, p := range f.Protect {
		args = append(args, "--protect="+p)
	}
	if f.Anonymous {
		args = append(args, "--anonymous")
	}
	if f.StateDir != "" {
		args = append(args, "--state-dir="+f.StateDir)
	}
	if f.AuthFile != "" {
		args = append(args, "--auth-file="+f.AuthFile)
	}
	if f.TLSCert != "" {
		args = append(args, "--tls-cert="+f.TLSCert, "--tls-key="+f.TLSKey)
	}
	return args
}

func (f ServeFlags) branch() string {
	if f.Branch == "" {
		return DefaultBranch
	}
	return f.Branch
}

// ServerOptions turns the flags into server options.
func (f ServeFlags) ServerOptions(log zerolog.Logger) ServerOptions {
	return ServerOptions{
		Build:    BuildOptions{Dir: f.Repo, Branch: f.branch(), Excludes: f.Exclude, Protect: f.Protect, FluxPath: f.Path, ServePlaintext: f.Plaintext, ServeWholeTree: f.Tree},
		Listen:   f.Listen,
		URL:      f.URL,
		Interval: f.Interval,
		StateDir: f.StateDir,
		Log:      log,
	}
}

// Serve is the body of `bootstrap gitsnap serve`: snapshot, serve until ctx
// ends (the CLI cancels it on SIGTERM/SIGINT), re-snapshot on every value
// from refresh (the CLI passes SIGHUP) and every interval.
func Serve(ctx context.Context, f ServeFlags, log zerolog.Logger, refresh <-chan os.Signal) error {
	opts := f.ServerOptions(log)
	switch {
	case f.Anonymous && f.AuthFile != "":
		return errors.New("--anonymous and --auth-file exclude each other: drop one")
	case f.Anonymous:
		log.Warn().Msg("--anonymous: anyone who can reach the port can clone the snapshot")
	case f.AuthFile != "":
		a, err := ReadAuth(f.AuthFile)
		if err != nil {
			return fmt.Errorf("reading the snapshot credential: %w", err)
		}
		opts.Auth = &a
	case f.StateDir != "":
		// Secure by default: the cluster's credential, as the flux stage
		// hands it to Flux.
		a, path, err := EnsureAuth(f.StateDir)
		if err != nil {
			return fmt.Errorf("the snapshot credential in %s: %w", f.StateDir, err)
		}
		log.Info().Str("auth_file", path).Msg("clients must present the credential in this file (user:password)")
		opts.Auth = &a
	default:
		return errors.New("gitsnap serve needs a credential: --auth-file FILE (user:password, 0600), or --state-dir DIR to use (or create) the cluster's credential there; --anonymous serves to anyone who can reach the port")
	}
	opts.TLSCert, opts.TLSKey = f.TLSCert, f.TLSKey
	srv, err := NewServer(ctx, opts)
	if err != nil {
		return err
	}
	if f.StateDir != "" {
		if os.Getenv(detachedEnv) == "1" {
			// Best effort: the starting run may not have recorded this
			// process yet (it records the hash itself once the server
			// answers).
			_ = recordWithheld(f.StateDir, os.Getpid(), withheldOrEmpty(srv.Snapshot()))
		} else if err := recordStandalone(f, opts, srv.Snapshot()); err != nil {
			log.Warn().Err(err).Msg("could not record this server in the state directory; gitsnap status and bootstrap status will not show it")
		}
	}
	defer func() {
		if f.StateDir != "" {
			removeStateIfOwned(f.StateDir, os.Getpid())
		}
	}()
	return srv.ListenAndServe(ctx, refresh)
}

// detachedEnv marks the server Start runs: Start records it itself. A
// server started any other way with --state-dir (a systemd unit, a shell)
// records itself as standalone.
const detachedEnv = "BOOTSTRAP_GITSNAP_DETACHED"

// recordStandalone records a server not started by Start in the state
// directory, so `gitsnap status` and `bootstrap status` show it, unless
// the directory records another live server.
func recordStandalone(f ServeFlags, opts ServerOptions, snap *Snapshot) error {
	if st, err := ReadState(f.StateDir); err != nil {
		return err
	} else if st != nil && st.PID != os.Getpid() && processAlive(st.PID) {
		return fmt.Errorf("%s records another live server (pid %d)", filepath.Join(f.StateDir, StateFileName), st.PID)
	}
	authFile := f.AuthFile
	if authFile == "" && !f.Anonymous {
		authFile = filepath.Join(f.StateDir, AuthFileName)
	}
	now := time.Now().UTC()
	return writeState(f.StateDir, &State{
		PID: os.Getpid(), Listen: f.Listen, URL: opts.URL, Hash: snap.Hash.String(), Branch: f.branch(), Repo: f.Repo,
		Interval: f.Interval, Excludes: f.Exclude, Protect: f.Protect, Path: f.Path, Plaintext: f.Plaintext,
		Withheld: withheldOrEmpty(snap), AuthFile: authFile, TLSCert: f.TLSCert, Standalone: true, StartedAt: now, UpdatedAt: now,
	})
}

// State is what the state directory records about a detached server.
type State struct {
	PID int `json:"pid"`
	// Standalone: the server was started outside bootstrap (gitsnap serve
	// --state-dir from a systemd unit or a shell) and recorded itself;
	// bootstrap never stops or replaces it.
	Standalone bool          `json:"standalone,omitempty"`
	Listen     string        `json:"listen"`
	URL        string        `json:"url"`
	Hash       string        `json:"hash"`
	Branch     string        `json:"branch"`
	Repo       string        `json:"repo"`
	Interval   time.Duration `json:"interval"`
	Excludes   []string      `json:"excludes,omitempty"`
	Protect    []string      `json:"protect,omitempty"`
	Path       string        `json:"path,omitempty"`
	// Plaintext is --serve-plaintext.
	Plaintext []string `json:"serve_plaintext,omitempty"`
	// Withheld names the files the served snapshot leaves out (paths and
	// rules, never content), kept current by the server.
	Withheld []Withheld `json:"withheld,omitempty"`
	// AuthFile is the credential file the server requires (its path, never
	// its content).
	AuthFile string `json:"auth_file,omitempty"`
	// TLSCert is the certificate the server presents (its path); probes
	// trust it.
	TLSCert   string    `json:"tls_cert,omitempty"`
	LogFile   string    `json:"log_file"`
	StartedAt time.Time `json:"started_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

func (s *State) sameServer(f ServeFlags) bool {
	return s.Repo == f.Repo && s.Listen == f.Listen && s.URL == f.URL && s.Branch == f.branch() &&
		s.Interval == f.Interval && slices.Equal(s.Excludes, f.Exclude) && slices.Equal(s.Protect, f.Protect) && s.AuthFile == f.AuthFile && s.TLSCert == f.TLSCert &&
		s.Path == f.Path && slices.Equal(s.Plaintext, f.Plaintext)
}

// ReadState returns the recorded server in stateDir, or nil if none is recorded.
func ReadState(stateDir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, StateFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading git snapshot server state: %w", err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", filepath.Join(stateDir, StateFileName), err)
	}
	return &st, nil
}

func writeState(stateDir string, st *State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteAtomic(filepath.Join(stateDir, StateFileName), append(b, '\n'), 0o600)
}

// recordRefresh updates the recorded hash (and, when not nil, the withheld
// files) if the state file describes pid.
func recordRefresh(stateDir string, pid int, hash string, withheld []Withheld) error {
	st, err := ReadState(stateDir)
	if err != nil || st == nil || st.PID != pid {
		return err
	}
	st.Hash, st.UpdatedAt = hash, time.Now().UTC()
	if withheld != nil {
		st.Withheld = withheld
	}
	return writeState(stateDir, st)
}

// recordWithheld records the withheld files of the served snapshot if
// the state file describes pid; the hash is left to the starting run.
func recordWithheld(stateDir string, pid int, withheld []Withheld) error {
	st, err := ReadState(stateDir)
	if err != nil || st == nil || st.PID != pid {
		return err
	}
	st.Withheld = withheld
	return writeState(stateDir, st)
}

func removeStateIfOwned(stateDir string, pid int) {
	if st, err := ReadState(stateDir); err == nil && st != nil && st.PID == pid {
		_ = os.Remove(filepath.Join(stateDir, StateFileName))
	}
}

// StartOptions configures a detached server.
type StartOptions struct {
	// Flags of the server; Repo is made absolute and StateDir is set to StateDir.
	Flags ServeFlags
	// StateDir holds the state file and the server's log (ai/state/<cluster>/).
	StateDir string
	// Executable is the bootstrap binary to run; os.Executable() if empty.
	Executable string
	// Env is added to the child's environment.
	Env []string
	// Timeout bounds waiting for the server to answer (default 30s) and, in
	// Ensure, for a refreshed server to serve the wanted hash.
	Timeout time.Duration
	// Log receives progress lines.
	Log zerolog.Logger
}

func (o *StartOptions) normalize() error {
	if o.StateDir == "" {
		return errors.New("git snapshot server: no state directory given")
	}
	repo, err := filepath.Abs(o.Flags.Repo)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", o.Flags.Repo, err)
	}
	o.Flags.Repo = repo
	o.Flags.Branch = o.Flags.branch()
	o.Flags.StateDir = o.StateDir
	if !o.Flags.Anonymous && o.Flags.AuthFile == "" {
		// The child would use the credential in the state directory; the
		// probes must present it too.
		_, path, err := EnsureAuth(o.StateDir)
		if err != nil {
			return fmt.Errorf("the snapshot credential: %w", err)
		}
		o.Flags.AuthFile = path
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("finding the bootstrap binary to run the git snapshot server: %w", err)
		}
		o.Executable = exe
	}
	if _, err := repoPathOf(o.Flags.URL); err != nil {
		return err
	}
	return nil
}

// Start runs `bootstrap gitsnap serve` as a detached child (its own session,
// so it outlives the caller and its terminal), waits until the URL answers
// with the branch, and records pid, listen address, URL and served hash in
// the state file (the pid as soon as the child runs, the hash once it
// answers). If the child exits or does not answer in time, the error
// quotes the end of its log.
func Start(ctx context.Context, opts StartOptions) (*State, error) {
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	if st, err := ReadState(opts.StateDir); err != nil {
		return nil, err
	} else if st != nil && processAlive(st.PID) {
		return nil, fmt.Errorf("%w (pid %d, %s)", ErrAlreadyRunning, st.PID, st.URL)
	}
	if err := os.MkdirAll(opts.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", opts.StateDir, err)
	}
	logPath := filepath.Join(opts.StateDir, LogFileName)
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the git snapshot server log: %w", err)
	}
	logStart, _ := logf.Seek(0, 2)

	cmd := exec.Command(opts.Executable, opts.Flags.Args()...)
	cmd.Dir = "/"
	cmd.Env = append(append(os.Environ(), opts.Env...), detachedEnv+"=1")
	cmd.Stdout, cmd.Stderr = logf, logf
	child, err := proc.StartDetached(cmd)
	logf.Close()
	if err != nil {
		return nil, fmt.Errorf("starting %s gitsnap serve: %w", opts.Executable, err)
	}
	pid := child.PID
	opts.Log.Info().Int("pid", pid).Str("url", opts.Flags.URL).Str("listen", opts.Flags.Listen).
		Str("log", logPath).Msg("started the git snapshot server")
	// Recorded at once, without a hash yet: a caller killed while it waits
	// below leaves a server that Stop can end and Ensure can adopt, not an
	// orphan answering at the URL that nothing knows to stop.
	now := time.Now().UTC()
	st := &State{
		PID: pid, Listen: opts.Flags.Listen, URL: opts.Flags.URL,
		Branch: opts.Flags.Branch, Repo: opts.Flags.Repo, Interval: opts.Flags.Interval,
		Excludes: opts.Flags.Exclude, Protect: opts.Flags.Protect, Path: opts.Flags.Path, Plaintext: opts.Flags.Plaintext,
		AuthFile: opts.Flags.AuthFile, TLSCert: opts.Flags.TLSCert, LogFile: logPath, StartedAt: now, UpdatedAt: now,
	}
	if err := writeState(opts.StateDir, st); err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("recording the git snapshot server: %w", err)
	}

	var hash plumbing.Hash
	// The child answers once its binary is loaded and it listens, tens of
	// milliseconds on a small host, and what the cluster is told to clone
	// waits for it: asked every 10 ms at first, seen at most that late.
	err = wait.Until(ctx, wait.Spec{What: "git snapshot server at " + opts.Flags.URL + " to answer", Timeout: opts.Timeout,
		Interval: 10 * time.Millisecond, MaxInterval: 50 * time.Millisecond, Log: opts.Log},
		func(ctx context.Context) (bool, string, error) {
			// A probe must not outlive the child: if it exits, say so at once.
			pctx, cancel := context.WithCancel(ctx)
			go func() {
				select {
				case <-child.Exited:
					cancel()
				case <-pctx.Done():
				}
			}()
			h, servedBy, err := probe(pctx, st.client(), opts.Flags.URL, opts.Flags.Branch, st.auth())
			cancel()
			select {
			case <-child.Exited:
				return false, "", fmt.Errorf("the git snapshot server (pid %d) exited: %v", pid, child.Err())
			default:
			}
			if err != nil {
				return false, err.Error(), nil
			}
			if servedBy != pid {
				return false, fmt.Sprintf("%s is answered by another process (pid %d)", opts.Flags.URL, servedBy), nil
			}
			hash = h
			return true, "", nil
		})
	if err != nil {
		_ = cmd.Process.Kill()
		removeStateIfOwned(opts.StateDir, pid)
		return nil, fmt.Errorf("%w%s", err, logTail(logPath, logStart))
	}
	st.Hash, st.UpdatedAt = hash.String(), time.Now().UTC()
	// The server recorded what it withholds before it answered.
	if cur, err := ReadState(opts.StateDir); err == nil && cur != nil && cur.PID == pid {
		st.Withheld = cur.Withheld
	}
	if err := writeState(opts.StateDir, st); err != nil {
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("recording the git snapshot server: %w", err)
	}
	opts.Log.Info().Int("pid", pid).Str("url", st.URL).Str("hash", st.Hash).Msg("git snapshot server is serving")
	return st, nil
}

// logTail returns the last lines the child wrote since offset, for errors.
func logTail(path string, offset int64) string {
	b, err := os.ReadFile(path)
	if err != nil || int64(len(b)) <= offset {
		return ""
	}
	b = bytes.TrimSpace(b[offset:])
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return "; server log:\n" + string(b)
}

// probeClient talks to the server directly: a proxy from the environment
// would answer for the LAN address or not at all.
var probeClient = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}

// Probe asks the git server at url for its refs, as `git ls-remote` does,
// presenting auth when not nil, and returns the commit of refs/heads/<branch>.
func Probe(ctx context.Context, url, branch string, auth *BasicAuth) (plumbing.Hash, error) {
	h, _, err := probe(ctx, probeClient, url, branch, auth)
	return h, err
}

// client is the HTTP client that reaches the recorded server: it trusts
// the server's own certificate when it serves HTTPS (a self-signed one is
// its own CA), and uses no proxy.
func (s *State) client() *http.Client {
	if s.TLSCert == "" {
		return probeClient
	}
	pool := x509.NewCertPool()
	if pem, err := os.ReadFile(s.TLSCert); err == nil {
		pool.AppendCertsFromPEM(pem)
	}
	return &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
}

// auth is the credential the recorded server requires, nil when it
// requires none or its file cannot be read (the probe then says 401).
func (s *State) auth() *BasicAuth {
	if s.AuthFile == "" {
		return nil
	}
	a, err := ReadAuth(s.AuthFile)
	if err != nil {
		return nil
	}
	return &a
}

// probe also returns the pid a gitsnap server reports in its answer (0 for
// other servers), so a recorded process is known to be the one answering.
func probe(ctx context.Context, client *http.Client, url, branch string, auth *BasicAuth) (plumbing.Hash, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		strings.TrimSuffix(url, "/")+"/info/refs?service="+transport.UploadPackServiceName, nil)
	if err != nil {
		return plumbing.ZeroHash, 0, err
	}
	auth.set(req)
	resp, err := client.Do(req)
	if err != nil {
		return plumbing.ZeroHash, 0, fmt.Errorf("listing refs at %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return plumbing.ZeroHash, 0, fmt.Errorf("listing refs at %s: HTTP %s", url, resp.Status)
	}
	ar := packp.NewAdvRefs()
	if err := ar.Decode(resp.Body); err != nil {
		return plumbing.ZeroHash, 0, fmt.Errorf("listing refs at %s: %w", url, err)
	}
	h, ok := ar.References[plumbing.NewBranchReferenceName(branch).String()]
	if !ok {
		return plumbing.ZeroHash, 0, fmt.Errorf("listing refs at %s: no branch %q", url, branch)
	}
	pid, _ := strconv.Atoi(resp.Header.Get(pidHeader))
	return h, pid, nil
}

// Status is what Check found about the recorded server.
type Status struct {
	// State is the recorded server, nil if none is recorded.
	State *State
	// Alive: the recorded pid is a live `gitsnap serve` process.
	Alive bool
	// ServedHash is what the recorded URL serves for the branch (zero if it
	// does not answer); ProbeError says why it did not.
	ServedHash plumbing.Hash
	ProbeError error
	// ServedByPID is the pid of the gitsnap server that answered (0 if none did).
	ServedByPID int
}

// Serves reports whether the recorded server is alive, is the process
// answering at its URL, and serves hash.
func (s Status) Serves(hash string) bool {
	return s.Alive && s.State != nil && s.ServedByPID == s.State.PID &&
		!s.ServedHash.IsZero() && s.ServedHash.String() == hash
}

// Check looks at the server recorded in stateDir: is its process alive and
// what does its URL serve.
func Check(ctx context.Context, stateDir string) (Status, error) {
	st, err := ReadState(stateDir)
	if err != nil || st == nil {
		return Status{}, err
	}
	out := Status{State: st, Alive: processAlive(st.PID)}
	out.ServedHash, out.ServedByPID, out.ProbeError = probe(ctx, st.client(), st.URL, st.Branch, st.auth())
	return out, nil
}

// Stop ends the server recorded in stateDir: SIGTERM, up to grace (default
// 10s) for it to exit, then SIGKILL. The state file is removed. It reports
// whether a live process was stopped.
func Stop(ctx context.Context, stateDir string, grace time.Duration, log zerolog.Logger) (bool, error) {
	st, err := ReadState(stateDir)
	if err != nil || st == nil {
		return false, err
	}
	if grace <= 0 {
		grace = 10 * time.Second
	}
	stopped, err := proc.Stop(ctx, st.PID, "git snapshot server", isServe, grace, log)
	if err != nil {
		return stopped, err
	}
	if stopped {
		log.Info().Int("pid", st.PID).Str("url", st.URL).Msg("stopped the git snapshot server")
	}
	if err := os.Remove(filepath.Join(stateDir, StateFileName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return stopped, fmt.Errorf("removing the git snapshot server state: %w", err)
	}
	return stopped, nil
}

// EnsureAction says what Ensure did.
type EnsureAction string

// What Ensure can do.
const (
	// EnsureReused: the recorded server already served the wanted hash.
	EnsureReused EnsureAction = "reused"
	// EnsureRefreshed: the recorded server was told to re-snapshot (SIGHUP).
	EnsureRefreshed EnsureAction = "refreshed"
	// EnsureRestarted: the recorded server had other settings and was replaced.
	EnsureRestarted EnsureAction = "restarted"
	// EnsureStarted: no server was running; one was started.
	EnsureStarted EnsureAction = "started"
	// EnsureExternal: a server not started by bootstrap (e.g. a systemd unit)
	// answers at the URL with the wanted hash; it is used as is.
	EnsureExternal EnsureAction = "external"
)

// Ensure makes a server with opts.Flags serve wantHash (the hash of a
// snapshot the caller just built with the same options): it reuses a live
// recorded server, refreshes it with SIGHUP if its hash is stale, replaces
// it if its settings differ, or starts one. A server it did not start that
// already answers at the URL is used only if it serves wantHash.
func Ensure(ctx context.Context, opts StartOptions, wantHash string) (*State, EnsureAction, error) {
	if err := opts.normalize(); err != nil {
		return nil, "", err
	}
	status, err := Check(ctx, opts.StateDir)
	if err != nil {
		return nil, "", err
	}
	if st := status.State; st != nil && status.Alive && st.Standalone {
		// Not ours to stop or replace: used as an external server is.
		if !status.Serves(wantHash) {
			return nil, "", fmt.Errorf("the standalone git snapshot server (pid %d, %s) serves %s, not the current snapshot %s: reload it (SIGHUP, or systemctl reload) or stop it", st.PID, st.URL, status.ServedHash, wantHash)
		}
		return st, EnsureExternal, nil
	}
	if st := status.State; st != nil && status.Alive {
		if !st.sameServer(opts.Flags) {
			opts.Log.Info().Int("pid", st.PID).Msg("the running git snapshot server has other settings; replacing it")
			if _, err := Stop(ctx, opts.StateDir, 0, opts.Log); err != nil {
				return nil, "", err
			}
			st, err := Start(ctx, opts)
			return st, EnsureRestarted, err
		}
		if status.ProbeError != nil {
			// Alive but not answering: a server whose starting run was
			// killed may still be starting. A SIGHUP now could end it before
			// it listens for one, so wait for it as Start would.
			if status, err = awaitAnswer(ctx, opts, st); err != nil {
				opts.Log.Warn().Err(err).Int("pid", st.PID).Msg("the recorded git snapshot server does not answer; replacing it")
				if _, err := Stop(ctx, opts.StateDir, 0, opts.Log); err != nil {
					return nil, "", err
				}
				st, err := Start(ctx, opts)
				return st, EnsureRestarted, err
			}
		}
		if status.Serves(wantHash) {
			if st.Hash != wantHash {
				// Recorded by a Start whose caller died before the server answered.
				st.Hash = wantHash
				if err := recordRefresh(opts.StateDir, st.PID, wantHash, nil); err != nil {
					return nil, "", fmt.Errorf("recording the git snapshot server: %w", err)
				}
			}
			return st, EnsureReused, nil
		}
		if err := refreshRunning(ctx, opts, st, wantHash); err != nil {
			return nil, "", err
		}
		st.Hash = wantHash
		return st, EnsureRefreshed, nil
	}
	if status.State != nil {
		_ = os.Remove(filepath.Join(opts.StateDir, StateFileName))
	}
	external := &State{AuthFile: opts.Flags.AuthFile, TLSCert: opts.Flags.TLSCert}
	if h, _, err := probe(ctx, external.client(), opts.Flags.URL, opts.Flags.Branch, external.auth()); err == nil {
		if h.String() != wantHash {
			return nil, "", fmt.Errorf("a git server not started by bootstrap answers at %s with %s, not the current snapshot %s: reload it (SIGHUP, or systemctl reload) or stop it", opts.Flags.URL, h, wantHash)
		}
		return &State{URL: opts.Flags.URL, Listen: opts.Flags.Listen, Branch: opts.Flags.Branch, Repo: opts.Flags.Repo, Hash: wantHash}, EnsureExternal, nil
	}
	st, err := Start(ctx, opts)
	return st, EnsureStarted, err
}

// awaitAnswer waits up to opts.Timeout for the recorded server st to answer
// at its URL itself, and returns what it serves.
func awaitAnswer(ctx context.Context, opts StartOptions, st *State) (Status, error) {
	out := Status{State: st, Alive: true}
	err := wait.Until(ctx, wait.Spec{What: fmt.Sprintf("git snapshot server (pid %d) at %s to answer", st.PID, st.URL), Timeout: opts.Timeout, Interval: 50 * time.Millisecond, Log: opts.Log},
		func(ctx context.Context) (bool, string, error) {
			if !processAlive(st.PID) {
				return false, "", fmt.Errorf("the git snapshot server (pid %d) exited", st.PID)
			}
			out.ServedHash, out.ServedByPID, out.ProbeError = probe(ctx, st.client(), st.URL, st.Branch, st.auth())
			if out.ProbeError != nil {
				return false, out.ProbeError.Error(), nil
			}
			if out.ServedByPID != st.PID {
				return false, "", fmt.Errorf("%s is answered by another process (pid %d)", st.URL, out.ServedByPID)
			}
			return true, "", nil
		})
	return out, err
}

func refreshRunning(ctx context.Context, opts StartOptions, st *State, wantHash string) error {
	opts.Log.Info().Int("pid", st.PID).Str("want", wantHash).Msg("asking the git snapshot server to re-snapshot")
	if err := syscall.Kill(st.PID, syscall.SIGHUP); err != nil {
		return fmt.Errorf("signalling the git snapshot server (pid %d): %w", st.PID, err)
	}
	return wait.Until(ctx, wait.Spec{What: fmt.Sprintf("git snapshot server at %s to serve %s", st.URL, wantHash), Timeout: opts.Timeout, Interval: 50 * time.Millisecond, Log: opts.Log},
		func(ctx context.Context) (bool, string, error) {
			h, _, err := probe(ctx, st.client(), st.URL, st.Branch, st.auth())
			if err != nil {
				return false, err.Error(), nil
			}
			return h.String() == wantHash, "serving " + h.String(), nil
		})
}

// isServe tells a `bootstrap gitsnap serve` process by its command line: a
// recorded pid reused by something else is not our server.
var isServe = proc.HasSubcommand("gitsnap", "serve")

// processAlive reports whether pid is a live `gitsnap serve` process.
func processAlive(pid int) bool { return proc.Alive(pid, isServe) }
