package kube_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
)

const helmIndex = `apiVersion: v1
entries:
  hello:
  - apiVersion: v2
    name: hello
    version: 0.1.0
    urls:
    - hello-0.1.0.tgz
    digest: 0000000000000000000000000000000000000000000000000000000000000000
    created: "2026-01-01T00:00:00Z"
generated: "2026-01-01T00:00:00Z"
`

// readyCondition returns the Ready condition's status, reason and message.
func readyCondition(u *unstructured.Unstructured) (status, reason, message string) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Ready" {
			return fmt.Sprint(m["status"]), fmt.Sprint(m["reason"]), fmt.Sprint(m["message"])
		}
	}
	return "", "", ""
}

func TestFluxControllers(t *testing.T) {
	ctx := context.Background()
	// Another lab's kustomize-controller at work in the machine's /tmp.
	canary, err := os.MkdirTemp("", "kustomization-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(canary)
	c := kubetest.Start(t, kube.Options{Flux: true})
	t.Logf("MEASURE lab start with Flux: %s", c.StartupTime().Round(10*time.Millisecond))
	if n := len(c.Processes()); n != 8 {
		t.Fatalf("%d processes, want 8 with the Flux controllers", n)
	}
	// kustomize-controller lists what it takes for its own leftovers
	// before it starts its manager (v1.9.5 main.go purgeStaleTempDirs),
	// so by /readyz it has decided: in a /tmp of its own it finds none.
	for _, p := range c.Processes() {
		if p.Name != "kustomize-controller" {
			continue
		}
		log, err := os.ReadFile(p.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(log), "purging stale tmp dirs") {
			t.Errorf("kustomize-controller purges the machine's /tmp (another lab's work dirs): %s", p.LogPath)
		}
	}
	if _, err := os.Stat(canary); err != nil {
		t.Errorf("another lab's kustomize-controller work dir: %v", err)
	}
	dyn := dynamic.NewForConfigOrDie(c.RESTConfig())

	var indexHits int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/index.yaml" {
			http.NotFound(w, r)
			return
		}
		indexHits++
		w.Header().Set("Content-Type", "application/yaml")
		_, _ = w.Write([]byte(helmIndex))
	}))
	defer srv.Close()

	helmRepos := dyn.Resource(schema.GroupVersionResource{Group: "source.toolkit.fluxcd.io", Version: "v1", Resource: "helmrepositories"}).Namespace(kube.FluxNamespace)
	hr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "source.toolkit.fluxcd.io/v1",
		"kind":       "HelmRepository",
		"metadata":   map[string]any{"name": "lab", "namespace": kube.FluxNamespace},
		"spec":       map[string]any{"url": srv.URL, "interval": "1m"},
	}}
	start := time.Now()
	if _, err := helmRepos.Create(ctx, hr, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "HelmRepository lab Ready (source-controller fetched the index)", 60*time.Second, func(ctx context.Context) (bool, string, error) {
		u, err := helmRepos.Get(ctx, "lab", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		st, reason, msg := readyCondition(u)
		return st == "True", st + " " + reason + ": " + msg, nil
	})
	t.Logf("MEASURE HelmRepository Ready %s after create", time.Since(start).Round(10*time.Millisecond))
	if indexHits == 0 {
		t.Error("source-controller reported Ready without fetching index.yaml")
	}

	ks := dyn.Resource(schema.GroupVersionResource{Group: "kustomize.toolkit.fluxcd.io", Version: "v1", Resource: "kustomizations"}).Namespace(kube.FluxNamespace)
	k := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kustomize.toolkit.fluxcd.io/v1",
		"kind":       "Kustomization",
		"metadata":   map[string]any{"name": "apps", "namespace": kube.FluxNamespace},
		"spec": map[string]any{
			"interval":  "1m",
			"path":      "./",
			"prune":     true,
			"sourceRef": map[string]any{"kind": "GitRepository", "name": "missing"},
		},
	}}
	if _, err := ks.Create(ctx, k, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "kustomize-controller reporting the missing source", 60*time.Second, func(ctx context.Context) (bool, string, error) {
		u, err := ks.Get(ctx, "apps", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		st, reason, msg := readyCondition(u)
		return st == "False" && strings.Contains(msg, "not found"), st + " " + reason + ": " + msg, nil
	})

	// helm-controller reconciles: a HelmRelease whose chart source is
	// missing gets a Ready=False condition written by the controller.
	hrs := dyn.Resource(schema.GroupVersionResource{Group: "helm.toolkit.fluxcd.io", Version: "v2", Resource: "helmreleases"}).Namespace(kube.FluxNamespace)
	rel := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "helm.toolkit.fluxcd.io/v2",
		"kind":       "HelmRelease",
		"metadata":   map[string]any{"name": "app", "namespace": kube.FluxNamespace},
		"spec": map[string]any{
			"interval": "1m",
			"chart": map[string]any{"spec": map[string]any{
				"chart":     "app",
				"sourceRef": map[string]any{"kind": "HelmRepository", "name": "missing"},
			}},
		},
	}}
	if _, err := hrs.Create(ctx, rel, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "helm-controller reporting on the HelmRelease", 60*time.Second, func(ctx context.Context) (bool, string, error) {
		u, err := hrs.Get(ctx, "app", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		st, reason, msg := readyCondition(u)
		return st == "False" || st == "Unknown" && reason != "", st + " " + reason + ": " + msg, nil
	})
}
