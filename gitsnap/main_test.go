package gitsnap

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/rs/zerolog"
)

// serveEnv switches the test binary into `bootstrap gitsnap serve`, so the
// detached-server tests run the real flag parsing and Serve in a child.
const (
	serveEnv      = "GITSNAP_TEST_SERVE"
	ignoreTermEnv = "GITSNAP_TEST_IGNORE_SIGTERM"
	// serveDelayEnv makes the test server wait this long before serving.
	serveDelayEnv  = "GITSNAP_TEST_SERVE_DELAY"
	requireLabEnv  = "BOOTSTRAP_REQUIRE_LAB"
	testRepoBranch = "main"
)

func TestMain(m *testing.M) {
	if os.Getenv(serveEnv) == "1" {
		os.Exit(serveMain(os.Args[1:]))
	}
	// Keep the developer's git config (and its excludes) out of the tests.
	home, err := os.MkdirTemp("", "gitsnap-home-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("HOME", home)
	os.Setenv("XDG_CONFIG_HOME", filepath.Join(home, ".config"))
	os.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	os.Setenv("GIT_TERMINAL_PROMPT", "0")
	// Run from a git hook, these would point the test's git commands at the caller's repository.
	for _, v := range []string{"GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR"} {
		os.Unsetenv(v)
	}
	code := m.Run()
	os.RemoveAll(home)
	os.Exit(code)
}

// serveMain mirrors what the CLI's `gitsnap serve` command does with ServeFlags.
func serveMain(args []string) int {
	flags, err := parseServeArgs(args)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	log := zerolog.New(os.Stderr).With().Timestamp().Logger()
	stopSignals := []os.Signal{syscall.SIGTERM, syscall.SIGINT}
	if os.Getenv(ignoreTermEnv) == "1" {
		signal.Ignore(syscall.SIGTERM)
		stopSignals = stopSignals[1:]
	}
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals...)
	defer stop()
	if d, err := time.ParseDuration(os.Getenv(serveDelayEnv)); err == nil {
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return 0
		}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	if err := Serve(ctx, flags, log, hup); err != nil {
		log.Error().Err(err).Msg("gitsnap serve failed")
		return 1
	}
	return 0
}

// parseServeArgs parses a `bootstrap` argv the way a kong CLI embedding ServeFlags does.
func parseServeArgs(args []string) (ServeFlags, error) {
	var cli struct {
		Gitsnap struct {
			Serve ServeFlags `cmd:""`
		} `cmd:""`
	}
	parser, err := kong.New(&cli, kong.Name("bootstrap"), kong.Exit(func(code int) { os.Exit(code) }))
	if err != nil {
		return ServeFlags{}, err
	}
	if _, err := parser.Parse(args); err != nil {
		return ServeFlags{}, err
	}
	return cli.Gitsnap.Serve, nil
}

func requireGit(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		if os.Getenv(requireLabEnv) == "1" {
			t.Fatalf("the git CLI is required (%s=1): %v", requireLabEnv, err)
		}
		t.Skipf("the git CLI is not installed: %v", err)
	}
}

// git runs the git CLI in dir and fails the test on error.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := gitErr(dir, args...)
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func gitErr(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"GIT_AUTHOR_NAME=test", "GIT_AUTHOR_EMAIL=test@example.invalid",
		"GIT_COMMITTER_NAME=test", "GIT_COMMITTER_EMAIL=test@example.invalid")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// gitWorkTree is a new git work tree (nothing committed) holding files,
// each 0644, by slash-separated path.
func gitWorkTree(t *testing.T, files map[string]string) string {
	t.Helper()
	requireGit(t)
	dir := t.TempDir()
	git(t, dir, "init", "-q", "-b", testRepoBranch)
	for p, c := range files {
		writeFile(t, dir, p, c, 0o644)
	}
	return dir
}

func writeFile(t *testing.T, root, rel, content string, perm os.FileMode) {
	t.Helper()
	p := filepath.Join(root, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, perm); err != nil {
		t.Fatal(err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// startServer serves a snapshot of dir on a loopback port until the test ends.
func startServer(t *testing.T, opts ServerOptions) (*Server, chan os.Signal) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if opts.URL == "" {
		opts.URL = "http://" + ln.Addr().String() + "/homelab.git"
	}
	srv, err := NewServer(context.Background(), opts)
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	refresh := make(chan os.Signal, 1)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, refresh) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return srv, refresh
}
