package postcheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/internal/fsutil"
)

// HistoryPage is the history page's file name inside the postcheck
// directory (ai/state/<cluster>/postcheck/index.html).
const HistoryPage = "index.html"

// HistoryNights is how many nights the page shows.
const HistoryNights = 30

// Night is one archived postcheck as the history page shows it.
type Night struct {
	// Dir is the archive's directory name (its UTC timestamp), Archive
	// the archive's path relative to the page.
	Dir, Archive string
	Report       Report
	// Notified is what the night sent (nil when it sent nothing).
	Notified *Notified
}

// NotifiedFile is written beside a night's archive once its notifications
// went out (they go after the archive is written, and name it).
const NotifiedFile = "notified.json"

// Notified is what a night's notifications did, by notify.Label.
type Notified struct {
	Sent   []string `json:"sent,omitempty"`
	Failed []string `json:"failed,omitempty"`
}

// WriteNotified records n beside the archive at archive (WriteArchive's
// path), for the history page; nothing when nothing was sent.
func WriteNotified(archive string, n Notified) error {
	if len(n.Sent) == 0 && len(n.Failed) == 0 {
		return nil
	}
	b, err := json.MarshalIndent(n, "", "  ")
	if err != nil {
		return err
	}
	return fsutil.WriteAtomic(filepath.Join(filepath.Dir(archive), NotifiedFile), append(b, '\n'), 0o600)
}

// ReadNights reads report.json from the newest n archives under dir,
// newest first. An archive that cannot be read is skipped: the page shows
// what can be shown.
func ReadNights(dir string, n int) ([]Night, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", dir, err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(names)))
	var out []Night
	for _, name := range names {
		if len(out) == n {
			break
		}
		files, err := ReadArchive(filepath.Join(dir, name, ArchiveName))
		if err != nil {
			continue
		}
		var r Report
		if json.Unmarshal(files["report.json"], &r) != nil {
			continue
		}
		night := Night{Dir: name, Archive: name + "/" + ArchiveName, Report: r}
		if b, err := os.ReadFile(filepath.Join(dir, name, NotifiedFile)); err == nil {
			var n Notified
			if json.Unmarshal(b, &n) == nil {
				night.Notified = &n
			}
		}
		out = append(out, night)
	}
	return out, nil
}

// WriteHistory rewrites dir/index.html from the newest HistoryNights
// archives in dir and returns its path.
func WriteHistory(dir, cluster string, now time.Time) (string, error) {
	nights, err := ReadNights(dir, HistoryNights)
	if err != nil {
		return "", err
	}
	page, err := RenderHistory(cluster, nights, now)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, HistoryPage)
	if err := fsutil.WriteAtomic(path, page, 0o600); err != nil {
		return "", fmt.Errorf("writing the history page: %w", err)
	}
	return path, nil
}

// RenderHistory is the page: a grid of checks (rows) by nights (columns,
// newest first; each headed by its date and time, verdict and duration,
// linked to its archive and to its rows below, and marked when the night
// sent a notification or failed to), each cell the check's
// status that night with its reason as a tooltip; then what did not pass,
// each distinct reason once with the nights it was seen on. Static: no
// script, no external asset, inline style only.
//
// The grid is sized for 30 nights beside the check names at 1400 px: a
// night's column is a few characters wide (date over time, a one-letter
// verdict), and the names stay in view when the grid scrolls sideways.
func RenderHistory(cluster string, nights []Night, now time.Time) ([]byte, error) {
	type cell struct {
		ID, Class, Text, Title string
	}
	type row struct {
		Check string
		Cells []cell
	}
	// seen is a reason that did not pass, with the nights it was seen on.
	type seen struct {
		Name, Next string
		Status     check.Status
		Reason     string
		nights     []int // column indexes, newest first
		Anchors    []string
		Nights     string
	}
	var cols []historyCol
	mailed := false // a night has a notification marker: the legend says what it means
	var order []string
	known := map[string]bool{}
	var reasons []*seen
	byReason := map[string]*seen{}
	anchored := map[string]bool{}
	for i, n := range nights {
		at := n.Report.Started.UTC()
		c := historyCol{ID: "night-" + n.Dir, Archive: n.Archive, Day: at.Format("01-02"), Time: at.Format("15:04"), Full: at.Format("2006-01-02 15:04 MST"),
			Overall: strings.ToUpper(string(n.Report.Overall)), Class: string(n.Report.Overall), Duration: fmt.Sprintf("%.1f s", n.Report.DurationSeconds)}
		if nf := n.Notified; nf != nil {
			var said []string
			if len(nf.Sent) > 0 {
				c.Mail, c.MailClass = "✉", "sent"
				said = append(said, "sent: "+strings.Join(nf.Sent, ", "))
			}
			if len(nf.Failed) > 0 {
				c.Mail, c.MailClass = "✉!", "unsent"
				said = append(said, "not sent (tried again the next night): "+strings.Join(nf.Failed, ", "))
			}
			c.MailTitle = strings.Join(said, "; ")
			mailed = mailed || c.Mail != ""
		}
		for _, ch := range n.Report.Checks {
			if !known[ch.Name] {
				known[ch.Name] = true
				order = append(order, ch.Name)
			}
			if ch.Status == check.Pass {
				continue
			}
			c.Bad = true
			key := ch.Name + "\x00" + string(ch.Status) + "\x00" + ch.Reason
			r := byReason[key]
			if r == nil {
				r = &seen{Name: ch.Name, Next: ch.Next, Status: ch.Status, Reason: ch.Reason}
				byReason[key] = r
				reasons = append(reasons, r)
			}
			r.nights = append(r.nights, i)
			// A night's "rows" link lands on the first reason it shows.
			if !anchored[c.ID] {
				anchored[c.ID] = true
				r.Anchors = append(r.Anchors, c.ID)
			}
		}
		cols = append(cols, c)
	}
	for _, r := range reasons {
		r.Nights = nightRanges(r.nights, cols)
	}
	var rows []row
	for _, name := range order {
		r := row{Check: name}
		for _, n := range nights {
			c := cell{ID: "cell-" + name + "-" + n.Dir, Class: "none", Text: "–", Title: "not checked that night"}
			for _, ch := range n.Report.Checks {
				if ch.Name != name {
					continue
				}
				c.Class, c.Title = string(ch.Status), fmt.Sprintf("%s (%.1f s): %s", strings.ToUpper(string(ch.Status)), ch.DurationSeconds, ch.Reason)
				switch ch.Status {
				case check.Pass:
					c.Text = "✓"
				case check.Warn:
					c.Text = "W"
				default:
					c.Text = "F"
				}
			}
			r.Cells = append(r.Cells, c)
		}
		rows = append(rows, r)
	}
	var years []string
	for _, n := range nights {
		if y := n.Report.Started.UTC().Format("2006"); !slices.Contains(years, y) {
			years = append(years, y)
		}
	}
	slices.Sort(years)
	var b bytes.Buffer
	err := historyTemplate.Execute(&b, map[string]any{"Cluster": cluster, "Cols": cols, "Rows": rows, "N": len(nights),
		"Reasons": reasons, "Mailed": mailed, "Years": strings.Join(years, "–"), "Generated": now.UTC().Format("2006-01-02 15:04 MST")})
	return b.Bytes(), err
}

// historyCol is one night's column of the history page.
type historyCol struct {
	ID, Archive, Day, Time, Full, Overall, Class, Duration string
	// Bad: the night has rows that did not pass.
	Bad bool
	// Mail marks a night that sent a notification ("✉") or failed to
	// ("✉!"); MailTitle names them, MailClass styles the marker.
	Mail, MailTitle, MailClass string
}

// nightRanges names the nights at the column indexes idx (newest first)
// as runs of consecutive columns, oldest first: "11-20 03:30 – 11-27 03:30
// (8 nights), 11-29 03:30".
func nightRanges(idx []int, cols []historyCol) string {
	var parts []string
	for end := len(idx) - 1; end >= 0; {
		start := end
		for start > 0 && idx[start-1] == idx[start]-1 {
			start--
		}
		older, newer := cols[idx[end]], cols[idx[start]]
		if start == end {
			parts = append(parts, older.Day+" "+older.Time)
		} else {
			parts = append(parts, fmt.Sprintf("%s %s – %s %s (%d nights)", older.Day, older.Time, newer.Day, newer.Time, end-start+1))
		}
		end = start - 1
	}
	return strings.Join(parts, ", ")
}

var historyTemplate = template.Must(template.New("history").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Nightly postcheck of {{.Cluster}}</title>
<style>
body { font: 14px/1.4 "DejaVu Sans", Verdana, sans-serif; margin: 1.5em; color: #1b1b1b; background: #fff; }
h1 { font-size: 1.4em; margin: 0 0 .3em; }
p.sub { color: #555; margin: 0 0 1em; }
div.scroll { overflow-x: auto; }
table.grid { border-collapse: separate; border-spacing: 0; }
table.grid th, table.grid td { border: 1px solid #d0d0d0; border-width: 0 1px 1px 0; padding: 2px 3px; text-align: center; white-space: nowrap; font-size: 12px; }
table.grid th.check { position: sticky; left: 0; z-index: 1; background: #fff; text-align: left; font-weight: normal; font-family: "DejaVu Sans Mono", monospace; border-left-width: 1px; padding: 2px 6px; }
table.grid thead th { font-weight: normal; font-size: 11px; vertical-align: bottom; border-top-width: 1px; line-height: 1.25; }
table.grid td { min-width: 2.2em; }
td.pass { background: #e3f4e1; color: #1e6b1e; }
td.warn { background: #fff1c2; color: #7a5600; font-weight: bold; }
td.fail { background: #c62828; color: #fff; font-weight: bold; }
td.none { background: #f4f4f4; color: #999; }
span.pass { color: #1e6b1e; } span.warn { color: #7a5600; font-weight: bold; } span.fail { color: #c62828; font-weight: bold; }
ul.seen li { margin: .4em 0; }
li.fail b { color: #c62828; } li.warn b { color: #7a5600; }
.nights { color: #444; }
span.sent { color: #1b4f9c; } span.unsent { color: #c62828; font-weight: bold; }
p.legend { color: #444; font-size: 12px; margin: .5em 0 0; }
.next { color: #444; font-family: "DejaVu Sans Mono", monospace; font-size: 12px; }
</style>
</head>
<body>
<h1>Nightly postcheck of {{.Cluster}}</h1>
<p class="sub">The last {{.N}} nights kept under this directory, newest first{{if .Years}}: {{.Years}}, times in UTC{{end}}. Written by bootstrap at {{.Generated}}. Each night links to its archive, and to what did not pass below; a cell's tooltip holds its reason.</p>
{{if .Cols}}<div class="scroll"><table class="grid">
<thead><tr><th class="check">check</th>{{range .Cols}}<th id="head-{{.ID}}" title="{{.Full}}: {{.Overall}} in {{.Duration}}"><a href="{{.Archive}}">{{.Day}}<br>{{.Time}}</a><br><span class="{{.Class}}">{{if .Bad}}<a href="#{{.ID}}">{{.Overall}}</a>{{else}}{{.Overall}}{{end}}</span>{{if .Mail}}<br><span class="{{.MailClass}}" title="{{.MailTitle}}">{{.Mail}}</span>{{end}}</th>{{end}}</tr></thead>
<tbody>
{{range .Rows}}<tr><th class="check">{{.Check}}</th>{{range .Cells}}<td id="{{.ID}}" class="{{.Class}}" title="{{.Title}}">{{.Text}}</td>{{end}}</tr>
{{end}}</tbody>
</table></div>
{{if .Mailed}}<p class="legend"><span class="sent">✉</span> the night sent a notification; <span class="unsent">✉!</span> a notification could not be sent (it is sent again the next night); the marker's tooltip names them.</p>
{{end}}{{if .Reasons}}<h2>What did not pass</h2>
<ul class="seen">{{range .Reasons}}<li class="{{.Status}}">{{range .Anchors}}<a id="{{.}}"></a>{{end}}<b>{{.Name}}</b> {{.Status}}: {{.Reason}}<br><span class="nights">{{.Nights}}</span>{{if .Next}}<br><span class="next">next: {{.Next}}</span>{{end}}</li>
{{end}}</ul>{{end}}{{else}}<p>No archived night yet.</p>{{end}}
</body>
</html>
`))
