package postcheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"os"
	"path/filepath"
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
		out = append(out, Night{Dir: name, Archive: name + "/" + ArchiveName, Report: r})
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
// newest first; each headed by its time, verdict and duration, linked to
// its archive and to its rows below), each cell the check's status that
// night with its reason as a tooltip; then, per night, the rows that did
// not pass with their reasons and what to do next. Static: no script, no
// external asset, inline style only.
func RenderHistory(cluster string, nights []Night, now time.Time) ([]byte, error) {
	type cell struct {
		ID, Class, Text, Title string
	}
	type row struct {
		Check string
		Cells []cell
	}
	type col struct {
		ID, Archive, When, Overall, Class, Duration string
		Bad                                         []CheckReport
	}
	var cols []col
	var order []string
	seen := map[string]bool{}
	for _, n := range nights {
		c := col{ID: "night-" + n.Dir, Archive: n.Archive, When: n.Report.Started.UTC().Format("01-02 15:04"),
			Overall: strings.ToUpper(string(n.Report.Overall)), Class: string(n.Report.Overall), Duration: fmt.Sprintf("%.1f s", n.Report.DurationSeconds)}
		for _, ch := range n.Report.Checks {
			if !seen[ch.Name] {
				seen[ch.Name] = true
				order = append(order, ch.Name)
			}
			if ch.Status != check.Pass {
				c.Bad = append(c.Bad, ch)
			}
		}
		cols = append(cols, c)
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
					c.Text = "warn"
				default:
					c.Text = "FAIL"
				}
			}
			r.Cells = append(r.Cells, c)
		}
		rows = append(rows, r)
	}
	var b bytes.Buffer
	err := historyTemplate.Execute(&b, map[string]any{"Cluster": cluster, "Cols": cols, "Rows": rows, "N": len(nights),
		"Generated": now.UTC().Format("2006-01-02 15:04 MST")})
	return b.Bytes(), err
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
table.grid { border-collapse: collapse; }
table.grid th, table.grid td { border: 1px solid #d0d0d0; padding: 3px 6px; text-align: center; white-space: nowrap; }
table.grid th.check { text-align: left; font-weight: normal; font-family: "DejaVu Sans Mono", monospace; }
table.grid thead th { font-weight: normal; font-size: 12px; vertical-align: bottom; }
td.pass { background: #e3f4e1; color: #1e6b1e; }
td.warn { background: #fff1c2; color: #7a5600; font-weight: bold; }
td.fail { background: #c62828; color: #fff; font-weight: bold; }
td.none { background: #f4f4f4; color: #999; }
span.pass { color: #1e6b1e; } span.warn { color: #7a5600; font-weight: bold; } span.fail { color: #c62828; font-weight: bold; }
section.night { margin: 1em 0; }
section.night h3 { font-size: 1em; margin: .3em 0; }
li.fail b { color: #c62828; } li.warn b { color: #7a5600; }
.next { color: #444; font-family: "DejaVu Sans Mono", monospace; font-size: 12px; }
</style>
</head>
<body>
<h1>Nightly postcheck of {{.Cluster}}</h1>
<p class="sub">The last {{.N}} nights kept under this directory, newest first. Written by bootstrap at {{.Generated}}; each night links to its archive and to its rows that did not pass.</p>
{{if .Cols}}<table class="grid">
<thead><tr><th class="check">check</th>{{range .Cols}}<th id="head-{{.ID}}"><a href="{{.Archive}}">{{.When}}</a><br><span class="{{.Class}}">{{.Overall}}</span><br>{{.Duration}}{{if .Bad}}<br><a href="#{{.ID}}">rows</a>{{end}}</th>{{end}}</tr></thead>
<tbody>
{{range .Rows}}<tr><th class="check">{{.Check}}</th>{{range .Cells}}<td id="{{.ID}}" class="{{.Class}}" title="{{.Title}}">{{.Text}}</td>{{end}}</tr>
{{end}}</tbody>
</table>
{{range .Cols}}{{if .Bad}}<section class="night" id="{{.ID}}">
<h3>{{.When}} UTC: <span class="{{.Class}}">{{.Overall}}</span> in {{.Duration}}, <a href="{{.Archive}}">archive</a></h3>
<ul>{{range .Bad}}<li class="{{.Status}}"><b>{{.Name}}</b> {{.Status}}: {{.Reason}}{{if .Next}}<br><span class="next">next: {{.Next}}</span>{{end}}</li>{{end}}</ul>
</section>
{{end}}{{end}}{{else}}<p>No archived night yet.</p>{{end}}
</body>
</html>
`))
