package infra

import (
	"bytes"
	"context"
	"fmt"
	"time"

	helmv2 "github.com/fluxcd/helm-controller/api/v2"
	sourcev1 "github.com/fluxcd/source-controller/api/v1"
	"helm.sh/helm/v3/pkg/releaseutil"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/homelab/bootstrap/kube"
)

// helmReleaseGVR is the HelmRelease kind of helm-controller v1.6.4 (the
// one flux2 v2.9.5 ships).
var helmReleaseGVR = schema.GroupVersionResource{Group: helmv2.GroupVersion.Group, Version: helmv2.GroupVersion.Version, Resource: "helmreleases"}

// fluxOriginLabel is the label helm-controller puts on every object it
// renders, naming the HelmRelease (postrender.NewOriginLabels at
// fluxcd/helm-controller v1.6.4: <group>/name and <group>/namespace,
// group helm.toolkit.fluxcd.io).
var fluxOriginLabel = helmv2.GroupVersion.Group + "/"

// Owner is the Flux HelmRelease that manages a release.
type Owner struct {
	Namespace, Name string
	// Evidence is how the ownership was seen.
	Evidence string
}

func (o Owner) String() string { return fmt.Sprintf("Flux HelmRelease %s/%s", o.Namespace, o.Name) }

// FluxOwner finds the Flux HelmRelease that manages the release r: a
// HelmRelease whose release name and storage namespace are r's (what
// helm-controller looks the release up by: HelmRelease.GetReleaseName and
// GetStorageNamespace), or, when none is there, the origin labels
// helm-controller left on the objects of r's last revision. helm-controller
// takes an existing release it has no history of as "Unmanaged" and
// upgrades it (internal/reconcile/state.go DetermineReleaseState at
// v1.6.4), and a revision written by anyone else makes it upgrade again:
// from then on the infra stage must only verify.
func (h *Helm) FluxOwner(ctx context.Context, r Release) (Owner, bool, error) {
	if o, ok, err := h.helmReleaseOwner(ctx, r); err != nil || ok {
		return o, ok, err
	}
	last, err := h.lastRelease(r)
	if err != nil || last == nil {
		return Owner{}, false, err
	}
	if o, ok := originLabels(last.Manifest); ok {
		o.Evidence = fmt.Sprintf("the labels on revision %d's objects (the HelmRelease itself is gone)", last.Version)
		return o, true, nil
	}
	return Owner{}, false, nil
}

// helmReleaseOwner finds a HelmRelease whose release is r.
func (h *Helm) helmReleaseOwner(ctx context.Context, r Release) (Owner, bool, error) {
	list, err := h.dyn.Resource(helmReleaseGVR).List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		// No HelmRelease CRD: Flux's helm-controller is not installed.
		return Owner{}, false, nil
	case err != nil:
		return Owner{}, false, fmt.Errorf("listing Flux HelmReleases: %w", err)
	}
	for _, u := range list.Items {
		var hr helmv2.HelmRelease
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &hr); err != nil {
			return Owner{}, false, fmt.Errorf("decoding HelmRelease %s/%s: %w", u.GetNamespace(), u.GetName(), err)
		}
		if hr.GetReleaseName() == r.Name && hr.GetStorageNamespace() == r.Namespace {
			return Owner{Namespace: hr.Namespace, Name: hr.Name, Evidence: "its release name and storage namespace"}, true, nil
		}
	}
	return Owner{}, false, nil
}

// originLabels reads the HelmRelease helm-controller named on the objects
// of a rendered release manifest.
func originLabels(manifest string) (Owner, bool) {
	for _, doc := range releaseutil.SplitManifests(manifest) {
		var m struct {
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
		}
		if yaml.Unmarshal([]byte(doc), &m) != nil {
			continue
		}
		name, ns := m.Metadata.Labels[fluxOriginLabel+"name"], m.Metadata.Labels[fluxOriginLabel+"namespace"]
		if name != "" && ns != "" {
			return Owner{Namespace: ns, Name: name}, true
		}
	}
	return Owner{}, false
}

// Handover is what a Flux repository needs to take over the releases the
// infra stage installed.
type Handover struct {
	// Namespace holds the HelmRepository and HelmRelease objects.
	Namespace string
	// Interval is their reconcile interval.
	Interval time.Duration
	// PlainHTTP names the oci:// repositories whose registry speaks
	// plain HTTP only (OCIPlainHTTP): their HelmRepository gets
	// `insecure: true`, without which source-controller cannot reach them.
	PlainHTTP map[string]bool
}

// RepositoryInterval is the shortest interval a handed-over HelmRepository
// gets: each reconcile of an index repository downloads and parses its
// whole index.yaml (source-controller v1.9.5 holds it in memory; Cilium's
// is megabytes), while the releases pin their chart versions, so a new
// index only matters when a version in git changes (`flux reconcile source
// helm NAME` fetches it at once). The HelmReleases keep flux.interval.
const RepositoryInterval = 10 * time.Minute

// PruneAnnotation, set to PruneDisabled, keeps kustomize-controller from
// deleting an object when it leaves the repository or its Kustomization is
// deleted (kustomize-controller v1.9.5 internal/controller/
// kustomization_controller.go: the prune Exclusions).
const (
	PruneAnnotation = "kustomize.toolkit.fluxcd.io/prune"
	PruneDisabled   = "disabled"
)

// Manifest renders, for each release, a HelmRepository for its chart
// repository and a HelmRelease that adopts it as it is installed: the same
// release name, target and storage namespace (what helm-controller looks
// the existing release up by), chart version and values, so the takeover
// upgrade changes nothing but the release's owner. Committed under
// flux.path, it makes Flux the owner and the infra stage a verifier.
func (o Handover) Manifest(rels []Release) ([]byte, error) {
	var docs [][]byte
	repos := map[string]string{}
	for _, r := range rels {
		repoName := r.Chart
		if prev, ok := repos[repoName]; ok && prev != r.RepoURL {
			repoName = r.Name
		}
		if _, ok := repos[repoName]; !ok {
			repos[repoName] = r.RepoURL
			repo := sourcev1.HelmRepository{
				TypeMeta:   metav1.TypeMeta{APIVersion: sourcev1.GroupVersion.String(), Kind: sourcev1.HelmRepositoryKind},
				ObjectMeta: metav1.ObjectMeta{Name: repoName, Namespace: o.Namespace, Annotations: essential(r)},
				Spec:       sourcev1.HelmRepositorySpec{URL: r.RepoURL, Interval: metav1.Duration{Duration: max(o.Interval, RepositoryInterval)}},
			}
			if IsOCI(r.RepoURL) {
				// source-controller refuses an oci:// URL in a HelmRepository
				// of the default type ("'oci' URL scheme cannot be used with
				// 'default' HelmRepository type": source-controller v1.9.5
				// internal/controller/helmrepository_controller.go).
				repo.Spec.Type = sourcev1.HelmRepositoryTypeOCI
				repo.Spec.Insecure = o.PlainHTTP[r.RepoURL]
			}
			b, err := cleanYAML(&repo)
			if err != nil {
				return nil, err
			}
			docs = append(docs, b)
		}
		values, err := jsonValues(r.Values)
		if err != nil {
			return nil, fmt.Errorf("release %s values: %w", r.Name, err)
		}
		hr := helmv2.HelmRelease{
			TypeMeta: metav1.TypeMeta{APIVersion: helmv2.GroupVersion.String(), Kind: helmv2.HelmReleaseKind},
			// An essential release (the CNI) is never pruned: deleting its
			// HelmRelease would uninstall it and cut every pod's network,
			// Flux's own included. Removing it is a deliberate two steps
			// (README: Handing the cluster to GitOps).
			ObjectMeta: metav1.ObjectMeta{Name: r.Name, Namespace: o.Namespace, Annotations: essential(r)},
			Spec: helmv2.HelmReleaseSpec{
				Interval:         metav1.Duration{Duration: o.Interval},
				ReleaseName:      r.Name,
				TargetNamespace:  r.Namespace,
				StorageNamespace: r.Namespace,
				Chart: &helmv2.HelmChartTemplate{Spec: helmv2.HelmChartTemplateSpec{
					Chart:     r.Chart,
					Version:   r.Version,
					SourceRef: helmv2.CrossNamespaceObjectReference{Kind: sourcev1.HelmRepositoryKind, Name: repoName},
				}},
				Values: values,
				// A cluster rebuilt from the repository installs before the
				// infra stage ever ran: helm-controller then creates the
				// target namespace, as the infra stage does
				// (helm-controller/api v1.6.4 Install.CreateNamespace).
				Install: &helmv2.Install{CreateNamespace: true},
			},
		}
		b, err := cleanYAML(&hr)
		if err != nil {
			return nil, err
		}
		docs = append(docs, b)
	}
	return bytes.Join(docs, []byte("---\n")), nil
}

// cleanYAML renders a typed object without the fields only a server
// fills (status, creationTimestamp).
func cleanYAML(obj runtime.Object) ([]byte, error) {
	u, err := kube.ApplyObject(obj)
	if err != nil {
		return nil, err
	}
	return yaml.Marshal(u.Object)
}

func jsonValues(v map[string]any) (*apiextensionsv1.JSON, error) {
	if len(v) == 0 {
		return nil, nil
	}
	b, err := yaml.Marshal(normalize(v))
	if err != nil {
		return nil, err
	}
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, err
	}
	return &apiextensionsv1.JSON{Raw: j}, nil
}

// essential returns the annotations that keep an essential release's
// objects from being pruned.
func essential(r Release) map[string]string {
	if !r.Essential {
		return nil
	}
	return map[string]string{PruneAnnotation: PruneDisabled}
}
