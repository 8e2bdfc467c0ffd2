package postcheck

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"encoding/xml"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/flux"
	"github.com/homelab/bootstrap/postcheck/reporttest"
	"github.com/homelab/bootstrap/talos"
)

func sampleReport() Report {
	start := time.Date(2026, 11, 21, 3, 0, 0, 0, time.UTC)
	return NewReport("homelab", start, 2500*time.Millisecond, []check.Result{
		{Name: CheckKubeconfig, Status: check.Pass, Reason: "API answers", Duration: 20 * time.Millisecond},
		{Name: CheckCerts, Status: check.Warn, Reason: "kubeconfig admin cert expires 2026-12-01 (in 10 days)"},
		{Name: CheckNFS, Status: check.Fail, Reason: `waiting for test PVC Bound: timed out "x"`},
	})
}

func TestReportJSON(t *testing.T) {
	b, err := sampleReport().JSON()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"schema_version", "cluster", "started", "duration_seconds", "overall", "checks"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("report.json lacks %s", k)
		}
	}
	if m["overall"] != "fail" || m["schema_version"].(float64) != 3 || len(m["checks"].([]any)) != 3 {
		t.Fatalf("report: %s", b)
	}
}

// Every field of a report, filled, validates against the schema the
// project ships; so does the minimal one. A report the schema does not
// describe (an unknown key, a status outside pass/warn/fail) does not.
func TestReportMatchesTheShippedSchema(t *testing.T) {
	full := sampleReport()
	full.TalosVersions, full.WantTalos = map[string]string{"cp-1": "v1.13.3"}, "v1.13.3"
	full.KubeletVersions, full.APIServerVersion, full.WantKubernetes = map[string]string{"cp-1": "1.36.1"}, "1.36.1", "1.36.1"
	full.NewestBackup = time.Date(2026, 11, 21, 2, 0, 0, 0, time.UTC)
	full.FluxObjects = []flux.Object{{Kind: "HelmRelease", Namespace: "flux-system", Name: "nfs-provisioner", Suspended: true,
		Readiness: flux.Readiness{Ready: true, Revision: "4.0.18", Detail: "x", HandledRequest: "2026-11-21T02:00:00Z"}}}
	full.Extensions = map[string][]talos.Extension{"cp-1": {{Name: "qemu-guest-agent", Version: "10.0.2"}}}
	for name, r := range map[string]Report{"full": full, "minimal": sampleReport()} {
		b, err := r.JSON()
		if err != nil {
			t.Fatal(err)
		}
		if err := reporttest.Validate(t, b); err != nil {
			t.Errorf("%s report: %v\n%s", name, err, b)
		}
	}
	b, _ := sampleReport().JSON()
	for what, bad := range map[string][]byte{
		"an unknown key":   bytes.Replace(b, []byte(`"cluster":`), []byte(`"clutser": "x", "cluster":`), 1),
		"a status unknown": bytes.Replace(b, []byte(`"overall": "fail"`), []byte(`"overall": "broken"`), 1),
	} {
		if bytes.Equal(bad, b) {
			t.Fatalf("%s: the edit did not apply", what)
		}
		if err := reporttest.Validate(t, bad); err == nil {
			t.Errorf("the schema accepts %s", what)
		}
	}
}

func TestReportJUnit(t *testing.T) {
	b, err := sampleReport().JUnit()
	if err != nil {
		t.Fatal(err)
	}
	var s junitSuites
	if err := xml.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	suite := s.Suites[0]
	if suite.Tests != 3 || suite.Failures != 1 || suite.Cases[2].Failure == nil || !strings.HasPrefix(suite.Cases[1].SystemOut, "WARNING:") {
		t.Fatalf("junit: %s", b)
	}
}

func TestReportPrometheus(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "bootstrap.prom")
	r := sampleReport()
	r.TalosVersions, r.WantTalos = map[string]string{"cp-1": "v1.13.3", "wk-1": "v1.13.2"}, "v1.13.3"
	r.KubeletVersions, r.APIServerVersion, r.WantKubernetes = map[string]string{"cp-1": "1.36.1", "wk-1": "1.35.4"}, "1.36.1", "1.36.1"
	r.FluxObjects = []flux.Object{
		{Kind: "HelmRelease", Namespace: "flux-system", Name: "nfs-provisioner", Readiness: flux.Readiness{Ready: true, Revision: "4.0.18"}},
		{Kind: "Kustomization", Namespace: "apps", Name: "paused", Suspended: true, Readiness: flux.Readiness{Ready: true}},
		{Kind: "Kustomization", Namespace: "flux-system", Name: "flux-system", Readiness: flux.Readiness{Detail: "BuildFailed: x"}},
	}
	if err := WritePrometheus(p, r); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	out := string(b)
	for _, want := range []string{
		`bootstrap_talos_node_info{cluster="homelab",node="wk-1",version="v1.13.2",want="v1.13.3"} 1`,
		`bootstrap_talos_node_drift{cluster="homelab",node="cp-1"} 0`,
		`bootstrap_talos_node_drift{cluster="homelab",node="wk-1"} 1`,
		`bootstrap_kubernetes_node_info{cluster="homelab",node="wk-1",version="1.35.4",want="1.36.1"} 1`,
		`bootstrap_kubernetes_node_drift{cluster="homelab",node="cp-1"} 0`,
		`bootstrap_kubernetes_node_drift{cluster="homelab",node="wk-1"} 1`,
		`bootstrap_kubernetes_apiserver_drift{cluster="homelab",version="1.36.1"} 0`,
		`bootstrap_flux_object_ready{cluster="homelab",kind="HelmRelease",namespace="flux-system",name="nfs-provisioner",suspended="false"} 1`,
		`bootstrap_flux_object_ready{cluster="homelab",kind="Kustomization",namespace="apps",name="paused",suspended="true"} 0`,
		`bootstrap_flux_object_ready{cluster="homelab",kind="Kustomization",namespace="flux-system",name="flux-system",suspended="false"} 0`,
		`bootstrap_postcheck_success{cluster="homelab"} 0`,
		`bootstrap_postcheck_check_success{cluster="homelab",check="kubeconfig"} 1`,
		`bootstrap_postcheck_check_success{cluster="homelab",check="nfs-provisioning"} 0`,
		`bootstrap_postcheck_check_warning{cluster="homelab",check="cert-expiry"} 1`,
		`bootstrap_postcheck_duration_seconds{cluster="homelab"} 2.500`,
		`bootstrap_postcheck_timestamp_seconds{cluster="homelab"} ` + strconv.FormatInt(time.Date(2026, 11, 21, 3, 0, 0, 0, time.UTC).Unix(), 10),
		"# TYPE bootstrap_postcheck_success gauge",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("prometheus output lacks %q:\n%s", want, out)
		}
	}
	// node_exporter's textfile collector reads the file with this parser
	// (prometheus/common expfmt.TextParser): every family parses, is a
	// gauge, and a broken line would fail the scrape.
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(out))
	if err != nil {
		t.Fatalf("the textfile collector's parser: %v", err)
	}
	for name, f := range families {
		if !strings.HasPrefix(name, "bootstrap_") || f.GetType() != dto.MetricType_GAUGE || len(f.GetMetric()) == 0 {
			t.Errorf("family %s: type %s, %d samples", name, f.GetType(), len(f.GetMetric()))
		}
	}
	if len(families) < 10 {
		t.Errorf("%d families parsed", len(families))
	}
	bad := expfmt.NewTextParser(model.UTF8Validation)
	if _, err := bad.TextToMetricFamilies(strings.NewReader(out + "bootstrap_broken{cluster=\"homelab\" 1\n")); err == nil {
		t.Error("the parser took a malformed line: the check above proves nothing")
	}
}

func TestArchive(t *testing.T) {
	dir := t.TempDir()
	start := time.Date(2026, 11, 21, 3, 0, 0, 0, time.UTC)
	p, err := WriteArchive(dir, start, map[string][]byte{"report.json": []byte("{}"), "evidence/nodes.yaml": []byte("items: []")})
	if err != nil {
		t.Fatal(err)
	}
	if p != filepath.Join(dir, "20261121T030000Z", ArchiveName) {
		t.Fatalf("archive at %s", p)
	}
	f, _ := os.Open(p)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	if strings.Join(names, ",") != "evidence/nodes.yaml,report.json" {
		t.Fatalf("archive holds %v", names)
	}
}

func selfSigned(t *testing.T, notAfter time.Time) []byte {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		NotBefore: notAfter.Add(-365 * 24 * time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func writeKubeconfig(t *testing.T, dir string, certPEM []byte) string {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:1"}
	cfg.AuthInfos["admin@c"] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: []byte("k")}
	cfg.Contexts["admin@c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "admin@c"}
	cfg.CurrentContext = "admin@c"
	p := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCertExpiryWarns(t *testing.T) {
	now := time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		notAfter time.Time
		want     check.Status
		reason   string
	}{
		{now.Add(200 * 24 * time.Hour), check.Pass, "expires 2027-06-09"},
		{now.Add(10 * 24 * time.Hour), check.Warn, "expires 2026-12-01 (in 10 days)"},
		{now.Add(-24 * time.Hour), check.Fail, "expired: kubeconfig admin cert expires 2026-11-20"},
	}
	// The command that renews both, in the talos stage's last 30 days, is
	// the row's next step.
	const renew = "bootstrap run --stage talos renews"
	for _, tc := range cases {
		p := writeKubeconfig(t, t.TempDir(), selfSigned(t, tc.notAfter))
		c := &checker{o: Options{KubeconfigPath: p, CertWarnDays: 30, Now: func() time.Time { return now }}}
		st, reason := c.certs(t.Context())
		if st != tc.want || !strings.Contains(reason, tc.reason) || strings.Contains(Next("c", CheckCerts, st), renew) != (st != check.Pass) {
			t.Errorf("notAfter %s: got %s %q", tc.notAfter, st, reason)
		}
	}
}

// A row that did not pass says what to do next, and a reason quoting a
// multi-line message stays on its row.
func TestRowsSayWhatToDoNext(t *testing.T) {
	res := []check.Result{
		{Name: CheckFlux, Status: check.Fail, Reason: "GitRepository not Ready (GitOperationFailed: unable to list remote:\nauthentication required)"},
		{Name: CheckKubeconfig, Status: check.Pass, Reason: "API answers"},
		{Name: CheckEtcdBackup, Status: check.Warn, Reason: "no verified remote copy"},
	}
	var out bytes.Buffer
	if err := check.Table(&out, WithNext("homelab", res, nil)); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 || !strings.Contains(lines[1], "unable to list remote: authentication required) → next: flux get sources git -A") ||
		strings.Contains(lines[2], "next:") || !strings.Contains(lines[3], "→ next: bootstrap backup takes one now") || !strings.Contains(lines[3], "ls ai/state/homelab/etcd/") {
		t.Errorf("table:\n%s", out.String())
	}
	rep := NewReport("homelab", time.Now(), time.Second, res)
	for i, c := range rep.Checks {
		if (c.Next == "") != (res[i].Status == check.Pass) {
			t.Errorf("%s: next %q", c.Name, c.Next)
		}
	}
	for _, name := range append([]string{CheckArchive}, checkNames()...) {
		if Next("homelab", name, check.Fail) == "" {
			t.Errorf("%s has no next step", name)
		}
	}
}

func checkNames() []string {
	var out []string
	for _, c := range Checks(Options{}) {
		out = append(out, c.Name)
	}
	return out
}

// README's "What each check catches" has a row for every check (the
// e2e fault matrix proves each row).
func TestReadmeListsEveryCheck(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "### What each check catches")
	section, _, _ = strings.Cut(section, "\n### ")
	if !ok {
		t.Fatal("README has no section \"What each check catches\"")
	}
	for _, name := range append(checkNames(), CheckArchive, CheckRunWarnings) {
		if !strings.Contains(section, "\n| `"+name+"` |") {
			t.Errorf("README's matrix has no row for %s", name)
		}
	}
}
