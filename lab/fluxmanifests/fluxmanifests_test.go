package fluxmanifests_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/flux2/v2/pkg/manifestgen/install"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/lab/fluxmanifests"
	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
)

func sources(t *testing.T) fluxmanifests.Sources {
	t.Helper()
	b := kubetest.Binaries(t)
	src, err := fluxmanifests.SourcesFromBinaries(context.Background(), b)
	if err != nil {
		kubetest.Unavailable(t, err.Error())
	}
	return src
}

func untar(t *testing.T, tgz []byte) map[string]string {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		out[h.Name] = string(data)
	}
}

func objects(t *testing.T, multi string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, doc := range strings.Split(multi, "\n---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("bad YAML: %v", err)
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
	return out
}

func TestTarballLaidOutLikeARelease(t *testing.T) {
	src := sources(t)
	tgz, err := fluxmanifests.Build(src)
	if err != nil {
		t.Fatal(err)
	}
	again, err := fluxmanifests.Build(src)
	if err != nil || !bytes.Equal(tgz, again) {
		t.Errorf("two builds differ (err %v)", err)
	}
	files := untar(t, tgz)
	var names []string
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	if strings.Join(names, " ") != "helm-controller.yaml kustomize-controller.yaml notification-controller.yaml policies.yaml rbac.yaml source-controller.yaml" {
		t.Fatalf("tarball holds %v", names)
	}
	for _, c := range fluxmanifests.Components {
		kinds := map[string][]string{}
		for _, o := range objects(t, files[c+".yaml"]) {
			kinds[o.GetKind()] = append(kinds[o.GetKind()], o.GetName())
			if o.GetKind() == "Deployment" {
				spec := o.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
				ctr := spec["containers"].([]any)[0].(map[string]any)
				if want := "fluxcd/" + c + ":" + src.ControllerVersions[c]; ctr["image"] != want {
					t.Errorf("%s image %v, want %s", c, ctr["image"], want)
				}
				args := ctr["args"].([]any)
				// The distribution points every controller but the
				// events receiver itself at notification-controller
				// (flux2 manifests/bases/*/patch.yaml).
				if c != "notification-controller" && !strings.HasPrefix(fmt.Sprint(args[0]), "--events-addr=") {
					t.Errorf("%s args %v: the distribution's patch (events-addr first) is missing", c, args)
				}
				if spec["serviceAccountName"] != c {
					t.Errorf("%s serviceAccountName %v", c, spec["serviceAccountName"])
				}
			}
			if labels := o.GetLabels(); labels["app.kubernetes.io/part-of"] != "flux" {
				t.Errorf("%s %s/%s lacks the distribution's labels: %v", c, o.GetKind(), o.GetName(), labels)
			}
		}
		if len(kinds["CustomResourceDefinition"]) == 0 || len(kinds["Deployment"]) != 1 || len(kinds["ServiceAccount"]) != 1 {
			t.Errorf("%s.yaml kinds %v", c, kinds)
		}
	}
	if !strings.Contains(files["rbac.yaml"], "name: cluster-reconciler") || !strings.Contains(files["policies.yaml"], "kind: NetworkPolicy") {
		t.Error("rbac.yaml or policies.yaml lack the distribution's objects")
	}
}

// applyAll server-side applies objects like `kubectl apply --server-side`:
// CRDs and Namespaces first, then the rest once their kinds are known.
func applyAll(t *testing.T, c *kube.Cluster, objs []*unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(c.RESTConfig())
	disc := memory.NewMemCacheClient(c.Client().Discovery())
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(disc)
	apply := func(o *unstructured.Unstructured) error {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return err
		}
		data, err := o.MarshalJSON()
		if err != nil {
			return err
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		_, err = ri.Patch(ctx, o.GetName(), "application/apply-patch+yaml", data, metav1.PatchOptions{FieldManager: "lab-test", Force: ptr(true)})
		return err
	}
	var rest []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" || o.GetKind() == "Namespace" {
			if err := apply(o); err != nil {
				t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
			}
			continue
		}
		rest = append(rest, o)
	}
	err := wait.Until(ctx, wait.Spec{What: "Flux kinds served", Timeout: 30 * time.Second, Interval: 200 * time.Millisecond},
		func(ctx context.Context) (bool, string, error) {
			disc.Invalidate()
			mapper.Reset()
			for _, o := range rest {
				gvk := o.GroupVersionKind()
				if _, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
					return false, err.Error(), nil
				}
			}
			return true, "", nil
		})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range rest {
		if err := apply(o); err != nil {
			t.Fatalf("applying %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestManifestgenInstallsFromTheLabTarball(t *testing.T) {
	src := sources(t)
	tgz, err := fluxmanifests.Build(src)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := fluxmanifests.Serve(fluxmanifests.ServeOptions{Version: src.Flux2Version, Tarball: tgz, Log: kubetest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	opts := install.MakeDefaultOptions()
	opts.BaseURL = srv.BaseURL()
	opts.Version = srv.Version()
	opts.Components = fluxmanifests.Components
	opts.ComponentsExtra = nil
	manifest, err := install.Generate(opts, "")
	if err != nil {
		t.Fatalf("flux2 manifestgen from %s: %v", srv.URL(), err)
	}
	if srv.Downloads() != 1 {
		t.Errorf("tarball downloaded %d times, want 1", srv.Downloads())
	}

	c := kubetest.Start(t, kube.Options{})
	ctx := context.Background()
	if err := c.RegisterNode(ctx, "w-1", "10.5.0.21", kube.RoleWorker); err != nil {
		t.Fatal(err)
	}
	applyAll(t, c, objects(t, manifest.Content))

	for _, d := range fluxmanifests.Components {
		err := wait.Until(ctx, wait.Spec{What: "Deployment flux-system/" + d + " Available", Timeout: 60 * time.Second, Interval: 200 * time.Millisecond},
			func(ctx context.Context) (bool, string, error) {
				dep, err := c.Client().AppsV1().Deployments(kube.FluxNamespace).Get(ctx, d, metav1.GetOptions{})
				if err != nil {
					return false, err.Error(), nil
				}
				for _, cond := range dep.Status.Conditions {
					if cond.Type == appsv1.DeploymentAvailable && cond.Status == corev1.ConditionTrue {
						return true, "", nil
					}
				}
				return false, fmt.Sprintf("%d/%d available", dep.Status.AvailableReplicas, dep.Status.Replicas), nil
			})
		if err != nil {
			t.Fatal(err)
		}
		dep, _ := c.Client().AppsV1().Deployments(kube.FluxNamespace).Get(ctx, d, metav1.GetOptions{})
		if img := dep.Spec.Template.Spec.Containers[0].Image; img != "ghcr.io/fluxcd/"+d+":"+src.ControllerVersions[d] {
			t.Errorf("%s runs image %s", d, img)
		}
	}

	// The real controllers then run as lab processes against the CRDs the
	// install put there.
	if err := c.StartFlux(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.Healthy(ctx); err != nil {
		t.Fatal(err)
	}
}
