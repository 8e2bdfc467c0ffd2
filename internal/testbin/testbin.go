// Package testbin builds the real bootstrap commands for tests that need them
// as separate processes (end-to-end runs, the detached lab).
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

type build struct {
	once sync.Once
	path string
	err  error
}

var (
	mu     sync.Mutex
	builds = map[string]*build{}
)

// Bootstrap builds ./cmd/bootstrap once per test binary and returns its path.
func Bootstrap(t testing.TB) string {
	t.Helper()
	return Build(t, "bootstrap")
}

// Lab builds ./cmd/bootstrap-lab once per test binary and returns its path.
func Lab(t testing.TB) string {
	t.Helper()
	return Build(t, "bootstrap-lab")
}

// PrebuiltEnv names a directory holding the commands already built from
// this checkout (`make test` builds them once for every test package, which
// would otherwise each link its own); without it each test binary builds its
// own copy.
const PrebuiltEnv = "BOOTSTRAP_TEST_BIN"

// Build builds the command ./cmd/<name> of this module once per test binary
// and returns its path, or returns the one in $BOOTSTRAP_TEST_BIN.
func Build(t testing.TB, name string) string {
	t.Helper()
	if dir := os.Getenv(PrebuiltEnv); dir != "" {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("%s=%s: %v", PrebuiltEnv, dir, err)
		}
		return path
	}
	mu.Lock()
	b := builds[name]
	if b == nil {
		b = &build{}
		builds[name] = b
	}
	mu.Unlock()
	b.once.Do(func() { b.path, b.err = goBuild(name) })
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

func goBuild(name string) (string, error) {
	// Into the module's git-ignored bin/, so runs do not pile up copies in
	// the temp directory.
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(filepath.Dir(strings.TrimSpace(string(gomod))), "bin", "test")
	path := filepath.Join(dir, fmt.Sprintf("%s-%d", name, os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	removeStale(dir, name)
	out, err := exec.Command("go", "build", "-o", path, "github.com/homelab/bootstrap/cmd/"+name).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building %s: %v\n%s", name, err, out)
	}
	return path, nil
}

// removeStale deletes binaries of test processes that are gone.
func removeStale(dir, name string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		pid, convErr := strconv.Atoi(strings.TrimPrefix(e.Name(), name+"-"))
		if convErr != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) != nil {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
