package infra

import (
	"strings"
	"testing"
	"time"

	"github.com/homelab/bootstrap/flux"
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
	lab, ctx := oneNodeLab(t, 3*time.Minute)
	reg, err := ociregistry.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	if err := reg.PushChart("charts", demoChart("1.0.0")); err != nil {
		t.Fatal(err)
	}
	h, err := NewHelm(kubetest.AdminKubeconfig(t, lab), "lab", kubetest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	r := Release{Name: "demo", Namespace: "demo-handover", RepoURL: reg.RepoURL("charts"), Chart: "demo", Version: "1.0.0", Values: map[string]any{"greeting": "oci"}, Timeout: time.Minute}
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
	objs := manifestObjects(t, out)
	c, err := flux.NewClient(lab.RESTConfig(), kubetest.Logger(t))
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
