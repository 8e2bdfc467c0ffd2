// Package postcheck turns the exit criteria of a bootstrapped cluster into
// checks, and their results into reports: report.json, JUnit XML, a
// Prometheus textfile, and a tar.gz archive with the evidence.
package postcheck

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/flux"
	"github.com/homelab/bootstrap/internal/fsutil"
	"github.com/homelab/bootstrap/internal/targz"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/talos"
)

// SchemaVersion versions report.json; docs/report.schema.json describes
// it. 2: flux_objects' readiness keys are snake_case (ready, revision,
// detail, handled_request), as every other key. 3: a check that did not
// pass carries next, what to do about it.
const SchemaVersion = 3

// Report is the outcome of one postcheck.
type Report struct {
	SchemaVersion   int           `json:"schema_version"`
	Cluster         string        `json:"cluster"`
	Started         time.Time     `json:"started"`
	DurationSeconds float64       `json:"duration_seconds"`
	Overall         check.Status  `json:"overall"`
	Checks          []CheckReport `json:"checks"`
	// TalosVersions is what each node reported running (by node name), and
	// WantTalos what the config names: a nightly run shows when someone
	// moved a node outside the tool.
	TalosVersions map[string]string `json:"talos_versions,omitempty"`
	WantTalos     string            `json:"want_talos,omitempty"`
	// KubeletVersions is what each Node's kubelet reported, APIServer what
	// the API server answered, WantKubernetes what the config names.
	KubeletVersions  map[string]string `json:"kubelet_versions,omitempty"`
	APIServerVersion string            `json:"apiserver_version,omitempty"`
	WantKubernetes   string            `json:"want_kubernetes,omitempty"`
	// NewestBackup is when the newest kept etcd snapshot was taken.
	NewestBackup time.Time `json:"newest_backup,omitzero"`
	// FluxObjects is every Kustomization and HelmRelease, one entry per
	// object with its readiness.
	FluxObjects []flux.Object `json:"flux_objects,omitempty"`
	// Extensions are the system extensions each node runs (name and
	// version; "schematic" carries the Image Factory schematic ID).
	Extensions map[string][]talos.Extension `json:"extensions,omitempty"`
}

// CheckReport is one check in report.json.
type CheckReport struct {
	Name   string       `json:"name"`
	Status check.Status `json:"status"`
	Reason string       `json:"reason"`
	// Next is what to do about a check that did not pass: the command to
	// run or the place to look (Next).
	Next            string  `json:"next,omitempty"`
	DurationSeconds float64 `json:"duration_seconds"`
}

// NewReport builds a report from check results.
func NewReport(cluster string, started time.Time, duration time.Duration, results []check.Result) Report {
	r := Report{SchemaVersion: SchemaVersion, Cluster: cluster, Started: started.UTC(), DurationSeconds: duration.Seconds(), Overall: check.Overall(results)}
	for _, res := range results {
		r.Checks = append(r.Checks, CheckReport{Name: res.Name, Status: res.Status, Reason: res.Reason, Next: Next(cluster, res.Name, res.Status), DurationSeconds: res.Duration.Seconds()})
	}
	return r
}

// Passed is true when no check failed (warnings allowed).
func (r Report) Passed() bool { return r.Overall != check.Fail }

// JSON renders report.json.
func (r Report) JSON() ([]byte, error) {
	b, err := json.MarshalIndent(r, "", "  ")
	return append(b, '\n'), err
}

type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name      string      `xml:"name,attr"`
	Tests     int         `xml:"tests,attr"`
	Failures  int         `xml:"failures,attr"`
	Time      string      `xml:"time,attr"`
	Timestamp string      `xml:"timestamp,attr"`
	Cases     []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	ClassName string        `xml:"classname,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitFailure `xml:"failure,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitFailure struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

// JUnit renders the report as JUnit XML for CI dashboards. Warnings pass,
// with the reason in system-out.
func (r Report) JUnit() ([]byte, error) {
	s := junitSuite{Name: "postcheck." + r.Cluster, Tests: len(r.Checks), Time: fmt.Sprintf("%.3f", r.DurationSeconds), Timestamp: r.Started.Format(time.RFC3339)}
	for _, c := range r.Checks {
		jc := junitCase{Name: c.Name, ClassName: "postcheck." + r.Cluster, Time: fmt.Sprintf("%.3f", c.DurationSeconds)}
		switch c.Status {
		case check.Fail:
			s.Failures++
			jc.Failure = &junitFailure{Message: c.Reason, Text: c.Reason}
		case check.Warn:
			jc.SystemOut = "WARNING: " + c.Reason
		default:
			jc.SystemOut = c.Reason
		}
		s.Cases = append(s.Cases, jc)
	}
	b, err := xml.MarshalIndent(junitSuites{Suites: []junitSuite{s}}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append([]byte(xml.Header), append(b, '\n')...), nil
}

// Prometheus renders the report in the text exposition format for node
// exporter's textfile collector.
func (r Report) Prometheus() []byte {
	var b strings.Builder
	cl := promLabel(r.Cluster)
	gauge := func(name, help string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
	}
	gauge("bootstrap_postcheck_success", "1 when the last postcheck passed (warnings allowed), else 0.")
	fmt.Fprintf(&b, "bootstrap_postcheck_success{cluster=%s} %d\n", cl, boolInt(r.Passed()))
	gauge("bootstrap_postcheck_check_success", "1 when the check did not fail (pass or warn).")
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "bootstrap_postcheck_check_success{cluster=%s,check=%s} %d\n", cl, promLabel(c.Name), boolInt(c.Status != check.Fail))
	}
	gauge("bootstrap_postcheck_check_warning", "1 when the check passed with a warning.")
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "bootstrap_postcheck_check_warning{cluster=%s,check=%s} %d\n", cl, promLabel(c.Name), boolInt(c.Status == check.Warn))
	}
	gauge("bootstrap_postcheck_duration_seconds", "Wall time of the last postcheck.")
	fmt.Fprintf(&b, "bootstrap_postcheck_duration_seconds{cluster=%s} %.3f\n", cl, r.DurationSeconds)
	gauge("bootstrap_postcheck_timestamp_seconds", "Start of the last postcheck, Unix time.")
	fmt.Fprintf(&b, "bootstrap_postcheck_timestamp_seconds{cluster=%s} %d\n", cl, r.Started.Unix())
	if !r.NewestBackup.IsZero() {
		gauge("bootstrap_etcd_backup_timestamp_seconds", "When the newest kept, verified etcd snapshot was taken, Unix time.")
		fmt.Fprintf(&b, "bootstrap_etcd_backup_timestamp_seconds{cluster=%s} %d\n", cl, r.NewestBackup.Unix())
	}
	if len(r.TalosVersions) > 0 {
		nodes := make([]string, 0, len(r.TalosVersions))
		for n := range r.TalosVersions {
			nodes = append(nodes, n)
		}
		sort.Strings(nodes)
		gauge("bootstrap_talos_node_info", "Always 1: the Talos version the node reported (version) and the one the config names (want).")
		for _, n := range nodes {
			fmt.Fprintf(&b, "bootstrap_talos_node_info{cluster=%s,node=%s,version=%s,want=%s} 1\n", cl, promLabel(n), promLabel(r.TalosVersions[n]), promLabel(r.WantTalos))
		}
		gauge("bootstrap_talos_node_drift", "1 when the node runs another Talos than the config names.")
		for _, n := range nodes {
			fmt.Fprintf(&b, "bootstrap_talos_node_drift{cluster=%s,node=%s} %d\n", cl, promLabel(n), boolInt(r.TalosVersions[n] != r.WantTalos))
		}
	}
	if len(r.KubeletVersions) > 0 {
		nodes := make([]string, 0, len(r.KubeletVersions))
		for n := range r.KubeletVersions {
			nodes = append(nodes, n)
		}
		sort.Strings(nodes)
		want := strings.TrimPrefix(r.WantKubernetes, "v")
		gauge("bootstrap_kubernetes_node_info", "Always 1: the kubelet version the node's Node reported (version) and the Kubernetes version the config names (want).")
		for _, n := range nodes {
			fmt.Fprintf(&b, "bootstrap_kubernetes_node_info{cluster=%s,node=%s,version=%s,want=%s} 1\n", cl, promLabel(n), promLabel(r.KubeletVersions[n]), promLabel(want))
		}
		gauge("bootstrap_kubernetes_node_drift", "1 when the node's kubelet runs another Kubernetes than the config names.")
		for _, n := range nodes {
			fmt.Fprintf(&b, "bootstrap_kubernetes_node_drift{cluster=%s,node=%s} %d\n", cl, promLabel(n), boolInt(r.KubeletVersions[n] != want))
		}
	}
	if len(r.FluxObjects) > 0 {
		gauge("bootstrap_flux_object_ready", "1 when the Flux Kustomization or HelmRelease is Ready for its current generation (suspended objects are 0 and suspended=\"true\").")
		for _, o := range r.FluxObjects {
			fmt.Fprintf(&b, "bootstrap_flux_object_ready{cluster=%s,kind=%s,namespace=%s,name=%s,suspended=%s} %d\n", cl, promLabel(o.Kind), promLabel(o.Namespace), promLabel(o.Name), promLabel(fmt.Sprint(o.Suspended)), boolInt(o.Ready && !o.Suspended))
		}
	}
	if r.APIServerVersion != "" {
		gauge("bootstrap_kubernetes_apiserver_drift", "1 when the API server runs another Kubernetes than the config names.")
		fmt.Fprintf(&b, "bootstrap_kubernetes_apiserver_drift{cluster=%s,version=%s} %d\n", cl, promLabel(r.APIServerVersion), boolInt(r.APIServerVersion != strings.TrimPrefix(r.WantKubernetes, "v")))
	}
	return []byte(b.String())
}

// WritePrometheus writes the textfile atomically, so the collector never
// reads half a file.
func WritePrometheus(path string, r Report) error {
	return fsutil.WriteAtomic(path, r.Prometheus(), 0o644)
}

func promLabel(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s) + `"`
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ArchiveName is the file inside each postcheck/<UTC-timestamp>/ directory.
const ArchiveName = "postcheck.tar.gz"

// ReadArchive returns the files of an archive WriteArchive wrote (name →
// content).
func ReadArchive(path string) (map[string][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return targz.Unpack(b)
}

// WriteArchive stores files (name → content) as one tar.gz in a new
// dir/<UTC-timestamp>/ and returns the archive's path. Files are sorted by
// name so archives of equal content are equal.
func WriteArchive(dir string, started time.Time, files map[string][]byte) (string, error) {
	data, err := targz.Pack(files, 0o600, started)
	if err != nil {
		return "", err
	}
	sub, err := state.NewTimestampDir(dir, started)
	if err != nil {
		return "", err
	}
	path := filepath.Join(sub, ArchiveName)
	if err := fsutil.WriteAtomic(path, data, 0o600); err != nil {
		return "", err
	}
	return path, nil
}
