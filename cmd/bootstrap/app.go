package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/alecthomas/kong"
	"github.com/posener/complete"
	"github.com/rs/zerolog"
	"github.com/willabides/kongplete"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/notify"
	"github.com/homelab/bootstrap/stages"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/ui"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

// CLI is the command line.
type CLI struct {
	Config    string `short:"c" default:"bootstrap.yaml" env:"BOOTSTRAP_CONFIG" help:"Cluster config file." placeholder:"FILE"`
	LogFormat string `default:"auto" enum:"auto,console,json" help:"Log format on stderr: auto (console on a terminal, JSON otherwise), console, json."`
	LogLevel  string `default:"info" enum:"debug,info,warn,error" help:"Minimum level on stderr (the run log always keeps debug)."`

	Run         RunCmd         `cmd:"" help:"Run pipeline stages: precheck, provision, talos, infra, flux, postcheck."`
	Status      StatusCmd      `cmd:"" help:"Show each stage's last outcome, the cluster's recorded outputs and what to run next."`
	Destroy     DestroyCmd     `cmd:"" help:"Stop and delete this cluster's VMs (only those tagged bootstrap-<cluster>)."`
	Backup      BackupCmd      `cmd:"" help:"Take, verify and keep an etcd snapshot now (ai/state/<cluster>/etcd)."`
	Restore     RestoreCmd     `cmd:"" help:"Start a cluster whose etcd was lost from an etcd snapshot, then run the postcheck."`
	Node        NodeCmd        `cmd:"" help:"Day-two changes to one node: remove a node that left the config."`
	Cfg         ConfigCmd      `cmd:"" name:"config" help:"Write, validate or describe the config file."`
	Gitsnap     GitsnapCmd     `cmd:"" help:"The local git snapshot server Flux pulls from (flux.localSnapshot)."`
	Secrets     SecretsCmd     `cmd:"" help:"The cluster's secrets bundle at rest (SOPS with age)."`
	Talosconfig TalosconfigCmd `cmd:"" help:"Print the cluster's talosconfig (opened in memory when kept age-encrypted): talosctl --talosconfig <(bootstrap talosconfig) …"`
	Kubeconfig  KubeconfigCmd  `cmd:"" help:"Print the cluster's admin kubeconfig (opened in memory when kept age-encrypted): kubectl --kubeconfig <(bootstrap kubeconfig) …"`
	Handover    HandoverCmd    `cmd:"" help:"Print Flux HelmRepository and HelmRelease objects that adopt the Helm releases the infra stage installed, as installed; commit them under flux.path and the infra stage only verifies those releases."`

	InstallCompletions kongplete.InstallCompletions `cmd:"" help:"Print the shell snippet that enables tab completion (eval it in your shell's rc file)."`
	Version            VersionCmd                   `cmd:"" help:"Print the version."`
}

// App holds what commands need from the process; tests build their own.
type App struct {
	Stdout, Stderr io.Writer
	// Stdin answers confirmation prompts; nil means there is no terminal.
	Stdin     io.Reader
	LookupEnv config.LookupEnv
	// Stages returns the registered (implemented) stages in pipeline order.
	Stages func() []stages.Stage
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	cli  CLI
	args []string
}

func (a *App) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// Main parses args, runs the command and returns the exit code.
func (a *App) Main(ctx context.Context, args []string) (code int) {
	a.args = args
	a.cli = CLI{}
	exited := -1
	parser, err := newParser(&a.cli,
		kong.Writers(a.Stdout, a.Stderr),
		kong.Exit(func(c int) { exited = c; panic(exitPanic{}) }),
	)
	if err != nil {
		fmt.Fprintln(a.Stderr, "bootstrap:", err)
		return stages.ExitFailed
	}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(exitPanic); ok {
				code = exited
				return
			}
			panic(r)
		}
	}()
	// Answers the shell's tab completion (COMP_LINE set) and exits.
	kongplete.Complete(parser,
		kongplete.WithPredictor("file", complete.PredictFiles("*")),
		kongplete.WithPredictor("stage", complete.PredictSet(append([]string{stages.All}, stages.Order...)...)))
	kctx, err := parser.Parse(args)
	if err != nil {
		// A flag's value may be a secret pasted in the wrong place.
		fmt.Fprintln(a.Stderr, "bootstrap:", redact.Text(err.Error()))
		return stages.ExitUsage
	}
	kctx.BindTo(ctx, (*context.Context)(nil))
	err = kctx.Run(a)
	return a.exitCode(err)
}

// newParser builds the command-line parser for cli.
func newParser(cli *CLI, opts ...kong.Option) (*kong.Kong, error) {
	return kong.New(cli, append([]kong.Option{
		kong.Name("bootstrap"),
		kong.Description("Take a bare Proxmox host to a healthy Talos Kubernetes cluster managed by Flux."),
		kong.UsageOnError(),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true}),
		kong.Vars{"stages": strings.Join(stages.Order, ", ")},
	}, opts...)...)
}

// exitPanic unwinds kong's Exit (help, --version) back into Main.
type exitPanic struct{}

func (a *App) exitCode(err error) int {
	if err == nil {
		return stages.ExitOK
	}
	var nothing *stages.ErrNothingToResume
	if errors.As(err, &nothing) {
		fmt.Fprintln(a.Stderr, "bootstrap:", redact.Text(err.Error()))
		return stages.ExitOK
	}
	var silent silentError
	if !errors.As(err, &silent) {
		// The last line of every failed command: masked like a log line.
		fmt.Fprintln(a.Stderr, "bootstrap:", redact.Text(err.Error()))
	}
	return stages.ExitCode(err)
}

// silentError carries an exit status whose message was already shown.
type silentError struct{ err error }

func (s silentError) Error() string { return s.err.Error() }
func (s silentError) Unwrap() error { return s.err }

// loadConfig loads and validates the config; problems are user errors.
func (a *App) loadConfig() (*config.Config, error) {
	return config.Load(a.cli.Config, a.LookupEnv)
}

// configAndLog loads the config and a console logger, for commands that
// take no lock and write no run log.
func (a *App) configAndLog() (*config.Config, zerolog.Logger, error) {
	cfg, err := a.loadConfig()
	if err != nil {
		return nil, zerolog.Nop(), err
	}
	log, err := a.logger(nil, secretsOf(cfg), nil)
	return cfg, log, err
}

// secretsOf is the set of values masked in every output of a command on
// cfg: the Proxmox token secret and what the credential files the config
// names hold (config.CredentialValues). Stages add what they learn.
func secretsOf(cfg *config.Config) *redact.Set {
	s := &redact.Set{}
	if cfg == nil {
		return s
	}
	if v, err := cfg.ProxmoxTokenSecret(); err == nil {
		s.Add(v)
	}
	for _, v := range cfg.CredentialValues() {
		s.Add(v)
	}
	// Notification URLs (from a file or the environment) carry their
	// services' credentials: exactly those parts are masked.
	if urls, err := cfg.NotifyURLs(); err == nil {
		for _, u := range urls {
			for _, v := range notify.Secrets(u) {
				// A path token equal to the cluster's name would mask
				// the name in every line: it is no secret then.
				if v != cfg.Cluster.Name {
					s.Add(v)
				}
			}
		}
	}
	// Validate refuses these; masked too for whatever prints the config
	// before or without validating it.
	for _, v := range cfg.MisplacedSecrets() {
		s.Add(v)
	}
	return s
}

// logger builds the process logger; file, when set, gets the full JSON log
// and warnings, when set, the warn-level lines (ui.Options.Warnings).
func (a *App) logger(file io.Writer, secrets *redact.Set, warnings *ui.Warnings) (zerolog.Logger, error) {
	log, err := ui.NewLogger(ui.Options{Format: a.cli.LogFormat, Level: a.cli.LogLevel, Out: a.Stderr, File: file, Redact: secrets, Warnings: warnings})
	if err != nil {
		return log, config.Userf("%v", err)
	}
	return log, nil
}

func (a *App) commandLine() string {
	return strings.Join(append([]string{"bootstrap"}, a.args...), " ")
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

// session is a command holding the cluster lock with its run log open: the
// state read under the lock and a logger that also writes the run log.
type session struct {
	lock    *state.Lock
	file    *os.File
	State   *state.State
	Log     zerolog.Logger
	LogPath string
	RunID   string
	// Warnings keeps the warn-level lines Log writes (stages.Env.Warnings).
	Warnings *ui.Warnings
}

// commandEnv builds the Env of a command that may change the cluster. A
// dry run reads the state and logs to stderr only: no lock, no log file.
// Otherwise the cluster lock is taken and a run log opened (the returned
// session; the caller closes it).
func (a *App) commandEnv(cfg *config.Config, dryRun bool) (*stages.Env, *session, error) {
	secrets := secretsOf(cfg)
	// The plan, the check tables and the diffs go to stdout: masked like the log.
	env := &stages.Env{Config: cfg, Paths: cfg.Paths(), Out: secrets.Writer(a.Stdout), DryRun: dryRun, Secrets: secrets, Now: a.Now}
	if dryRun {
		st, err := state.Load(env.Paths.StateDir, cfg.Cluster.Name)
		if err != nil {
			return nil, nil, err
		}
		env.Warnings = &ui.Warnings{}
		log, err := a.logger(nil, secrets, env.Warnings)
		if err != nil {
			return nil, nil, err
		}
		env.State, env.Log, env.UI = st, log, ui.NewReporter(log)
		return env, nil, nil
	}
	sess, err := a.lockAndLog(cfg, secrets)
	if err != nil {
		return nil, nil, err
	}
	env.State, env.Log, env.UI, env.LogPath, env.Warnings = sess.State, sess.Log, ui.NewReporter(sess.Log), sess.LogPath, sess.Warnings
	return env, sess, nil
}

// lockAndLog takes the cluster lock (a *state.LockedError when held),
// re-reads the state under it, opens runs/<UTC-timestamp>/run.log and
// prunes run logs beyond state.keepRuns.
func (a *App) lockAndLog(cfg *config.Config, secrets *redact.Set) (*session, error) {
	paths := cfg.Paths()
	lock, err := state.Acquire(paths.StateDir, state.Holder{PID: os.Getpid(), Command: a.commandLine(), Started: a.now().UTC(), Host: hostname()})
	if err != nil {
		return nil, err
	}
	s := &session{lock: lock}
	fail := func(err error) (*session, error) {
		s.Close()
		return nil, err
	}
	if s.State, err = state.Load(paths.StateDir, cfg.Cluster.Name); err != nil {
		return fail(err)
	}
	runDir, err := state.NewRunDir(paths.StateDir, a.now())
	if err != nil {
		return fail(err)
	}
	s.RunID, s.LogPath = filepath.Base(runDir), filepath.Join(runDir, "run.log")
	if s.file, err = os.OpenFile(s.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600); err != nil {
		return fail(err)
	}
	s.Warnings = &ui.Warnings{}
	if s.Log, err = a.logger(s.file, secrets, s.Warnings); err != nil {
		return fail(err)
	}
	if removed, err := state.KeepNewest(filepath.Join(paths.StateDir, state.RunsDirName), cfg.State.KeepRuns); err != nil {
		s.Log.Warn().Err(err).Msg("pruning old run logs")
	} else if len(removed) > 0 {
		s.Log.Debug().Strs("removed", removed).Msg("pruned old run logs")
	}
	return s, nil
}

// Close closes the run log and releases the lock.
func (s *session) Close() {
	if s.file != nil {
		s.file.Close()
	}
	s.lock.Release()
}
