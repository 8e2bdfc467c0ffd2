// Package testbrowser renders a page in a real browser for tests: headless
// Chromium (Debian's chromium package, which make deps installs), run as
// CI runs it (as root, so without its sandbox; the machine's network is
// closed, so with everything that would call out switched off), with a
// fresh profile each time.
package testbrowser

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Binary is the Chromium on PATH; without it the test fails when
// BOOTSTRAP_REQUIRE_LAB=1 (make test) and is skipped otherwise.
func Binary(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("BOOTSTRAP_REQUIRE_LAB") == "1" {
		t.Fatal("chromium is not installed: make deps installs it (Debian package chromium)")
	}
	t.Skip("chromium is not installed (make deps installs it)")
	return ""
}

func args(t testing.TB, extra ...string) []string {
	return append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--disable-extensions", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir()}, extra...)
}

func run(t testing.TB, a []string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, Binary(t), a...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", a, err, stderr.String())
	}
	return stdout.Bytes()
}

// Screenshot renders the page at path in a window of w×h pixels and
// returns the screenshot.
func Screenshot(t testing.TB, path string, w, h int) image.Image {
	t.Helper()
	out := filepath.Join(t.TempDir(), "screenshot.png")
	run(t, args(t, "--window-size="+strconv.Itoa(w)+","+strconv.Itoa(h), "--screenshot="+out, "file://"+path))
	f, err := os.Open(out)
	if err != nil {
		t.Fatalf("chromium wrote no screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	return img
}

// DOM is the page's document as the browser built it (after parsing and
// rendering), serialized.
func DOM(t testing.TB, path string) string {
	t.Helper()
	return string(run(t, args(t, "--dump-dom", "file://"+path)))
}

// DOMAt is DOM with the page laid out in a window of w×h pixels, after its
// scripts ran: a test's own script can measure the layout into the
// document.
func DOMAt(t testing.TB, path string, w, h int) string {
	t.Helper()
	return string(run(t, args(t, "--window-size="+strconv.Itoa(w)+","+strconv.Itoa(h), "--virtual-time-budget=2000", "--dump-dom", "file://"+path)))
}
