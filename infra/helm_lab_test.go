package infra

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/repo"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
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
		ch := &chart.Chart{
			Metadata:  &chart.Metadata{APIVersion: chart.APIVersionV2, Name: "demo", Version: v, Type: "application"},
			Values:    map[string]any{"greeting": "hello"},
			Templates: []*chart.File{{Name: "templates/deploy.yaml", Data: []byte(demoDeployment)}},
		}
		if _, err := chartutil.Save(ch, dir); err != nil {
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
	lab := kubetest.Start(t, kube.Options{ScheduleOnControlPlanes: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := lab.RegisterNode(ctx, "cp-1", "127.0.0.11", kube.RoleControlPlane); err != nil {
		t.Fatal(err)
	}
	url := chartRepo(t, "1.0.0", "1.1.0")
	h, err := NewHelm(lab.AdminKubeconfigPath(), kubetest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	r := Release{Name: "demo", Namespace: "demo-ns", RepoURL: url, Chart: "demo", Version: "1.0.0", Values: map[string]any{"greeting": "hi"}, Timeout: time.Minute}

	apply := func(want Action) *release.Release {
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
}
