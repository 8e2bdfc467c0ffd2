package e2e_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/rs/zerolog"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"github.com/siderolabs/talos/pkg/machinery/role"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/e2e"
	"github.com/homelab/bootstrap/factory"
	"github.com/homelab/bootstrap/flux"
	"github.com/homelab/bootstrap/internal/testbrowser"
	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/kube"
	"github.com/homelab/bootstrap/lab/notifysink"
	"github.com/homelab/bootstrap/lab/pvesim"
	"github.com/homelab/bootstrap/lab/s3server"
	"github.com/homelab/bootstrap/lab/talossim"
	"github.com/homelab/bootstrap/postcheck"
	"github.com/homelab/bootstrap/sops"
	"github.com/homelab/bootstrap/talos"
)

// expect is what the nightly must say of one check while a fault is in.
type expect struct {
	check  string
	status check.Status
	// names is in the row's reason: the object the fault hit.
	names string
}

// matrixFault is one row of the postcheck's fault matrix: a real fault
// injected into the running lab, what the nightly must report, and how the
// lab is put back.
type matrixFault struct {
	// what is broken, as README's matrix names it.
	what   string
	expect []expect
	inject func(t *testing.T, m *matrix)
	undo   func(t *testing.T, m *matrix)
}

// matrix is the lab the fault matrix shares: one converged cluster of
// three control planes and a worker on three Proxmox members, with S3
// copies behind a proxy that can refuse writes.
type matrix struct {
	ctx   context.Context
	h     *e2e.Harness
	cs    kubernetes.Interface
	dyn   dynamic.Interface
	ops   *talos.Ops
	s3    *s3server.Server
	s3ro  *atomic.Bool
	nodes map[string]talos.Target
	// sink receives postcheck.notify's messages; seen is how many the
	// test has judged.
	sink *notifysink.Sink
	seen int
}

// TestPostcheckFaultMatrix is the nightly postcheck measured as a
// detector: the exact command of README and deploy/ (`bootstrap run
// --stage postcheck --log-format json`) first passes repeatedly on a
// healthy lab while it churns (reconciles requested as each run starts,
// a CoreDNS pod and a kube-proxy pod replaced), then, for every check, catches at least one real fault
// injected into the running lab: it exits 1 (0 for a warning), the check
// fails (or warns) naming the object, and the row and report.json say
// what to do next. Each fault is undone and the next nightly passes again
// before the next row. README's "Nightly postcheck" lists this table.
func TestPostcheckFaultMatrix(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 15*time.Minute)
	// A node turns NotReady 8 s after its heartbeat stops (as in the
	// postcheck's lab test): kwok renews each lease every 2 s or so, so a
	// healthy node never misses that much.
	h := startHarness(t, e2e.Options{ControlPlanes: 3, Workers: 1, ProxmoxHosts: 3, NodeMonitorGracePeriod: 8 * time.Second})
	m := &matrix{ctx: ctx, h: h, s3ro: &atomic.Bool{}}
	m.setUpS3(t)
	m.setUpNotify(t)
	if err := h.EditConfig(func(s string) (string, error) {
		// A claim the provisioner cannot serve is given up on quickly:
		// the matrix waits out this bound in each NFS row.
		return strings.Replace(s, "pvcTimeout: 1m", "pvcTimeout: 8s", 1), nil
	}); err != nil {
		t.Fatal(err)
	}
	if r := run(t, ctx, h, "run", "--stage", "all"); r.ExitCode != 0 {
		t.Fatalf("pipeline:\n%s", r.Tail(60))
	}
	m.connect(t)
	// The pipeline's postcheck passed: nothing to tell (no previous night
	// counts as a pass).
	m.notified(t, "")

	// No false alarms: the same command, repeated on the healthy lab with
	// its normal churn, passes every row every time. One round of the
	// churn's five steps (churn): reconciles requested as the run starts
	// (every run), a CoreDNS pod replaced (run 2) and a kube-proxy pod
	// replaced (run 4), each met by that run on its way up. More rounds repeat
	// the same steps; the healthy run after each of the rows below
	// (healthyAgain, 26 of them) repeats the plain night.
	healthy := 5
	// E2E_MATRIX_ONLY=<regexp> runs only the rows it matches, after two
	// healthy runs (for working on a row; the coverage check is skipped).
	only := os.Getenv("E2E_MATRIX_ONLY")
	if only != "" {
		healthy = 2
	}
	start := time.Now()
	for i := range healthy {
		m.churn(t, i)
		r, rep := m.nightly(t)
		if r.ExitCode != 0 || rep.Overall != check.Pass {
			t.Fatalf("healthy run %d/%d: exit %d, overall %s:\n%s", i+1, healthy, r.ExitCode, rep.Overall, r.Stdout)
		}
	}
	// A repeat tells nobody.
	m.notified(t, "")
	t.Logf("%d healthy nightly runs passed in %s", healthy, time.Since(start).Round(100*time.Millisecond))

	caught := map[string]bool{}
	for _, f := range matrixFaults() {
		if only != "" && !regexp.MustCompile(only).MatchString(f.what) {
			continue
		}
		ok := t.Run(f.what, func(t *testing.T) {
			f.inject(t, m)
			r, rep := m.nightly(t)
			m.judge(t, f, r, rep)
			failing := ""
			if rep.Overall == check.Fail {
				failing = r.Stdout
			}
			// A night that fails after a pass is told, once; a warning
			// is not.
			m.notifiedFailure(t, rep, failing)
			f.undo(t, m)
			m.healthyAgain(t)
			// The night it passes again is told too.
			if failing != "" {
				m.notified(t, "passes again")
			}
		})
		if !ok {
			t.Fatalf("the lab may not be healthy after %q: the rows after it would not say anything", f.what)
		}
		for _, e := range f.expect {
			caught[e.check] = true
		}
	}
	// A notification that cannot be sent is a warning, never a failed
	// night: with the receivers down, the night that passes again after a
	// failure exits 0 and says each was not sent.
	m.sink.SetDown(true)
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "matrix-down", Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}}, Provisioner: "example.com/none"}
	if _, err := m.cs.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r, _ := m.nightly(t); r.ExitCode != 1 || strings.Count(r.Stderr, "not sent: ") != 3 {
		t.Errorf("a failing night with the receivers down: exit %d, %d unsent warnings:\n%s", r.ExitCode, strings.Count(r.Stderr, "not sent: "), r.Tail(20))
	}
	if err := m.cs.StorageV1().StorageClasses().Delete(ctx, "matrix-down", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if r, rep := m.nightly(t); r.ExitCode != 0 || rep.Overall != check.Pass || strings.Count(r.Stderr, `"level":"warn"`) < 3 || strings.Count(r.Stderr, "not sent: ") != 3 {
		t.Errorf("a passing night with the receivers down: exit %d, overall %s:\n%s", r.ExitCode, rep.Overall, r.Tail(20))
	}
	m.sink.SetDown(false)
	m.notified(t, "")
	// The next night, unchanged, sends what the last could not, once.
	if r, _ := m.nightly(t); r.ExitCode != 0 {
		t.Errorf("the night after the receivers came back: exit %d:\n%s", r.ExitCode, r.Tail(20))
	}
	m.notified(t, "passes again")
	if r, _ := m.nightly(t); r.ExitCode != 0 {
		t.Errorf("a second passing night: exit %d:\n%s", r.ExitCode, r.Tail(20))
	}
	m.notified(t, "")
	m.historyPage(t)

	if only != "" {
		return
	}
	// Every check of the nightly is caught by at least one row.
	names := []string{postcheck.CheckArchive}
	for _, c := range postcheck.Checks(postcheck.Options{}) {
		names = append(names, c.Name)
	}
	for _, n := range names {
		if !caught[n] {
			t.Errorf("no fault of the matrix is caught by %s", n)
		}
	}
}

// setUpS3 starts the lab's S3 server behind a proxy that refuses writes
// while s3ro is set (AccessDenied, as a bucket whose policy or quota
// refuses uploads answers), and points backup.s3 at it with encrypted
// copies.
func (m *matrix) setUpS3(t *testing.T) {
	dir := t.TempDir()
	srv, err := s3server.Start(m.ctx, s3server.Options{Dir: filepath.Join(dir, "s3"), Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	if err := srv.MakeBucket("backups"); err != nil {
		t.Fatal(err)
	}
	m.s3 = srv
	target, _ := url.Parse(srv.Endpoint)
	rp := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.s3ro.Load() && r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusForbidden)
			fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Access Denied.</Message></Error>`)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	_, recipient, err := sops.GenerateIdentity()
	if err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(dir, "s3-credentials")
	writeSecretFile(t, creds, "[default]\naws_access_key_id = "+srv.AccessKey+"\naws_secret_access_key = "+srv.SecretKey+"\n")
	if err := m.h.EditConfig(func(s string) (string, error) {
		return s + "backup:\n  ageRecipients: [" + recipient + "]\n  s3:\n    endpoint: " + proxy.URL + "\n    bucket: backups\n    pathStyle: true\n    credentialsFile: " + creds + "\n", nil
	}); err != nil {
		t.Fatal(err)
	}
}

// setUpNotify starts the lab's receivers and names them in a 0600 file
// postcheck.notify.urlsFile points at: ntfy (a token), a generic JSON
// webhook and email (a PLAIN login), all through shoutrrr.
func (m *matrix) setUpNotify(t *testing.T) {
	sink, err := notifysink.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sink.Stop)
	m.sink = sink
	host := strings.TrimPrefix(sink.HTTP, "http://")
	urls := fmt.Sprintf("# the lab's receivers\nntfy://:%s@%s/homelab-nightly?scheme=http\ngeneric+http://%s/hook?template=json\nsmtp://%s:%s@%s/?from=bootstrap@lab.local&to=admin@lab.local&auth=Plain&encryption=None&usestarttls=No\n",
		sink.Token, host, host, sink.User, sink.Password, sink.SMTP)
	file := filepath.Join(t.TempDir(), "notify-urls")
	writeSecretFile(t, file, urls)
	if err := m.h.EditConfig(func(s string) (string, error) {
		return strings.Replace(s, "postcheck:\n", "postcheck:\n  notify:\n    urlsFile: "+file+"\n", 1), nil
	}); err != nil {
		t.Fatal(err)
	}
}

// notified judges the messages received since the last look: none when
// want is "", else one per receiver, each titled with want.
func (m *matrix) notified(t *testing.T, want string) []notifysink.Message {
	t.Helper()
	all := m.sink.Messages()
	got := all[m.seen:]
	m.seen = len(all)
	if want == "" {
		if len(got) != 0 {
			t.Errorf("%d notifications, want none: %+v", len(got), got)
		}
		return nil
	}
	vias := map[string]bool{}
	for _, g := range got {
		vias[g.Via] = true
		if !strings.Contains(g.Title, want) || !strings.Contains(g.Title, "lab") {
			t.Errorf("%s notified %q, want a title with %q", g.Via, g.Title, want)
		}
	}
	if len(got) != 3 || !vias["ntfy"] || !vias["webhook"] || !vias["smtp"] {
		t.Errorf("%d notifications (%v), want one to each receiver", len(got), vias)
	}
	return got
}

// notifiedFailure: a failing night is told to every receiver, naming
// each failing check, the cluster and the archive; a warning is not told.
func (m *matrix) notifiedFailure(t *testing.T, rep postcheck.Report, stdout string) {
	t.Helper()
	if stdout == "" {
		m.notified(t, "")
		return
	}
	archive := "none written tonight"
	if st, err := m.h.State(); err == nil && st.Outputs.Postcheck != nil && st.Outputs.Postcheck.Archive != "" {
		archive = st.Outputs.Postcheck.Archive
	}
	page := filepath.Join(m.h.Paths().StateDir, "postcheck", postcheck.HistoryPage)
	for _, g := range m.notified(t, "FAILED") {
		if archive != "none written tonight" && !strings.Contains(g.Body, "History: "+page) {
			t.Errorf("%s: the message does not name the history page:\n%s", g.Via, g.Body)
		}
		if !strings.Contains(g.Body, archive) {
			t.Errorf("%s: the message does not name the archive %s:\n%s", g.Via, archive, g.Body)
		}
		for _, c := range rep.Checks {
			if c.Status == check.Fail && !strings.Contains(g.Body, "✗ "+c.Name+": ") {
				t.Errorf("%s: the message does not name the failing %s:\n%s", g.Via, c.Name, g.Body)
			}
		}
	}
}

// historyPage: bootstrap status names the page; a real browser renders
// the last nights of the matrix with a failing night visible (the page's
// own size, the failing cell's text as the browser built the document).
func (m *matrix) historyPage(t *testing.T) {
	t.Helper()
	dir := filepath.Join(m.h.Paths().StateDir, "postcheck")
	page := filepath.Join(dir, postcheck.HistoryPage)
	if st := run(t, m.ctx, m.h, "status"); !strings.Contains(st.Stdout, "history "+page) {
		t.Errorf("bootstrap status does not name the history page:\n%s", st.Stdout)
	}
	nights, err := postcheck.ReadNights(dir, postcheck.HistoryNights)
	if err != nil || len(nights) != postcheck.HistoryNights {
		t.Fatalf("%d nights readable: %v", len(nights), err)
	}
	var cell string
	for _, n := range nights {
		for _, c := range n.Report.Checks {
			if c.Status == check.Fail && cell == "" {
				cell = "cell-" + c.Name + "-" + n.Dir
			}
		}
	}
	if cell == "" {
		t.Fatal("no failing night among the last 30")
	}
	img := testbrowser.Screenshot(t, page, 1600, 1000)
	if b := img.Bounds(); b.Dx() != 1600 || b.Dy() != 1000 {
		t.Errorf("screenshot %v", b)
	}
	got := regexp.MustCompile(`<td id="` + regexp.QuoteMeta(cell) + `" class="fail"[^>]*>([^<]*)</td>`).FindStringSubmatch(testbrowser.DOM(t, page))
	if got == nil || got[1] != "F" {
		t.Errorf("the failing cell %s as rendered: %v", cell, got)
	}
}

// connect opens the clients the faults are injected with: the lab's own
// Kubernetes client and the product's Talos operations with the
// cluster's talosconfig (what talosctl would do by hand).
func (m *matrix) connect(t *testing.T) {
	kc, err := m.h.Lab.Kube.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	m.cs = kc.Client()
	if m.dyn, err = dynamic.NewForConfig(kc.RESTConfig()); err != nil {
		t.Fatal(err)
	}
	tc, err := os.ReadFile(m.h.Paths().Talosconfig)
	if err != nil {
		t.Fatal(err)
	}
	if m.ops, err = talos.NewOps(talos.OpsOptions{Talosconfig: tc, CallTimeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	m.nodes = map[string]talos.Target{}
	for _, n := range m.h.Config().Nodes {
		m.nodes[n.Name] = talos.Target{Name: n.Name, IP: n.IP, Role: talos.Role(n.Role)}
	}
}

// nightly runs the exact nightly command and reads the report it
// archived (from its table when it could not archive one).
func (m *matrix) nightly(t *testing.T) (*e2e.Result, postcheck.Report) {
	t.Helper()
	r := run(t, m.ctx, m.h, "run", "--stage", "postcheck")
	for _, secret := range []string{m.sink.Token, m.sink.Password} {
		if strings.Contains(r.Stdout+r.Stderr, secret) {
			t.Errorf("the nightly printed a notification URL's secret:\n%s", r.Tail(30))
		}
	}
	var rep postcheck.Report
	st, err := m.h.State()
	if err != nil {
		t.Fatal(err)
	}
	archive := ""
	if st.Outputs.Postcheck != nil {
		archive = st.Outputs.Postcheck.Archive
	}
	if files, err := postcheck.ReadArchive(archive); err == nil && strings.Contains(r.Stderr, "postcheck archived to "+archive) {
		if err := json.Unmarshal(files["report.json"], &rep); err != nil {
			t.Fatalf("report.json: %v", err)
		}
		return r, rep
	}
	// No archive from this run: the table is all there is.
	for _, l := range strings.Split(r.Stdout, "\n") {
		f := strings.Fields(l)
		if len(f) < 3 || f[0] == "CHECK" {
			continue
		}
		st := check.Status(strings.ToLower(f[1]))
		if st != check.Pass && st != check.Warn && st != check.Fail {
			continue
		}
		reason := strings.Join(f[3:], " ")
		reason, next, _ := strings.Cut(reason, " → next: ")
		rep.Checks = append(rep.Checks, postcheck.CheckReport{Name: f[0], Status: st, Reason: reason, Next: next})
		if st == check.Fail || rep.Overall == "" || (st == check.Warn && rep.Overall == check.Pass) {
			rep.Overall = st
		}
	}
	return r, rep
}

// judge holds the nightly to a row: the exit code, each expected check's
// status naming the object, and what to do next in the row and in
// report.json.
func (m *matrix) judge(t *testing.T, f matrixFault, r *e2e.Result, rep postcheck.Report) {
	t.Helper()
	wantExit := 0
	for _, e := range f.expect {
		if e.status == check.Fail {
			wantExit = 1
		}
	}
	anyFail := slices.ContainsFunc(rep.Checks, func(c postcheck.CheckReport) bool { return c.Status == check.Fail })
	if r.ExitCode != wantExit || anyFail != (r.ExitCode == 1) {
		t.Errorf("exit %d (a row failed: %v), want %d:\n%s", r.ExitCode, anyFail, wantExit, r.Stdout)
	}
	for _, e := range f.expect {
		i := slices.IndexFunc(rep.Checks, func(c postcheck.CheckReport) bool { return c.Name == e.check })
		if i < 0 {
			t.Errorf("no row %s:\n%s", e.check, r.Stdout)
			continue
		}
		c := rep.Checks[i]
		if c.Status != e.status || !strings.Contains(c.Reason, e.names) {
			t.Errorf("%s: %s %q; want %s naming %q", e.check, c.Status, c.Reason, e.status, e.names)
		}
		// The usual next, led by the cause the check saw when it saw one.
		if c.Next == "" || !strings.HasSuffix(c.Next, postcheck.Next(m.h.Config().Cluster.Name, e.check, c.Status)) {
			t.Errorf("%s: report.json says next %q", e.check, c.Next)
		}
		if row := checkRow(r.Stdout, e.check); !strings.Contains(row, "→ next: "+c.Next) {
			t.Errorf("%s: the row does not say what to do next: %q", e.check, row)
		}
	}
	if t.Failed() {
		t.Logf("nightly:\n%s", r.Stdout)
	}
}

// healthyAgain waits until the nightly passes every row again after a
// fault was undone (the next night's view), bounded.
func (m *matrix) healthyAgain(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		r, rep := m.nightly(t)
		if r.ExitCode == 0 && rep.Overall == check.Pass {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not healthy 2 minutes after the fault was undone:\n%s", r.Stdout)
		}
		time.Sleep(time.Second)
	}
}

// churn is what a healthy cluster does beside a nightly run: reconciles
// requested as it starts, now and then a CoreDNS or a kube-proxy pod
// replaced (the run meets the replacement on its way up, or just Ready).
// None of it may fail a row.
func (m *matrix) churn(t *testing.T, i int) {
	t.Helper()
	now := time.Now().Format(time.RFC3339Nano)
	annotate := fmt.Sprintf(`{"metadata":{"annotations":{"reconcile.fluxcd.io/requestedAt":%q}}}`, now)
	for _, gvr := range []schema.GroupVersionResource{flux.GitRepositoryGVR, flux.KustomizationGVR} {
		if _, err := m.dyn.Resource(gvr).Namespace("flux-system").Patch(m.ctx, "flux-system", types.MergePatchType, []byte(annotate), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	switch i % 5 {
	case 1:
		pods, err := m.cs.CoreV1().Pods("kube-system").List(m.ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
		if err != nil || len(pods.Items) == 0 {
			t.Fatalf("CoreDNS pods: %v", err)
		}
		if err := m.cs.CoreV1().Pods("kube-system").Delete(m.ctx, pods.Items[0].Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	case 3:
		pods, err := m.cs.CoreV1().Pods("kube-system").List(m.ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-proxy", FieldSelector: "spec.nodeName=wk-1"})
		if err != nil || len(pods.Items) == 0 {
			t.Fatalf("kube-proxy pods: %v", err)
		}
		if err := m.cs.CoreV1().Pods("kube-system").Delete(m.ctx, pods.Items[0].Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitUntil polls cond for up to 90 s.
func (m *matrix) waitUntil(t *testing.T, what string, cond func(context.Context) (bool, string, error)) {
	t.Helper()
	if err := wait.Until(m.ctx, wait.Spec{What: what, Timeout: 90 * time.Second, Interval: 200 * time.Millisecond}, cond); err != nil {
		t.Fatal(err)
	}
}

func (m *matrix) node(name string) *talossim.Node {
	for _, n := range m.h.Lab.Talos.Nodes() {
		if n.Hostname() == name {
			return n
		}
	}
	return nil
}

// upgradeTalos moves one node to image by hand, as talosctl upgrade
// would, and waits until it runs version again.
func (m *matrix) upgradeTalos(t *testing.T, name, image, version string) {
	t.Helper()
	if _, err := m.ops.Upgrade(m.ctx, m.nodes[name], image); err != nil {
		t.Fatalf("upgrading %s to %s: %v", name, image, err)
	}
	m.waitUntil(t, name+" running "+version, func(ctx context.Context) (bool, string, error) {
		n := m.node(name)
		if n == nil {
			return false, "no node", nil
		}
		pr, err := m.ops.Probe(ctx, n.IP())
		if err != nil {
			return false, err.Error(), nil
		}
		return pr.Version == version && n.Stage() == runtime.MachineStageRunning, pr.Version + " " + n.Stage().String(), nil
	})
	m.nodeSchedulable(t, name)
}

// nodeSchedulable waits until the Node is Ready and not cordoned.
func (m *matrix) nodeSchedulable(t *testing.T, name string) {
	t.Helper()
	m.waitUntil(t, name+" Ready and schedulable", func(ctx context.Context) (bool, string, error) {
		n, err := m.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		_, notReady, err := kube.NodeStatus(ctx, m.cs, []string{name})
		return err == nil && len(notReady) == 0 && !n.Spec.Unschedulable, fmt.Sprintf("notReady %v unschedulable %v", notReady, n.Spec.Unschedulable), nil
	})
}

// backToConfigured upgrades a node moved by hand back to the config's
// Talos version and schematic.
func (m *matrix) backToConfigured(t *testing.T, name string) {
	t.Helper()
	v := m.h.Config().Cluster.TalosVersion
	m.upgradeTalos(t, name, m.images(m.h.Config().Images().Schematic, v), v)
}

func (m *matrix) images(schematic factory.Schematic, version string) string {
	return factory.Images{Factory: m.h.Lab.Factory.URL(), ID: schematic.MustID(), Version: version}.Installer()
}

// fluxReady waits until the Flux object's Ready condition is want (and,
// when not Ready, has a reason).
func (m *matrix) fluxReady(t *testing.T, res dynamic.ResourceInterface, name string, want bool) {
	t.Helper()
	m.waitUntil(t, fmt.Sprintf("%s Ready=%v", name, want), func(ctx context.Context) (bool, string, error) {
		u, err := res.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		r := flux.ReadinessOf(u)
		return r.Ready == want && (want || r.Detail != "no Ready condition yet"), r.Detail, nil
	})
}

func (m *matrix) reconcileNow(t *testing.T, res dynamic.ResourceInterface, name string) {
	t.Helper()
	body := fmt.Sprintf(`{"metadata":{"annotations":{"reconcile.fluxcd.io/requestedAt":%q}}}`, time.Now().Format(time.RFC3339Nano))
	if _, err := res.Patch(m.ctx, name, types.MergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (m *matrix) scale(t *testing.T, ns, name string, replicas int32) {
	t.Helper()
	body := fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)
	if _, err := m.cs.AppsV1().Deployments(ns).Patch(m.ctx, name, types.MergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// bundle is the cluster's secrets bundle (plaintext in this lab).
func (m *matrix) bundle(t *testing.T) *secrets.Bundle {
	t.Helper()
	b, err := secrets.LoadBundle(m.h.Paths().Secrets)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// saved keeps a file's content for the row's undo.
var saved = map[string][]byte{}

func save(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	saved[path] = b
}

func restore(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, saved[path], 0o600); err != nil {
		t.Fatal(err)
	}
}

// expiredKubeconfig rewrites the kept admin kubeconfig with a client
// certificate of the cluster's Kubernetes CA that expired yesterday: the
// kubeconfig a year after it was issued.
func (m *matrix) expiredKubeconfig(t *testing.T) {
	t.Helper()
	path := m.h.Paths().Kubeconfig
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	k8s := m.bundle(t).Certs.K8s
	caBlock, _ := pem.Decode(k8s.Crt)
	keyBlock, _ := pem.Decode(k8s.Key)
	ca, err := x509.ParseCertificate(caBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	caKey, err := parseKey(keyBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	ai := cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo]
	kb, _ := pem.Decode(ai.ClientKeyData)
	key, err := parseKey(kb.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "admin", Organization: []string{"system:masters"}},
		NotBefore: time.Now().Add(-366 * 24 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), caKey)
	if err != nil {
		t.Fatal(err)
	}
	ai.ClientCertificateData = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
}

// parseKey reads a PEM block's private key in any of the forms Talos
// writes (PKCS#8, EC, ed25519 through PKCS#8).
func parseKey(der []byte) (crypto.Signer, error) {
	if k, err := x509.ParsePKCS8PrivateKey(der); err == nil {
		if s, ok := k.(crypto.Signer); ok {
			return s, nil
		}
	}
	if k, err := x509.ParseECPrivateKey(der); err == nil {
		return k, nil
	}
	if k, err := x509.ParsePKCS1PrivateKey(der); err == nil {
		return k, nil
	}
	return nil, errors.New("no private key in the PEM block")
}

// talosconfigExpiringIn rewrites the kept talosconfig with an admin
// client certificate of the cluster's OS CA that expires in days.
func (m *matrix) talosconfigExpiringIn(t *testing.T, days int) {
	t.Helper()
	path := m.h.Paths().Talosconfig
	cfg, err := clientconfig.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	life := 365 * 24 * time.Hour
	cert, err := secrets.NewAdminCertificateAndKey(time.Now().Add(time.Duration(days)*24*time.Hour-life), m.bundle(t).Certs.OS, role.MakeSet(role.Admin), life)
	if err != nil {
		t.Fatal(err)
	}
	ctx := cfg.Contexts[cfg.Context]
	ctx.Crt, ctx.Key = base64.StdEncoding.EncodeToString(cert.Crt), base64.StdEncoding.EncodeToString(cert.Key)
	if err := cfg.Save(path); err != nil {
		t.Fatal(err)
	}
}

// emptyBucket removes every copy from the bucket (behind the proxy).
func (m *matrix) emptyBucket(t *testing.T) {
	t.Helper()
	mc, err := minio.New(strings.TrimPrefix(m.s3.Endpoint, "http://"), &minio.Options{Creds: credentials.NewStaticV4(m.s3.AccessKey, m.s3.SecretKey, ""), BucketLookup: minio.BucketLookupPath})
	if err != nil {
		t.Fatal(err)
	}
	for obj := range mc.ListObjects(m.ctx, "backups", minio.ListObjectsOptions{Recursive: true}) {
		if obj.Err != nil {
			t.Fatal(obj.Err)
		}
		if err := mc.RemoveObject(m.ctx, "backups", obj.Key, minio.RemoveObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// matrixFaults is the fault matrix: at least one row per check of the
// nightly (TestPostcheckFaultMatrix fails on a check no row catches).
func matrixFaults() []matrixFault {
	var (
		nodeVMID  = 711 // wk-1
		origHosts = map[string]string{}
		kubelet   string
		coreDNS   int32
		gitSecret string
		gitData   map[string][]byte
		moved     string
	)
	return []matrixFault{
		{
			what:   "admin kubeconfig expired",
			expect: []expect{{postcheck.CheckKubeconfig, check.Fail, "does not answer"}, {postcheck.CheckCerts, check.Fail, "expired: kubeconfig admin cert"}},
			inject: func(t *testing.T, m *matrix) { save(t, m.h.Paths().Kubeconfig); m.expiredKubeconfig(t) },
			undo:   func(t *testing.T, m *matrix) { restore(t, m.h.Paths().Kubeconfig) },
		},
		{
			what:   "node NotReady",
			expect: []expect{{postcheck.CheckNodesReady, check.Fail, "NotReady: wk-1"}},
			inject: func(t *testing.T, m *matrix) {
				kc, _ := m.h.Lab.Kube.Cluster()
				if err := kc.StopHeartbeat(m.ctx, "wk-1"); err != nil {
					t.Fatal(err)
				}
				m.waitUntil(t, "wk-1 NotReady", func(ctx context.Context) (bool, string, error) {
					_, notReady, err := kube.NodeStatus(ctx, m.cs, []string{"wk-1"})
					return len(notReady) == 1, "", err
				})
			},
			undo: func(t *testing.T, m *matrix) {
				kc, _ := m.h.Lab.Kube.Cluster()
				if err := kc.ResumeHeartbeat(m.ctx, "wk-1"); err != nil {
					t.Fatal(err)
				}
				m.nodeSchedulable(t, "wk-1")
			},
		},
		{
			what:   "control-plane pod down",
			expect: []expect{{postcheck.CheckTalosHealth, check.Fail, "kube-scheduler not Ready: kube-scheduler-cp-1"}},
			inject: func(t *testing.T, m *matrix) { m.mirrorReady(t, "kube-scheduler-cp-1", corev1.ConditionFalse) },
			undo:   func(t *testing.T, m *matrix) { m.mirrorReady(t, "kube-scheduler-cp-1", corev1.ConditionTrue) },
		},
		{
			what:   "CoreDNS down",
			expect: []expect{{postcheck.CheckTalosHealth, check.Fail, "coredns"}},
			inject: func(t *testing.T, m *matrix) {
				d, err := m.cs.AppsV1().Deployments("kube-system").Get(m.ctx, "coredns", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				coreDNS = *d.Spec.Replicas
				m.scale(t, "kube-system", "coredns", 0)
				m.waitUntil(t, "no CoreDNS pod", func(ctx context.Context) (bool, string, error) {
					pods, err := m.cs.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
					return err == nil && len(pods.Items) == 0, "", err
				})
			},
			undo: func(t *testing.T, m *matrix) { m.scale(t, "kube-system", "coredns", coreDNS) },
		},
		{
			what:   "etcd learner stuck",
			expect: []expect{{postcheck.CheckEtcd, check.Fail, "cp-3"}},
			inject: func(t *testing.T, m *matrix) {
				if err := m.h.Lab.Talos.StuckLearner(m.nodes["cp-3"].IP, true); err != nil {
					t.Fatal(err)
				}
			},
			undo: func(t *testing.T, m *matrix) {
				if err := m.h.Lab.Talos.StuckLearner(m.nodes["cp-3"].IP, false); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			what:   "etcd member removed",
			expect: []expect{{postcheck.CheckEtcd, check.Fail, "cp-3"}},
			inject: func(t *testing.T, m *matrix) {
				members, err := m.ops.EtcdMembers(m.ctx, m.nodes["cp-1"].IP)
				if err != nil {
					t.Fatal(err)
				}
				i := slices.IndexFunc(members, func(e talos.EtcdMember) bool { return e.Hostname == "cp-3" })
				if i < 0 {
					t.Fatalf("no member cp-3 in %v", members)
				}
				// talosctl -n cp-1 etcd remove-member <cp-3's ID>
				if _, err := m.ops.EtcdRemoveMember(m.ctx, m.nodes["cp-1"], members[i].ID); err != nil {
					t.Fatal(err)
				}
			},
			undo: func(t *testing.T, m *matrix) {
				// A reboot makes cp-3 join again (a new learner, promoted).
				if err := m.ops.Reboot(m.ctx, m.nodes["cp-3"]); err != nil {
					t.Fatal(err)
				}
				m.waitUntil(t, "cp-3 a voting member again", func(ctx context.Context) (bool, string, error) {
					members, err := m.ops.EtcdMembers(ctx, m.nodes["cp-1"].IP)
					if err != nil {
						return false, err.Error(), nil
					}
					i := slices.IndexFunc(members, func(e talos.EtcdMember) bool { return e.Hostname == "cp-3" })
					return i >= 0 && !members[i].Learner, fmt.Sprint(members), nil
				})
			},
		},
		{
			what:   "a node's Talos API down",
			expect: []expect{{postcheck.CheckTalosAPI, check.Fail, "wk-1"}},
			inject: func(t *testing.T, m *matrix) {
				n := m.node("wk-1")
				f := n.Faults()
				f.RefuseConnections = true
				n.SetFaults(f)
			},
			undo: func(t *testing.T, m *matrix) {
				n := m.node("wk-1")
				f := n.Faults()
				f.RefuseConnections = false
				n.SetFaults(f)
			},
		},
		{
			what:   "VM stopped",
			expect: []expect{{postcheck.CheckVMs, check.Fail, fmt.Sprintf("wk-1 (vmid %d, stopped)", nodeVMID)}},
			inject: func(t *testing.T, m *matrix) {
				if err := m.h.Lab.PVEFor(nodeVMID).GuestPowerOff(nodeVMID); err != nil {
					t.Fatal(err)
				}
			},
			undo: func(t *testing.T, m *matrix) {
				// What the row says to do.
				if r := run(t, m.ctx, m.h, "run", "--stage", "provision"); r.ExitCode != 0 {
					t.Fatalf("provision:\n%s", r.Tail(40))
				}
				m.nodeSchedulable(t, "wk-1")
			},
		},
		{
			what:   "VM migrated next to another control plane",
			expect: []expect{{postcheck.CheckVMs, check.Warn, "cp-1 and cp-2 share"}},
			inject: func(t *testing.T, m *matrix) {
				st, err := m.h.State()
				if err != nil {
					t.Fatal(err)
				}
				cp1, cp2 := st.Outputs.Nodes["cp-1"], st.Outputs.Nodes["cp-2"]
				origHosts["cp-2"], moved = m.h.Lab.PVE.VMNode(cp2.VMID), fmt.Sprint(cp2.VMID)
				// A local cdrom blocks a migration: ejected first, as a user would.
				if err := m.h.Lab.PVEFor(cp2.VMID).EditVM(cp2.VMID, map[string]string{"ide2": "none,media=cdrom"}); err != nil {
					t.Fatal(err)
				}
				if err := m.h.Lab.PVE.Migrate(m.ctx, cp2.VMID, m.h.Lab.PVE.VMNode(cp1.VMID)); err != nil {
					t.Fatal(err)
				}
			},
			undo: func(t *testing.T, m *matrix) {
				var id int
				fmt.Sscan(moved, &id)
				if err := m.h.Lab.PVE.Migrate(m.ctx, id, origHosts["cp-2"]); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			what:   "guest agent silent",
			expect: []expect{{postcheck.CheckGuestAgent, check.Warn, "wk-1 (Proxmox API POST /nodes/pve1/qemu/711/agent/ping: 500 QEMU guest agent is not running)"}},
			inject: func(t *testing.T, m *matrix) {
				for _, p := range m.h.Lab.PVEMembers {
					p.InjectFault(pvesim.Fault{Kind: pvesim.FaultStatus, Status: 500, Message: "QEMU guest agent is not running", Method: "POST", Path: fmt.Sprintf("/nodes/*/qemu/%d/agent/ping", nodeVMID)})
				}
			},
			undo: func(t *testing.T, m *matrix) {
				for _, p := range m.h.Lab.PVEMembers {
					p.ClearFaults()
				}
			},
		},
		{
			what:   "extension missing after an upgrade",
			expect: []expect{{postcheck.CheckExtensions, check.Fail, "wk-1 lacks"}, {postcheck.CheckGuestAgent, check.Warn, "wk-1"}},
			inject: func(t *testing.T, m *matrix) {
				// wk-1 upgraded by hand to a schematic without the guest
				// agent, registered with the factory first as a user would.
				v := m.h.Config().Cluster.TalosVersion
				bare := factory.New(nil, nil)
				fc, err := factory.NewClient(factory.ClientOptions{URL: m.h.Lab.Factory.URL(), CAFile: m.h.Config().Resolve(m.h.Config().Cluster.FactoryCAFile)})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := fc.Register(m.ctx, bare); err != nil {
					t.Fatal(err)
				}
				m.upgradeTalos(t, "wk-1", m.images(bare, v), v)
			},
			undo: func(t *testing.T, m *matrix) { m.backToConfigured(t, "wk-1") },
		},
		{
			what:   "Talos version drift",
			expect: []expect{{postcheck.CheckTalosVersion, check.Warn, "wk-1 runs v1.13.2"}},
			inject: func(t *testing.T, m *matrix) {
				m.upgradeTalos(t, "wk-1", m.images(m.h.Config().Images().Schematic, "v1.13.2"), "v1.13.2")
			},
			undo: func(t *testing.T, m *matrix) { m.backToConfigured(t, "wk-1") },
		},
		{
			what:   "Kubernetes version drift",
			expect: []expect{{postcheck.CheckKubeVersion, check.Warn, "wk-1's kubelet runs 1.35.4"}},
			inject: func(t *testing.T, m *matrix) {
				n, err := m.cs.CoreV1().Nodes().Get(m.ctx, "wk-1", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				kubelet = n.Status.NodeInfo.KubeletVersion
				kc, _ := m.h.Lab.Kube.Cluster()
				if err := kc.SetKubeletVersion(m.ctx, "wk-1", "v1.35.4"); err != nil {
					t.Fatal(err)
				}
			},
			undo: func(t *testing.T, m *matrix) {
				kc, _ := m.h.Lab.Kube.Cluster()
				if err := kc.SetKubeletVersion(m.ctx, "wk-1", kubelet); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			what:   "talosconfig certificate near expiry",
			expect: []expect{{postcheck.CheckCerts, check.Warn, "talosconfig client cert expires"}},
			inject: func(t *testing.T, m *matrix) { save(t, m.h.Paths().Talosconfig); m.talosconfigExpiringIn(t, 10) },
			undo:   func(t *testing.T, m *matrix) { restore(t, m.h.Paths().Talosconfig) },
		},
		{
			what:   "second default StorageClass",
			expect: []expect{{postcheck.CheckDefaultClass, check.Fail, "2 default StorageClasses (matrix-second, nfs-storage)"}},
			inject: func(t *testing.T, m *matrix) {
				sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "matrix-second", Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}}, Provisioner: "example.com/none"}
				if _, err := m.cs.StorageV1().StorageClasses().Create(m.ctx, sc, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			},
			undo: func(t *testing.T, m *matrix) {
				if err := m.cs.StorageV1().StorageClasses().Delete(m.ctx, "matrix-second", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			what:   "NFS provisioner down",
			expect: []expect{{postcheck.CheckNFS, check.Fail, "phase Pending"}},
			inject: func(t *testing.T, m *matrix) {
				m.scale(t, "nfs-provisioner", m.provisionerDeployment(t), 0)
				m.waitUntil(t, "the provisioner to stop serving", func(context.Context) (bool, string, error) {
					return len(m.h.Lab.Provisioner().Serving()) == 0, "", nil
				})
			},
			undo: func(t *testing.T, m *matrix) {
				m.scale(t, "nfs-provisioner", m.provisionerDeployment(t), 1)
				m.waitUntil(t, "the provisioner serving", func(context.Context) (bool, string, error) {
					return len(m.h.Lab.Provisioner().Serving()) > 0, "", nil
				})
			},
		},
		{
			what:   "NFS export withdrawn",
			expect: []expect{{postcheck.CheckNFS, check.Fail, "mounting the NFS export"}},
			inject: func(t *testing.T, m *matrix) { m.h.Lab.NFS.SetExported(false) },
			undo:   func(t *testing.T, m *matrix) { m.h.Lab.NFS.SetExported(true) },
		},
		{
			// The export's root is root's, 0755: squashed, the
			// provisioner (root in its pod) may not create the volume's
			// directory.
			what:   "NFS export root-squashed",
			expect: []expect{{postcheck.CheckNFS, check.Fail, "permission denied (NFS3ERR_ACCES)"}},
			inject: func(t *testing.T, m *matrix) { m.h.Lab.NFS.SetRootSquash(true) },
			undo:   func(t *testing.T, m *matrix) { m.h.Lab.NFS.SetRootSquash(false) },
		},
		{
			what:   "GitRepository failing authentication",
			expect: []expect{{postcheck.CheckFlux, check.Fail, "GitRepository not Ready"}},
			inject: func(t *testing.T, m *matrix) {
				repos := m.dyn.Resource(flux.GitRepositoryGVR).Namespace("flux-system")
				u, err := repos.Get(m.ctx, "flux-system", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				gitSecret, _, _ = unstructured.NestedString(u.Object, "spec", "secretRef", "name")
				if gitSecret == "" {
					t.Fatal("the GitRepository has no secretRef")
				}
				s, err := m.cs.CoreV1().Secrets("flux-system").Get(m.ctx, gitSecret, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				gitData = s.Data
				s.Data = map[string][]byte{"username": s.Data["username"], "password": []byte("not-the-password")}
				if _, err := m.cs.CoreV1().Secrets("flux-system").Update(m.ctx, s, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				m.reconcileNow(t, repos, "flux-system")
				m.fluxReady(t, repos, "flux-system", false)
			},
			undo: func(t *testing.T, m *matrix) {
				repos := m.dyn.Resource(flux.GitRepositoryGVR).Namespace("flux-system")
				s, err := m.cs.CoreV1().Secrets("flux-system").Get(m.ctx, gitSecret, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				s.Data = gitData
				if _, err := m.cs.CoreV1().Secrets("flux-system").Update(m.ctx, s, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				m.reconcileNow(t, repos, "flux-system")
				m.fluxReady(t, repos, "flux-system", true)
			},
		},
		{
			what:   "Kustomization failing to build",
			expect: []expect{{postcheck.CheckFluxObjects, check.Fail, "matrix-broken"}},
			inject: func(t *testing.T, m *matrix) {
				ks := m.dyn.Resource(flux.KustomizationGVR).Namespace("flux-system")
				// A strategic-merge patch of an object ./infra does not
				// have: kustomize build fails.
				obj := map[string]any{"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
					"metadata": map[string]any{"name": "matrix-broken", "namespace": "flux-system"},
					"spec": map[string]any{"interval": "1h", "path": "./infra", "prune": false,
						"sourceRef": map[string]any{"kind": "GitRepository", "name": "flux-system"},
						"patches":   []any{map[string]any{"patch": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: not-in-infra\n  namespace: homelab\ndata:\n  a: b\n"}}}}
				if _, err := ks.Create(m.ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				m.fluxReady(t, ks, "matrix-broken", false)
			},
			undo: func(t *testing.T, m *matrix) {
				m.deleteAndWait(t, m.dyn.Resource(flux.KustomizationGVR).Namespace("flux-system"), "matrix-broken")
			},
		},
		{
			what:   "HelmRelease failing",
			expect: []expect{{postcheck.CheckFluxObjects, check.Fail, "matrix-broken"}},
			inject: func(t *testing.T, m *matrix) {
				repo := map[string]any{"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "HelmRepository",
					"metadata": map[string]any{"name": "matrix", "namespace": "flux-system"},
					"spec":     map[string]any{"interval": "1h", "url": m.h.Lab.Charts.URL()}}
				if _, err := m.dyn.Resource(helmRepositoryGVR).Namespace("flux-system").Create(m.ctx, &unstructured.Unstructured{Object: repo}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				// A chart version the repository does not have.
				hr := map[string]any{"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
					"metadata": map[string]any{"name": "matrix-broken", "namespace": "flux-system"},
					"spec": map[string]any{"interval": "1h", "chart": map[string]any{"spec": map[string]any{"chart": "nfs-subdir-external-provisioner", "version": "9.9.9",
						"sourceRef": map[string]any{"kind": "HelmRepository", "name": "matrix"}}}}}
				hrs := m.dyn.Resource(flux.HelmReleaseGVR).Namespace("flux-system")
				if _, err := hrs.Create(m.ctx, &unstructured.Unstructured{Object: hr}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				m.fluxReady(t, hrs, "matrix-broken", false)
			},
			undo: func(t *testing.T, m *matrix) {
				m.deleteAndWait(t, m.dyn.Resource(flux.HelmReleaseGVR).Namespace("flux-system"), "matrix-broken")
				m.deleteAndWait(t, m.dyn.Resource(helmRepositoryGVR).Namespace("flux-system"), "matrix")
			},
		},
		{
			what:   "Flux object suspended",
			expect: []expect{{postcheck.CheckFluxObjects, check.Warn, "flux-system"}},
			inject: func(t *testing.T, m *matrix) { m.suspend(t, true) },
			undo:   func(t *testing.T, m *matrix) { m.suspend(t, false) },
		},
		{
			what:   "newest etcd backup older than backup.maxAge",
			expect: []expect{{postcheck.CheckEtcdBackup, check.Fail, "old (limit 26h0m0s)"}},
			inject: func(t *testing.T, m *matrix) {
				m.h.Lab.Kube.FailEtcdSnapshots(errors.New("etcd snapshot stream broken (injected by the fault matrix)"))
				m.ageBackups(t, 50*time.Hour)
			},
			undo: func(t *testing.T, m *matrix) { m.h.Lab.Kube.FailEtcdSnapshots(nil) },
		},
		{
			what:   "S3 copy older than the local one",
			expect: []expect{{postcheck.CheckEtcdBackup, check.Warn, "is older than the newest local snapshot"}},
			inject: func(t *testing.T, m *matrix) { m.s3ro.Store(true) },
			undo:   func(t *testing.T, m *matrix) { m.s3ro.Store(false) },
		},
		{
			what:   "S3 copy missing",
			expect: []expect{{postcheck.CheckEtcdBackup, check.Warn, "no verified remote copy"}},
			inject: func(t *testing.T, m *matrix) { m.s3ro.Store(true); m.emptyBucket(t) },
			undo:   func(t *testing.T, m *matrix) { m.s3ro.Store(false) },
		},
		{
			what:   "the run cannot write its archive",
			expect: []expect{{postcheck.CheckArchive, check.Fail, "not a directory"}},
			inject: func(t *testing.T, m *matrix) {
				dir := filepath.Join(m.h.Paths().StateDir, "postcheck")
				if err := os.Rename(dir, dir+".aside"); err != nil {
					t.Fatal(err)
				}
				// Where the archives go is not a directory (a broken mount,
				// a file someone wrote there).
				if err := os.WriteFile(dir, []byte("not a directory\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			},
			undo: func(t *testing.T, m *matrix) {
				dir := filepath.Join(m.h.Paths().StateDir, "postcheck")
				if err := os.Remove(dir); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(dir+".aside", dir); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
}

var helmRepositoryGVR = flux.GitRepositoryGVR.GroupVersion().WithResource("helmrepositories")

func (m *matrix) mirrorReady(t *testing.T, name string, status corev1.ConditionStatus) {
	t.Helper()
	pod, err := m.cs.CoreV1().Pods("kube-system").Get(m.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == corev1.PodReady {
			pod.Status.Conditions[i].Status = status
		}
	}
	if _, err := m.cs.CoreV1().Pods("kube-system").UpdateStatus(m.ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (m *matrix) provisionerDeployment(t *testing.T) string {
	t.Helper()
	deps, err := m.cs.AppsV1().Deployments("nfs-provisioner").List(m.ctx, metav1.ListOptions{})
	if err != nil || len(deps.Items) != 1 {
		t.Fatalf("provisioner Deployment: %v", err)
	}
	return deps.Items[0].Name
}

func (m *matrix) deleteAndWait(t *testing.T, res dynamic.ResourceInterface, name string) {
	t.Helper()
	if err := res.Delete(m.ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	m.waitUntil(t, name+" gone", func(ctx context.Context) (bool, string, error) {
		_, err := res.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), nil
	})
}

func (m *matrix) suspend(t *testing.T, on bool) {
	t.Helper()
	body := fmt.Sprintf(`{"spec":{"suspend":%v}}`, on)
	if _, err := m.dyn.Resource(flux.KustomizationGVR).Namespace("flux-system").Patch(m.ctx, "flux-system", types.MergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// ageBackups renames the kept etcd snapshots as if each had been taken
// by ago earlier: the nights since then took none.
func (m *matrix) ageBackups(t *testing.T, ago time.Duration) {
	t.Helper()
	dir := filepath.Join(m.h.Paths().StateDir, "etcd")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	const layout = "20060102T150405Z"
	n := 0
	for _, e := range entries {
		stamp, rest, ok := strings.Cut(e.Name(), ".")
		at, err := time.Parse(layout, stamp)
		if !ok || err != nil {
			continue
		}
		older := at.Add(-ago).Format(layout) + "." + rest
		if err := os.Rename(filepath.Join(dir, e.Name()), filepath.Join(dir, older)); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n == 0 {
		t.Fatalf("no snapshot in %s", dir)
	}
}
