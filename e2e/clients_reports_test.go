package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	junit "github.com/joshdk/go-junit"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/postcheck"
	"github.com/homelab/bootstrap/postcheck/reporttest"
)

// fluxRow is one object row of `flux get all -A`.
type fluxRow struct {
	Namespace, Name, Revision, Suspended, Ready, Message string
}

// fluxGet runs `flux get <args>` and returns its object rows: the CLI
// prints one tab-separated table per kind, each under its header (NAMESPACE
// first with -A) and after a blank line.
func fluxGet(t *testing.T, ctx context.Context, env []string, args ...string) []fluxRow {
	t.Helper()
	out, err := tool(t, ctx, env, "flux", append([]string{"get"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var (
		rows   []fluxRow
		header []string
	)
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		// Rows end in a tab, headers do not (tablewriter's padding).
		f := strings.Split(strings.TrimSuffix(sc.Text(), "\t"), "\t")
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		if f[0] == "NAMESPACE" || f[0] == "NAME" {
			header = f
			continue
		}
		if len(f) != len(header) {
			continue
		}
		col := func(name string) string {
			if i := slices.Index(header, name); i >= 0 {
				return f[i]
			}
			return ""
		}
		rows = append(rows, fluxRow{col("NAMESPACE"), col("NAME"), col("REVISION"), col("SUSPENDED"), col("READY"), col("MESSAGE")})
	}
	if len(rows) == 0 {
		t.Logf("flux get %s printed no object rows:\n%q", strings.Join(args, " "), out)
	}
	return rows
}

// notReady lists the rows the flux CLI does not show Ready.
func notReady(rows []fluxRow) []string {
	var bad []string
	for _, r := range rows {
		if r.Ready != "True" || r.Suspended != "False" {
			bad = append(bad, fmt.Sprintf("%s/%s ready=%s suspended=%s: %s", r.Namespace, r.Name, r.Ready, r.Suspended, r.Message))
		}
	}
	return bad
}

// checkFlux reads the Flux the flux stage installed with the flux CLI:
// flux check (before and after install), every object Ready at the
// snapshot's revision, and the tree of what ./infra applied. A
// Kustomization of a path the repository lacks must show not Ready.
func checkFlux(t *testing.T, ctx context.Context, h *e2e.Harness, env []string, headRevision, dir string) {
	if _, err := tool(t, ctx, env, "flux", "check", "--pre"); err != nil {
		t.Errorf("flux check --pre: %v", err)
	}
	if _, err := tool(t, ctx, env, "flux", "check", "--timeout", "1m", "--poll-interval", "1s"); err != nil {
		t.Errorf("flux check: %v", err)
	}
	rows := fluxGet(t, ctx, env, "all", "-A")
	if bad := notReady(rows); len(rows) == 0 || len(bad) > 0 {
		t.Errorf("flux get all -A: not Ready: %v (of %d objects)", bad, len(rows))
	}
	// The CLI shows a commit's first 8 hex digits (its utils.TruncateHex).
	want := h.Config().Flux.Branch + "@sha1:" + headRevision[:8]
	for _, name := range []string{"gitrepository/flux-system", "kustomization/flux-system"} {
		found := false
		for _, r := range rows {
			if r.Namespace == "flux-system" && r.Name == name {
				found = true
				if r.Revision != want {
					t.Errorf("flux get: %s at %s, the snapshot's branch is at %s", name, r.Revision, want)
				}
			}
		}
		if !found {
			t.Errorf("flux get all -A lists no %s: %+v", name, rows)
		}
	}
	tree, err := tool(t, ctx, env, "flux", "tree", "kustomization", "flux-system", "-n", "flux-system")
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range []string{"Namespace/homelab", "ConfigMap/homelab/welcome"} {
		if !strings.Contains(tree, obj) {
			t.Errorf("flux tree kustomization flux-system lacks %s:\n%s", obj, tree)
		}
	}

	// The negative: a Kustomization of a path the repository lacks is
	// reported not Ready by the same reading.
	broken := filepath.Join(dir, "broken-kustomization.yaml")
	writeFile(t, broken, []byte("apiVersion: kustomize.toolkit.fluxcd.io/v1\nkind: Kustomization\nmetadata:\n  name: broken\n  namespace: flux-system\n"+
		"spec:\n  interval: 1m\n  path: ./no-such-path\n  prune: false\n  sourceRef:\n    kind: GitRepository\n    name: flux-system\n"))
	if _, err := tool(t, ctx, env, "kubectl", "apply", "-f", broken); err != nil {
		t.Fatal(err)
	}
	defer tool(t, context.WithoutCancel(ctx), env, "kubectl", "delete", "-f", broken, "--wait=false")
	deadline := time.Now().Add(time.Minute)
	for {
		rows := fluxGet(t, ctx, env, "kustomizations", "broken", "-n", "flux-system")
		if len(rows) == 1 && rows[0].Ready == "False" {
			if len(notReady(rows)) != 1 {
				t.Errorf("a failed Kustomization passes the readiness reading: %+v", rows)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting 1m for flux get to show the broken Kustomization not Ready: %+v", rows)
		}
		time.Sleep(time.Second)
	}
}

// scrape GETs a node_exporter's /metrics and parses it.
func scrape(ctx context.Context, addr string) (map[string]*dto.MetricFamily, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(bytes.NewReader(b))
}

// checkNodeExporter points node_exporter's textfile collector at the
// directory of the postcheck's Prometheus file and scrapes it: no scrape
// error, and every family of the file exposed with its type and series.
// A malformed file beside it must raise the collector's error.
func checkNodeExporter(t *testing.T, ctx context.Context, promFile string) {
	written, err := os.ReadFile(promFile)
	if err != nil {
		t.Fatalf("the postcheck's Prometheus file: %v", err)
	}
	port, err := kube.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	startTool(t, ctx, "node_exporter", "--collector.disable-defaults", "--collector.textfile",
		"--collector.textfile.directory="+filepath.Dir(promFile), "--web.listen-address="+addr, "--web.disable-exporter-metrics")
	var got map[string]*dto.MetricFamily
	deadline := time.Now().Add(15 * time.Second)
	for {
		if got, err = scrape(ctx, addr); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting 15s for node_exporter on %s: %v", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	scrapeError := func(got map[string]*dto.MetricFamily) float64 {
		f := got["node_textfile_scrape_error"]
		if f == nil || len(f.Metric) != 1 {
			t.Fatalf("node_exporter exposes no node_textfile_scrape_error")
		}
		return f.Metric[0].GetGauge().GetValue()
	}
	if e := scrapeError(got); e != 0 {
		t.Fatalf("node_textfile_scrape_error = %v reading %s", e, promFile)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	want, err := parser.TextToMetricFamilies(bytes.NewReader(written))
	if err != nil || len(want) == 0 {
		t.Fatalf("parsing %s: %v", promFile, err)
	}
	for name, w := range want {
		g := got[name]
		switch {
		case !strings.HasPrefix(name, "bootstrap_"):
			t.Errorf("the file has a family outside bootstrap_*: %s", name)
		case g == nil:
			t.Errorf("node_exporter does not expose %s", name)
		case g.GetType() != w.GetType() || len(g.Metric) != len(w.Metric):
			t.Errorf("%s: node_exporter exposes %s with %d series, the file has %s with %d", name, g.GetType(), len(g.Metric), w.GetType(), len(w.Metric))
		}
	}
	for _, name := range []string{"bootstrap_postcheck_success", "bootstrap_postcheck_check_success", "bootstrap_etcd_backup_timestamp_seconds"} {
		if want[name] == nil {
			t.Errorf("the Prometheus file lacks %s", name)
		}
	}

	// The negative: a malformed metric line in the directory is the
	// collector's scrape error.
	bad := filepath.Join(filepath.Dir(promFile), "malformed.prom")
	writeFile(t, bad, []byte("bootstrap_postcheck_success{cluster=\"x\" 1\n"))
	defer os.Remove(bad)
	if got, err = scrape(ctx, addr); err != nil {
		t.Fatal(err)
	}
	if e := scrapeError(got); e != 1 {
		t.Errorf("node_textfile_scrape_error = %v with a malformed file, want 1", e)
	}
}

// checkReports reads the newest postcheck archive's report.json with the
// JSON Schema the project ships and its junit.xml with a JUnit consumer
// (joshdk/go-junit, which CI report tools ingest with): one suite, one
// passed case per check. A truncated file must be refused.
func checkReports(t *testing.T, archive string) {
	files, err := postcheck.ReadArchive(archive)
	if err != nil {
		t.Fatal(err)
	}
	if err := reporttest.Validate(t, files["report.json"]); err != nil {
		t.Errorf("report.json does not validate against docs/report.schema.json: %v", err)
	}
	var report postcheck.Report
	if err := json.Unmarshal(files["report.json"], &report); err != nil {
		t.Fatal(err)
	}
	suites, err := junit.Ingest(files["junit.xml"])
	if err != nil || len(suites) != 1 {
		t.Fatalf("junit.xml: %d suites, %v", len(suites), err)
	}
	s := suites[0]
	if len(s.Tests) != len(report.Checks) || s.Totals.Tests != len(report.Checks) || s.Totals.Passed != len(report.Checks) {
		t.Errorf("junit.xml: %d cases (%+v) for %d checks", len(s.Tests), s.Totals, len(report.Checks))
	}
	for i, c := range s.Tests {
		if i < len(report.Checks) && (c.Name != report.Checks[i].Name || c.Status != junit.StatusPassed) {
			t.Errorf("junit case %d: %s %s, report check %s %s", i, c.Name, c.Status, report.Checks[i].Name, report.Checks[i].Status)
		}
	}
	if _, err := junit.Ingest(files["junit.xml"][:len(files["junit.xml"])/2]); err == nil {
		t.Error("the JUnit consumer read a truncated junit.xml")
	}
}
