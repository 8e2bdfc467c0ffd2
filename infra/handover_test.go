package infra

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"sigs.k8s.io/yaml"
)

// fakeHelm answers FluxOwner from the given HelmRelease objects.
func fakeHelm(objs ...runtime.Object) *Helm {
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{helmReleaseGVR: "HelmReleaseList"}, objs...)
	return &Helm{dyn: dyn}
}

// handoverObjects decodes Handover.Manifest's documents.
func handoverObjects(t *testing.T, rels ...Release) []*unstructured.Unstructured {
	t.Helper()
	out, err := Handover{Namespace: "flux-system", Interval: 10 * time.Minute}.Manifest(rels)
	if err != nil {
		t.Fatal(err)
	}
	return manifestObjects(t, out)
}

// manifestObjects decodes the documents of a handover manifest.
func manifestObjects(t *testing.T, out []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(string(out), "---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("bad YAML %v:\n%s", err, doc)
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
	return objs
}

// The objects `bootstrap handover` prints are the ones FluxOwner then
// recognises: the HelmRelease names the release and namespaces the infra
// stage installed, with its chart version and values.
func TestHandoverIsRecognisedAsTheOwner(t *testing.T) {
	nfs := NFSProvisioner(NFSOptions{Server: "10.0.20.5", Path: "/export/k8s", StorageClass: "nfs-storage", ReclaimPolicy: "Delete",
		RepoURL: "https://kubernetes-sigs.github.io/nfs-subdir-external-provisioner/", Version: "4.0.18"})
	cilium := Cilium(CiliumOptions{RepoURL: "https://helm.cilium.io/", Version: "1.18.4", APIHost: KubePrismHost, APIPort: 7445, Nodes: 1})
	objs := handoverObjects(t, cilium, nfs)
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind()+" "+o.GetName())
	}
	if got := strings.Join(kinds, ", "); got != "HelmRepository cilium, HelmRelease cilium, HelmRepository nfs-subdir-external-provisioner, HelmRelease nfs-provisioner" {
		t.Fatalf("handover objects: %s", got)
	}
	// The CNI's objects are never pruned; the others are.
	for i, o := range objs {
		if got, want := o.GetAnnotations()[PruneAnnotation], map[bool]string{true: PruneDisabled, false: ""}[i < 2]; got != want {
			t.Errorf("%s %s: %s=%q, want %q", o.GetKind(), o.GetName(), PruneAnnotation, got, want)
		}
	}
	hr := objs[3]
	if v, _, _ := unstructured.NestedBool(hr.Object, "spec", "install", "createNamespace"); !v {
		t.Error("the HelmRelease does not create its target namespace on a cluster rebuilt from the repository")
	}
	if v, _, _ := unstructured.NestedString(hr.Object, "spec", "chart", "spec", "version"); v != "4.0.18" {
		t.Errorf("chart version %q", v)
	}
	if v, _, _ := unstructured.NestedString(hr.Object, "spec", "values", "storageClass", "provisionerName"); v != NFSProvisionerName {
		t.Errorf("values not carried over: storageClass.provisionerName %q", v)
	}
	if _, ok, _ := unstructured.NestedFieldNoCopy(hr.Object, "status"); ok {
		t.Error("the manifest carries a status")
	}
	h := fakeHelm(objs[1], objs[3])
	for _, rel := range []Release{nfs, cilium} {
		owner, ok, err := h.FluxOwner(context.Background(), rel)
		if err != nil || !ok || owner.Namespace != "flux-system" || owner.Name != rel.Name {
			t.Errorf("FluxOwner(%s) = %+v, %v, %v", rel.Name, owner, ok, err)
		}
	}
}

// A HelmRelease with a target namespace and no release name makes
// helm-controller use "<targetNamespace>-<name>" (HelmRelease.GetReleaseName
// at v1.6.4): another release, which does not own ours.
func TestFluxOwnerFollowsHelmControllersReleaseName(t *testing.T) {
	nfs := NFSProvisioner(NFSOptions{Server: "a", Path: "/p", Version: "4.0.18"})
	hr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "helm.toolkit.fluxcd.io/v2", "kind": "HelmRelease",
		"metadata": map[string]any{"name": "nfs-provisioner", "namespace": "flux-system"},
		"spec":     map[string]any{"targetNamespace": "nfs-provisioner", "storageNamespace": "nfs-provisioner"},
	}}
	if owner, ok, err := fakeHelm(hr).helmReleaseOwner(context.Background(), nfs); err != nil || ok {
		t.Errorf("FluxOwner = %+v, %v, %v: release nfs-provisioner-nfs-provisioner is not ours", owner, ok, err)
	}
	// In the HelmRelease's own namespace (no storageNamespace) it is not
	// ours either: Helm keeps the release record where the HelmRelease is.
	unstructured.SetNestedField(hr.Object, "nfs-provisioner", "spec", "releaseName")
	unstructured.RemoveNestedField(hr.Object, "spec", "storageNamespace")
	if owner, ok, err := fakeHelm(hr).helmReleaseOwner(context.Background(), nfs); err != nil || ok {
		t.Errorf("FluxOwner = %+v, %v, %v: a release stored in flux-system is not ours", owner, ok, err)
	}
	unstructured.SetNestedField(hr.Object, "nfs-provisioner", "spec", "storageNamespace")
	if _, ok, err := fakeHelm(hr).helmReleaseOwner(context.Background(), nfs); err != nil || !ok {
		t.Errorf("FluxOwner with releaseName and storageNamespace set: %v, %v", ok, err)
	}
}

func TestOriginLabels(t *testing.T) {
	manifest := "---\n# Source: x/templates/sa.yaml\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: a\n  labels:\n    app: x\n" +
		"---\n# Source: x/templates/deploy.yaml\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: b\n  labels:\n    helm.toolkit.fluxcd.io/name: nfs\n    helm.toolkit.fluxcd.io/namespace: infra\n"
	if o, ok := originLabels(manifest); !ok || o.Namespace != "infra" || o.Name != "nfs" {
		t.Errorf("originLabels = %+v, %v", o, ok)
	}
	if _, ok := originLabels(strings.ReplaceAll(manifest, "helm.toolkit.fluxcd.io", "example.com")); ok {
		t.Error("labels of another group taken for Flux's")
	}
}

// A release from an OCI registry is handed over with a HelmRepository of
// type oci: source-controller refuses an oci:// URL under the default type.
func TestHandoverOfAnOCIChart(t *testing.T) {
	cilium := Cilium(CiliumOptions{RepoURL: "oci://quay.io/cilium/charts", Version: "1.18.4", APIHost: KubePrismHost, APIPort: 7445, Nodes: 1})
	nfs := NFSProvisioner(NFSOptions{Server: "10.0.20.5", Path: "/export/k8s", StorageClass: "nfs-storage", ReclaimPolicy: "Delete",
		RepoURL: "https://kubernetes-sigs.github.io/nfs-subdir-external-provisioner/", Version: "4.0.18"})
	objs := handoverObjects(t, cilium, nfs)
	for _, o := range objs {
		if o.GetKind() != "HelmRepository" {
			continue
		}
		typ, _, _ := unstructured.NestedString(o.Object, "spec", "type")
		url, _, _ := unstructured.NestedString(o.Object, "spec", "url")
		if want := map[bool]string{true: "oci", false: ""}[strings.HasPrefix(url, "oci://")]; typ != want {
			t.Errorf("HelmRepository %s (%s): type %q, want %q", o.GetName(), url, typ, want)
		}
	}
}

// A HelmRepository is not re-fetched every flux.interval: its index is
// downloaded whole on each reconcile, and the versions are pinned.
func TestHandoverRepositoryInterval(t *testing.T) {
	nfs := NFSProvisioner(NFSOptions{Server: "10.0.20.5", Path: "/export/k8s", StorageClass: "nfs-storage", ReclaimPolicy: "Delete",
		RepoURL: "https://kubernetes-sigs.github.io/nfs-subdir-external-provisioner/", Version: "4.0.18"})
	for _, tc := range []struct{ interval, repo, release string }{
		{"1m0s", "10m0s", "1m0s"},
		{"30m0s", "30m0s", "30m0s"},
	} {
		d, _ := time.ParseDuration(tc.interval)
		out, err := Handover{Namespace: "flux-system", Interval: d}.Manifest([]Release{nfs})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range manifestObjects(t, out) {
			got, _, _ := unstructured.NestedString(o.Object, "spec", "interval")
			want := map[string]string{"HelmRepository": tc.repo, "HelmRelease": tc.release}[o.GetKind()]
			if got != want {
				t.Errorf("flux.interval %s: %s interval %s, want %s", tc.interval, o.GetKind(), got, want)
			}
		}
	}
}
