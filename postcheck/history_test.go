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
		`<a href="` + failing + `/postcheck.tar.gz">11-27<br>03:30</a>`,
		`href="#night-` + failing + `">FAIL</a>`,
		`<a id="night-` + failing + `"></a><b>nodes-ready</b>`,
		"2026, times in UTC",
		`title="2026-11-27 03:30 UTC: FAIL in 4.0 s"`,
		`<td id="cell-nodes-ready-` + failing + `" class="fail"`,
		`NotReady: wk-1 &lt;script&gt;`,
		"next: " + html.EscapeString(nextSteps[CheckNodesReady]),
		"The last 3 nights",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	// Newest first: the failing night's column comes before the others.
	if i, j := strings.Index(page, "11-27<br>03:30"), strings.Index(page, "11-25<br>03:30"); i < 0 || j < i {
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
	if cell == nil || cell[1] != "F" {
		t.Errorf("the failing cell as rendered: %v", cell)
	}
}

// Thirty nights with several kinds of failure fit a 1400 px window beside
// the check names, and a reason seen on many nights is listed once with
// the nights it was seen on. The browser lays the page out; a script the
// test adds to a copy of it (the page itself has none) measures.
func TestHistoryPageThirtyNightsInChromium(t *testing.T) {
	testbrowser.Binary(t)
	dir := t.TempDir()
	start := time.Date(2026, 11, 1, 3, 30, 0, 0, time.UTC)
	for i := range HistoryNights {
		at := start.Add(time.Duration(i) * 24 * time.Hour)
		var res []check.Result
		for _, name := range []string{CheckKubeconfig, CheckNodesReady, CheckDefaultClass, CheckFlux, CheckFluxObjects, CheckNFS, CheckEtcd,
			CheckTalosAPI, CheckTalosHealth, CheckTalosVersion, CheckKubeVersion, CheckCerts, CheckVMs, CheckEtcdBackup, CheckExtensions, CheckGuestAgent} {
			r := check.Result{Name: name, Status: check.Pass, Reason: "fine", Duration: 40 * time.Millisecond}
			switch {
			case name == CheckNFS && i >= 10 && i < 17: // the provisioner at 0 replicas for a week
				r.Status, r.Reason = check.Fail, "test PVC postcheck-x not Bound after 2m0s: phase Pending"
			case name == CheckEtcdBackup && i%9 == 4: // a receiver down some nights
				r.Status, r.Reason = check.Warn, "a copy in the bucket is named after now (s3://b/20990101T000000Z.snapshot)"
			case name == CheckVMs && i == 25:
				r.Status, r.Reason = check.Fail, "VM 102 cp-2 is stopped"
			}
			res = append(res, r)
		}
		rep := NewReport("homelab", at, 40*time.Second, res)
		js, err := rep.JSON()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := WriteArchive(dir, at, map[string][]byte{"report.json": js}); err != nil {
			t.Fatal(err)
		}
	}
	path, err := WriteHistory(dir, "homelab", start.Add(31*24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"11-11 03:30 – 11-17 03:30 (7 nights)",
		"11-05 03:30, 11-14 03:30, 11-23 03:30",
	} {
		if !strings.Contains(string(page), want) {
			t.Errorf("the page does not group a repeated reason as %q", want)
		}
	}
	if n := strings.Count(string(page), "not Bound after 2m0s"); n != 7+1 { // seven cell tooltips, one listing
		t.Errorf("the Pending reason appears %d times, want it listed once (and in its 7 cells' tooltips)", n)
	}
	measure := `<pre id="fit"></pre><script>
const w = window.innerWidth, names = document.querySelectorAll("th.check"), heads = document.querySelectorAll("thead th[id^=head-]");
let nameRight = 0; names.forEach(n => nameRight = Math.max(nameRight, n.getBoundingClientRect().right));
let out = [], inView = 0;
heads.forEach(h => { const r = h.getBoundingClientRect(); if (r.left >= nameRight - 1 && r.right <= w) inView++; });
document.getElementById("fit").textContent = "width=" + w + " columns=" + heads.length + " inview=" + inView + " names=" + Math.round(nameRight);
</script>`
	probe := filepath.Join(t.TempDir(), "probe.html")
	if err := os.WriteFile(probe, []byte(strings.Replace(string(page), "</body>", measure+"</body>", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	dom := testbrowser.DOMAt(t, probe, 1400, 900)
	m := regexp.MustCompile(`width=(\d+) columns=(\d+) inview=(\d+) names=(\d+)`).FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("the measuring script did not run:\n%s", dom)
	}
	if m[1] != "1400" || m[2] != "30" || m[3] != "30" {
		t.Errorf("at 1400 px: %s: every night's column should be in view beside the check names", m[0])
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

// A night that sent a notification is marked ✉ in its column's header, one
// whose send failed ✉!, each with a tooltip naming them, and a legend says
// what the markers mean; a page with no notification has neither.
func TestHistoryPageNotificationMarkers(t *testing.T) {
	dir := t.TempDir()
	failing := nightsIn(t, dir)
	now := time.Date(2026, 11, 28, 4, 0, 0, 0, time.UTC)
	path, err := WriteHistory(dir, "homelab", now)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); strings.Contains(string(b), "✉") {
		t.Error("a marker or legend on a page with no notification")
	}
	warned := "20261126T033000Z"
	if err := WriteNotified(filepath.Join(dir, warned, ArchiveName), Notified{Sent: []string{"notification 1 (ntfy)"}}); err != nil {
		t.Fatal(err)
	}
	if err := WriteNotified(filepath.Join(dir, failing, ArchiveName), Notified{Sent: []string{"notification 1 (ntfy)"}, Failed: []string{"notification 2 (smtp)"}}); err != nil {
		t.Fatal(err)
	}
	if err := WriteNotified(filepath.Join(dir, "20261125T033000Z", ArchiveName), Notified{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "20261125T033000Z", NotifiedFile)); !os.IsNotExist(err) {
		t.Errorf("a night that sent nothing has a record: %v", err)
	}
	if _, err := WriteHistory(dir, "homelab", now); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	head := func(night string) string {
		return regexp.MustCompile(`<th id="head-night-` + night + `"[^>]*>.*?</th>`).FindString(page)
	}
	if h := head(warned); !strings.Contains(h, `<span class="sent" title="sent: notification 1 (ntfy)">✉</span>`) {
		t.Errorf("the night that sent: %s", h)
	}
	if h := head(failing); !strings.Contains(h, `<span class="unsent" title="sent: notification 1 (ntfy); not sent (tried again the next night): notification 2 (smtp)">✉!</span>`) {
		t.Errorf("the night whose send failed: %s", h)
	}
	if h := head("20261125T033000Z"); h == "" || strings.Contains(h, "✉") {
		t.Errorf("the night that sent nothing: %s", h)
	}
	if !strings.Contains(page, `<p class="legend"><span class="sent">✉</span> the night sent a notification; <span class="unsent">✉!</span> a notification could not be sent`) {
		t.Error("no legend")
	}
}
