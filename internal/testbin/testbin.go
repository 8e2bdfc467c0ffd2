// Package testbin builds the real bootstrap command for tests that need it
// as a separate process (the detached git snapshot server, end-to-end runs).
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

var (
	once sync.Once
	path string
	err  error
)

// Bootstrap builds ./cmd/bootstrap once per test binary and returns its path.
func Bootstrap(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		// Into the module's git-ignored bin/, so runs do not pile up
		// copies in the temp directory.
		gomod, e := exec.Command("go", "env", "GOMOD").Output()
		if e != nil {
			err = e
			return
		}
		path = filepath.Join(filepath.Dir(strings.TrimSpace(string(gomod))), "bin", "test", fmt.Sprintf("bootstrap-%d", os.Getpid()))
		if e := os.MkdirAll(filepath.Dir(path), 0o755); e != nil {
			err = e
			return
		}
		removeStale(filepath.Dir(path))
		out, e := exec.Command("go", "build", "-o", path, "github.com/homelab/bootstrap/cmd/bootstrap").CombinedOutput()
		if e != nil {
			err = fmt.Errorf("building bootstrap: %v\n%s", e, out)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// removeStale deletes binaries of test processes that are gone.
func removeStale(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		pid, convErr := strconv.Atoi(strings.TrimPrefix(e.Name(), "bootstrap-"))
		if convErr != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) != nil {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
