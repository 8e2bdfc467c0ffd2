package infra

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/repo"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"

	"github.com/homelab/bootstrap/lab/chartrepo"
	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
	"github.com/homelab/bootstrap/lab/ociregistry"
)

const demoDeployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-demo
spec:
  replicas: 1
  selector: {matchLabels: {app: demo}}
  template:
    metadata: {labels: {app: demo}}
    spec:
      containers:
      - name: demo
        image: registry.k8s.io/pause:3.10
        env: [{name: GREETING, value: {{ .Values.greeting | quote }}}]
`

// chartRepo serves a chart repository (index.yaml + .tgz) over HTTP, as a
// real Helm repository would, holding the given versions of a demo chart.
func chartRepo(t *testing.T, versions ...string) string {
	dir := t.TempDir()
	for _, v := range versions {
		if _, err := chartutil.Save(demoChart(v), dir); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	t.Cleanup(srv.Close)
	idx, err := repo.IndexDirectory(dir, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if err := idx.WriteFile(filepath.Join(dir, "index.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	return srv.URL
}

// demoChart is the demo chart at version v.
func demoChart(v string) *chart.Chart {
	return &chart.Chart{
		Metadata:  &chart.Metadata{APIVersion: chart.APIVersionV2, Name: "demo", Version: v, Type: "application"},
		Values:    map[string]any{"greeting": "hello"},
		Templates: []*chart.File{{Name: "templates/deploy.yaml", Data: []byte(demoDeployment)}},
	}
}

// TestHelmInstallsFromAnOCIRegistry: a chart repository named oci:// is
// an OCI registry (no index.yaml): the chart is pulled as the artifact
// <path>/<chart>:<version> with Helm's registry client from a real
// registry (distribution's, in the lab), installed, and a re-run changes
// nothing.
func TestHelmInstallsFromAnOCIRegistry(t *testing.T) {
	helmHome(t)
	lab, ctx := oneNodeLab(t, 3*time.Minute)
	reg, err := ociregistry.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	for _, v := range []string{"1.0.0", "1.1.0"} {
		if err := reg.PushChart("charts", demoChart(v)); err != nil {
			t.Fatal(err)
		}
	}
	h, err := NewHelm(kubetest.AdminKubeconfig(t, lab), "lab", kubetest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	r := Release{Name: "demo", Namespace: "demo-oci", RepoURL: reg.RepoURL("charts"), Chart: "demo", Version: "1.1.0", Values: map[string]any{"greeting": "oci"}, Timeout: time.Minute}
	for _, want := range []Action{ActionInstall, ActionNone} {
		if rel := planAndApply(t, ctx, h, r, want); rel.Version != 1 || rel.Chart.Metadata.Version != "1.1.0" {
			t.Fatalf("release revision %d chart %s", rel.Version, rel.Chart.Metadata.Version)
		}
	}
	if _, err := lab.Client().AppsV1().Deployments("demo-oci").Get(ctx, "demo-demo", metav1.GetOptions{}); err != nil {
		t.Fatalf("the chart pulled from the registry was not installed: %v", err)
	}
	r.Version = "9.9.9"
	if _, err := h.Render(ctx, r); err == nil || !strings.Contains(err.Error(), "pulling chart demo@9.9.9 from "+reg.RepoURL("charts")) {
		t.Fatalf("a version the registry lacks: %v", err)
	}
}

// planAndApply plans r, wants the plan's action, and applies it.
func planAndApply(t *testing.T, ctx context.Context, h *Helm, r Release, want Action) *release.Release {
	t.Helper()
	p, err := h.Plan(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if p.Action != want {
		t.Fatalf("plan %s (%s), want %s", p.Action, p.Reason, want)
	}
	rel, err := h.Apply(ctx, r, p)
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

// oneNodeLab is the real control plane the package's lab tests share, one
// after another (kubetest.Shared), with the Flux controllers and one
// schedulable, Ready node cp-1. Each test keeps to namespaces and
// releases of its own; what is cluster-wide (the Cilium release in
// kube-system, a default StorageClass) no other test reads. The returned
// context bounds the test to budget counted from when it holds a lab slot:
// a wait for a slot on a loaded run must not eat the test's own time.
func oneNodeLab(t *testing.T, budget time.Duration) (*kube.Cluster, context.Context) {
	t.Helper()
	kubetest.Binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	t.Cleanup(cancel)
	lab := kubetest.Shared(t, "infra", kube.Options{Flux: true, ScheduleOnControlPlanes: true})
	if _, err := lab.Client().CoreV1().Nodes().Get(ctx, "cp-1", metav1.GetOptions{}); apierrors.IsNotFound(err) {
		if err := lab.RegisterNode(ctx, "cp-1", "127.0.0.11", kube.RoleControlPlane); err != nil {
			t.Fatal(err)
		}
	}
	if err := lab.WaitNodesReady(ctx, []string{"cp-1"}, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return lab, ctx
}

func helmHome(t *testing.T) {
	home := t.TempDir()
	for _, k := range []string{"HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"} {
		t.Setenv(k, filepath.Join(home, k))
	}
}

// TestHelmInstallIsIdempotentAndRecovers runs the install-or-upgrade logic
// against a real API server and a real chart repository.
func TestHelmInstallIsIdempotentAndRecovers(t *testing.T) {
	helmHome(t)
	lab, ctx := oneNodeLab(t, 3*time.Minute)
	url := chartRepo(t, "1.0.0", "1.1.0")
	h, err := NewHelm(kubetest.AdminKubeconfig(t, lab), "lab", kubetest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	r := Release{Name: "demo", Namespace: "demo-ns", RepoURL: url, Chart: "demo", Version: "1.0.0", Values: map[string]any{"greeting": "hi"}, Timeout: time.Minute}
	var openAPI atomic.Int32
	h.getter.rest.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if strings.HasPrefix(req.URL.Path, "/openapi/") {
				openAPI.Add(1)
			}
			return rt.RoundTrip(req)
		})
	})
	dc, err := discovery.NewDiscoveryClientForConfig(h.getter.rest)
	if err != nil {
		t.Fatal(err)
	}
	h.getter.disco = memory.NewMemCacheClient(dc)
	defer func() {
		// Installs and upgrades do not fetch the OpenAPI documents
		// (skipFieldValidationProbe).
		if n := openAPI.Load(); n > 0 {
			t.Errorf("Helm fetched OpenAPI documents %d times", n)
		}
	}()

	apply := func(want Action) *release.Release {
		t.Helper()
		return planAndApply(t, ctx, h, r, want)
	}
	if rel := apply(ActionInstall); rel.Version != 1 {
		t.Fatalf("first install is revision %d", rel.Version)
	}
	d, err := lab.Client().AppsV1().Deployments("demo-ns").Get(ctx, "demo-demo", metav1.GetOptions{})
	if err != nil || d.Status.AvailableReplicas != 1 {
		t.Fatalf("Deployment not Available after Apply: %v", err)
	}
	if rel := apply(ActionNone); rel.Version != 1 {
		t.Fatalf("a re-run made revision %d", rel.Version)
	}
	r.Values = map[string]any{"greeting": "hello again"}
	if rel := apply(ActionUpgrade); rel.Version != 2 {
		t.Fatalf("changed values: revision %d", rel.Version)
	}
	r.Version = "1.1.0"
	if rel := apply(ActionUpgrade); rel.Version != 3 || rel.Chart.Metadata.Version != "1.1.0" {
		t.Fatalf("new chart version: revision %d", rel.Version)
	}

	// A run killed mid-upgrade leaves the last revision pending-upgrade.
	cfg, err := h.config(r.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	last, err := cfg.Releases.Last("demo")
	if err != nil {
		t.Fatal(err)
	}
	stuck := *last
	stuck.Version, stuck.Info = last.Version+1, &release.Info{Status: release.StatusPendingUpgrade, FirstDeployed: last.Info.FirstDeployed, LastDeployed: last.Info.LastDeployed}
	last.Info.Status = release.StatusSuperseded
	if err := cfg.Releases.Update(last); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Releases.Create(&stuck); err != nil {
		t.Fatal(err)
	}
	p, err := h.Plan(ctx, r)
	if err != nil || p.Action != ActionRecover || p.RollbackTo != 3 {
		t.Fatalf("stuck upgrade: %+v %v", p, err)
	}
	if _, err := h.Apply(ctx, r, p); err != nil {
		t.Fatal(err)
	}
	if p, err := h.Plan(ctx, r); err != nil || p.Action != ActionNone {
		t.Fatalf("after recovery: %+v %v", p, err)
	}

	// A run killed during the first install leaves pending-install.
	h2 := Release{Name: "demo2", Namespace: "demo-ns", RepoURL: url, Chart: "demo", Version: "1.0.0", Timeout: time.Minute}
	pending := &release.Release{Name: "demo2", Namespace: "demo-ns", Version: 1, Chart: last.Chart,
		Info: &release.Info{Status: release.StatusPendingInstall}}
	if err := cfg.Releases.Create(pending); err != nil {
		t.Fatal(err)
	}
	p, err = h.Plan(ctx, h2)
	if err != nil || p.Action != ActionRecover || p.RollbackTo != 0 {
		t.Fatalf("stuck install: %+v %v", p, err)
	}
	rel, err := h.Apply(ctx, h2, p)
	if err != nil || rel.Info.Status != release.StatusDeployed {
		t.Fatalf("recovered install: %v", err)
	}

	// A run killed while it uninstalled that stuck release leaves it
	// uninstalling, its objects partly deleted (Helm records the status
	// first): the next run finishes the uninstall and installs again,
	// instead of reading it as deployed.
	rel.Info.Status = release.StatusUninstalling
	if err := cfg.Releases.Update(rel); err != nil {
		t.Fatal(err)
	}
	if err := lab.Client().AppsV1().Deployments("demo-ns").Delete(ctx, "demo2-demo", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	p, err = h.Plan(ctx, h2)
	if err != nil || p.Action != ActionRecover || p.RollbackTo != 0 {
		t.Fatalf("killed uninstall: %+v %v", p, err)
	}
	if rel, err = h.Apply(ctx, h2, p); err != nil || rel.Info.Status != release.StatusDeployed {
		t.Fatalf("recovered after a killed uninstall: %v", err)
	}
	if _, err := lab.Client().AppsV1().Deployments("demo-ns").Get(ctx, "demo2-demo", metav1.GetOptions{}); err != nil {
		t.Errorf("the Deployment the killed uninstall deleted is not back: %v", err)
	}
}

// TestCiliumOnOneNodeWithTheRealChart installs the real Cilium chart (from
// the Cilium source the lab tools pin) with the release values onto a
// one-node cluster with the real scheduler. With the chart's own operator
// size (two host-network replicas with a required hostname anti-affinity)
// the second replica never schedules and the wait says why; sized to the
// node count it is Available at once.
func TestCiliumOnOneNodeWithTheRealChart(t *testing.T) {
	helmHome(t)
	lab, ctx := oneNodeLab(t, 3*time.Minute)
	chartDir, err := lab.Binaries().CiliumChart(ctx)
	if err != nil {
		t.Fatal(err)
	}
	repo, err := chartrepo.Start(chartrepo.Options{Log: kubetest.Logger(t), Charts: []string{chartDir}})
	if err != nil {
		t.Fatal(err)
	}
	defer repo.Close()
	var version string
	for _, c := range repo.Charts() {
		if c.Name == CiliumChart {
			version = c.Version
		}
	}
	if version == "" {
		t.Fatalf("the lab repository serves no Cilium chart: %v", repo.Charts())
	}
	h, err := NewHelm(kubetest.AdminKubeconfig(t, lab), "lab", kubetest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	host, port, _, err := APIEndpoint(7445, "https://10.0.20.10:6443")
	if err != nil {
		t.Fatal(err)
	}
	rel := Cilium(CiliumOptions{RepoURL: repo.URL(), Version: version, APIHost: host, APIPort: port, Nodes: 1, Timeout: 20 * time.Second})

	// The chart's default operator size, as the release had it before.
	chartDefault := rel
	chartDefault.Values = copyValues(rel.Values)
	delete(chartDefault.Values, "operator")
	p, err := h.Plan(ctx, chartDefault)
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.Apply(ctx, chartDefault, p)
	// The real scheduler's verdict: the operator's host ports (hostNetwork)
	// and its required hostname anti-affinity both keep a second replica
	// off the only node; the wait reports the scheduler's message.
	if err == nil || !strings.Contains(err.Error(), "unschedulable: 0/1 nodes are available") {
		t.Fatalf("the chart's two operator replicas on one node: got %v, want a wait that says why the second cannot schedule", err)
	}

	rel.Timeout = time.Minute
	if p, err = h.Plan(ctx, rel); err != nil || p.Action != ActionUpgrade {
		t.Fatalf("plan with the sized operator: %+v %v", p, err)
	}
	if _, err := h.Apply(ctx, rel, p); err != nil {
		t.Fatalf("sized to one node: %v", err)
	}
	d, err := lab.Client().AppsV1().Deployments(CiliumNamespace).Get(ctx, "cilium-operator", metav1.GetOptions{})
	if err != nil || *d.Spec.Replicas != 1 || d.Status.AvailableReplicas != 1 {
		t.Fatalf("cilium-operator: %v %+v", err, d.Status)
	}
	cm, err := lab.Client().CoreV1().ConfigMaps(CiliumNamespace).Get(ctx, "cilium-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The real chart turns the values into the agent's settings.
	if cm.Data["kube-proxy-replacement"] != "true" || cm.Data["ipam"] != "kubernetes" {
		t.Fatalf("cilium-config: kube-proxy-replacement=%q ipam=%q", cm.Data["kube-proxy-replacement"], cm.Data["ipam"])
	}
	ds, err := lab.Client().AppsV1().DaemonSets(CiliumNamespace).Get(ctx, "cilium", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, c := range ds.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
	}
	if env["KUBERNETES_SERVICE_HOST"] != "localhost" || env["KUBERNETES_SERVICE_PORT"] != "7445" {
		t.Fatalf("agent API endpoint %s:%s, want KubePrism localhost:7445", env["KUBERNETES_SERVICE_HOST"], env["KUBERNETES_SERVICE_PORT"])
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
