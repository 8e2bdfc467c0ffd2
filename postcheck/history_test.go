package postcheck

import (
	"html"
	"image"
	"image/color"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/internal/testbrowser"
)

// nightsIn archives three nights under dir: a passing one, one with a
// warning, and a failing one (the newest), and returns the failing one's
// directory name.
func nightsIn(t *testing.T, dir string) string {
	t.Helper()
	start := time.Date(2026, 11, 25, 3, 30, 0, 0, time.UTC)
	var failing string
	for i, bad := range []check.Result{
		{},
		{Name: CheckCerts, Status: check.Warn, Reason: "talosconfig client cert expires 2026-12-05 (in 9 days)"},
		{Name: CheckNodesReady, Status: check.Fail, Reason: "3/4 Ready; NotReady: wk-1 <script>alert(1)</script>"},
	} {
		at := start.Add(time.Duration(i) * 24 * time.Hour)
		var res []check.Result
		for _, name := range []string{CheckKubeconfig, CheckNodesReady, CheckCerts, CheckEtcdBackup} {
			r := check.Result{Name: name, Status: check.Pass, Reason: "fine", Duration: 40 * time.Millisecond}
			if name == bad.Name {
				r = bad
			}
			res = append(res, r)
		}
		rep := NewReport("homelab", at, time.Duration(2+i)*time.Second, res)
		js, err := rep.JSON()
		if err != nil {
			t.Fatal(err)
		}
		path, err := WriteArchive(dir, at, map[string][]byte{"report.json": js})
		if err != nil {
			t.Fatal(err)
		}
		if bad.Status == check.Fail {
			failing = filepath.Base(filepath.Dir(path))
		}
	}
	// Not an archive: skipped.
	if err := os.MkdirAll(filepath.Join(dir, "20261101T000000Z"), 0o700); err != nil {
		t.Fatal(err)
	}
	return failing
}

// The history page is a static grid of checks by nights, newest first,
// each night linked to its archive and its rows; it loads nothing from
// anywhere and escapes what the reasons say.
func TestHistoryPage(t *testing.T) {
	dir := t.TempDir()
	failing := nightsIn(t, dir)
	path, err := WriteHistory(dir, "homelab", time.Date(2026, 11, 28, 4, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, want := range []string{
		`<a href="` + failing + `/postcheck.tar.gz">11-27 03:30</a>`,
		`href="#night-` + failing + `">rows</a>`,
		`<td id="cell-nodes-ready-` + failing + `" class="fail"`,
		`NotReady: wk-1 &lt;script&gt;`,
		"next: " + html.EscapeString(nextSteps[CheckNodesReady]),
		"4.0 s",
		"The last 3 nights",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	// Newest first: the failing night's column comes before the others.
	if i, j := strings.Index(page, "11-27 03:30"), strings.Index(page, "11-25 03:30"); i < 0 || j < i {
		t.Error("the nights are not newest first")
	}
	if regexp.MustCompile(`(?i)<script|<link|src=|@import|url\(|https?://`).MatchString(strings.ReplaceAll(page, "&lt;script&gt;", "")) {
		t.Errorf("the page loads something or runs a script:\n%s", page)
	}
}

// Rendered by a real browser: the screenshot has the window's size and
// shows the failing cell's colour, and the failing cell reads FAIL in the
// document the browser built.
func TestHistoryPageInChromium(t *testing.T) {
	testbrowser.Binary(t)
	dir := t.TempDir()
	failing := nightsIn(t, dir)
	path, err := WriteHistory(dir, "homelab", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	img := testbrowser.Screenshot(t, path, 1000, 700)
	if b := img.Bounds(); b.Dx() != 1000 || b.Dy() != 700 {
		t.Errorf("screenshot %v, want 1000×700", b)
	}
	if n := countColor(img, color.RGBA{0xc6, 0x28, 0x28, 0xff}); n < 100 {
		t.Errorf("%d pixels of the failing cell's red in the screenshot: the page did not render as styled", n)
	}
	dom := testbrowser.DOM(t, path)
	cell := regexp.MustCompile(`<td id="cell-nodes-ready-` + failing + `" class="fail"[^>]*>([^<]*)</td>`).FindStringSubmatch(dom)
	if cell == nil || cell[1] != "FAIL" {
		t.Errorf("the failing cell as rendered: %v", cell)
	}
}

// countColor counts the pixels within a small distance of c.
func countColor(img image.Image, c color.RGBA) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if near(r>>8, c.R) && near(g>>8, c.G) && near(bl>>8, c.B) {
				n++
			}
		}
	}
	return n
}

func near(a uint32, b uint8) bool { d := int(a) - int(b); return d > -8 && d < 8 }
