package infra

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/homelab/bootstrap/flux"
	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
	"github.com/homelab/bootstrap/lab/ociregistry"
)

// TestHandedOverOCIRepositoryIsReconciled: a release the infra stage
// installed from a plain-HTTP OCI registry (Helm's client falls back to
// HTTP on its own) is handed over, and the real source-controller and
// helm-controller take it: the HelmRepository says `insecure: true`,
// without which source-controller speaks only HTTPS to the registry and
// the HelmRelease never gets its chart.
func TestHandedOverOCIRepositoryIsReconciled(t *testing.T) {
	helmHome(t)
	kubetest.Binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	lab := kubetest.Start(t, kube.Options{ScheduleOnControlPlanes: true, Flux: true})
	if err := lab.RegisterNode(ctx, "cp-1", "127.0.0.11", kube.RoleControlPlane); err != nil {
		t.Fatal(err)
	}
	if err := lab.WaitNodesReady(ctx, []string{"cp-1"}, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	reg, err := ociregistry.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	if err := reg.PushChart("charts", demoChart("1.0.0")); err != nil {
		t.Fatal(err)
	}
	h, err := NewHelm(lab.AdminKubeconfigPath(), kubetest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	r := Release{Name: "demo", Namespace: "demo-oci", RepoURL: reg.RepoURL("charts"), Chart: "demo", Version: "1.0.0", Values: map[string]any{"greeting": "oci"}, Timeout: time.Minute}
	planAndApply(t, ctx, h, r, ActionInstall)

	plain, err := OCIPlainHTTP(ctx, r.RepoURL)
	if err != nil || !plain {
		t.Fatalf("the lab registry is plain HTTP; the probe says %v %v", plain, err)
	}
	out, err := Handover{Namespace: "flux-system", Interval: time.Minute, PlainHTTP: map[string]bool{r.RepoURL: plain}}.Manifest([]Release{r})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "insecure: true") {
		t.Fatalf("handover for a plain-HTTP registry:\n%s", out)
	}
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(string(out), "---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	c, err := flux.NewClient(lab.AdminKubeconfigPath(), kubetest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Apply(ctx, objs, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitAllReady(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	p, err := h.Plan(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if p.Deployed == nil || p.Deployed.Version != 2 {
		t.Fatalf("after the takeover: %+v; want the release upgraded in place by helm-controller (revision 2)", p.Deployed)
	}
}
