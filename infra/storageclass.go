package infra

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/releaseutil"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// Annotations that mark a StorageClass as the cluster default.
const (
	DefaultClassAnnotation     = "storageclass.kubernetes.io/is-default-class"
	BetaDefaultClassAnnotation = "storageclass.beta.kubernetes.io/is-default-class"
)

// IsDefault reports whether sc claims to be the default class.
func IsDefault(sc *storagev1.StorageClass) bool {
	return sc.Annotations[DefaultClassAnnotation] == "true" || sc.Annotations[BetaDefaultClassAnnotation] == "true"
}

// ClassSpec is what the NFS StorageClass must look like. Provisioner,
// parameters and reclaim policy cannot change once the class exists.
type ClassSpec struct {
	Name          string
	Provisioner   string
	Parameters    map[string]string
	ReclaimPolicy string
	// VolumeBindingMode is immutable too (kubernetes v1.36.1
	// pkg/apis/storage/validation ValidateStorageClassUpdate); unset is
	// stored as Immediate (pkg/apis/storage/v1/defaults.go).
	VolumeBindingMode string
}

// ClassIn returns the StorageClass a rendered release manifest creates,
// false when it creates none. The class is read from what the chart renders
// with the merged values (a values file may set pathPattern or onDelete),
// not rebuilt from the config.
func ClassIn(manifest string) (ClassSpec, bool, error) {
	for _, doc := range releaseutil.SplitManifests(manifest) {
		var sc storagev1.StorageClass
		if err := yaml.Unmarshal([]byte(doc), &sc); err != nil {
			return ClassSpec{}, false, fmt.Errorf("reading the rendered manifest: %w", err)
		}
		if sc.Kind != "StorageClass" {
			continue
		}
		spec := ClassSpec{Name: sc.Name, Provisioner: sc.Provisioner, Parameters: sc.Parameters, ReclaimPolicy: string(storagev1DefaultReclaim),
			VolumeBindingMode: string(storagev1.VolumeBindingImmediate)}
		if sc.ReclaimPolicy != nil {
			spec.ReclaimPolicy = string(*sc.ReclaimPolicy)
		}
		if sc.VolumeBindingMode != nil {
			spec.VolumeBindingMode = string(*sc.VolumeBindingMode)
		}
		return spec, true, nil
	}
	return ClassSpec{}, false, nil
}

// storagev1DefaultReclaim is what the API server fills in for a class
// without reclaimPolicy (pkg/apis/storage/v1/defaults.go: Delete).
const storagev1DefaultReclaim = corev1.PersistentVolumeReclaimDelete

// Helm's ownership metadata: Helm installs over an existing object only
// when it carries all three for the release (checkOwnership in
// pkg/action/validate.go at helm v3.22.0).
const (
	HelmManagedByLabel             = "app.kubernetes.io/managed-by"
	HelmReleaseNameAnnotation      = "meta.helm.sh/release-name"
	HelmReleaseNamespaceAnnotation = "meta.helm.sh/release-namespace"
)

// CheckClass looks at an existing class of the wanted name before the
// chart is installed or upgraded: one whose immutable fields differ can
// never be updated, and one that release does not own makes Helm refuse
// the install with its ownership error. Both are reported with what to do.
// It returns whether the class exists.
func CheckClass(ctx context.Context, cs kubernetes.Interface, want ClassSpec, owner Release) (bool, error) {
	sc, err := cs.StorageV1().StorageClasses().Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var diffs []string
	if sc.Provisioner != want.Provisioner {
		diffs = append(diffs, fmt.Sprintf("provisioner %q (want %q)", sc.Provisioner, want.Provisioner))
	}
	if !maps.Equal(sc.Parameters, want.Parameters) {
		diffs = append(diffs, fmt.Sprintf("parameters %v (want %v)", sc.Parameters, want.Parameters))
	}
	if sc.ReclaimPolicy != nil && string(*sc.ReclaimPolicy) != want.ReclaimPolicy {
		diffs = append(diffs, fmt.Sprintf("reclaimPolicy %s (want %s)", *sc.ReclaimPolicy, want.ReclaimPolicy))
	}
	if sc.VolumeBindingMode != nil && want.VolumeBindingMode != "" && string(*sc.VolumeBindingMode) != want.VolumeBindingMode {
		diffs = append(diffs, fmt.Sprintf("volumeBindingMode %s (want %s)", *sc.VolumeBindingMode, want.VolumeBindingMode))
	}
	if len(diffs) > 0 {
		return true, fmt.Errorf("StorageClass %s already exists with %s; these fields are immutable, so it cannot be updated: "+
			"delete it (kubectl delete storageclass %s; existing volumes keep working) or set storage.nfs.storageClass to another name",
			want.Name, strings.Join(diffs, ", "), want.Name)
	}
	if sc.Labels[HelmManagedByLabel] != "Helm" || sc.Annotations[HelmReleaseNameAnnotation] != owner.Name || sc.Annotations[HelmReleaseNamespaceAnnotation] != owner.Namespace {
		return true, fmt.Errorf("StorageClass %s already exists but Helm release %s/%s does not own it (it lacks %s=Helm, %s=%s, %s=%s), so Helm would refuse to install over it. "+
			"It matches what the chart creates: hand it to the release with\n"+
			"  kubectl label storageclass %s %s=Helm --overwrite\n"+
			"  kubectl annotate storageclass %s %s=%s %s=%s --overwrite\n"+
			"or delete it (kubectl delete storageclass %s; existing volumes keep working), or set storage.nfs.storageClass to another name",
			want.Name, owner.Namespace, owner.Name, HelmManagedByLabel, HelmReleaseNameAnnotation, owner.Name, HelmReleaseNamespaceAnnotation, owner.Namespace,
			want.Name, HelmManagedByLabel, want.Name, HelmReleaseNameAnnotation, owner.Name, HelmReleaseNamespaceAnnotation, owner.Namespace, want.Name)
	}
	return true, nil
}

// OtherDefaults lists the classes other than keep that claim to be default.
func OtherDefaults(ctx context.Context, cs kubernetes.Interface, keep string) ([]string, error) {
	list, err := cs.StorageV1().StorageClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []string
	for i := range list.Items {
		if sc := &list.Items[i]; sc.Name != keep && IsDefault(sc) {
			out = append(out, sc.Name)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Demote removes the default-class annotations from a class.
func Demote(ctx context.Context, cs kubernetes.Interface, name string) error {
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:null,%q:null}}}`, DefaultClassAnnotation, BetaDefaultClassAnnotation)
	_, err := cs.StorageV1().StorageClasses().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// IsDefaultNamed reports whether the named class exists and is default.
func IsDefaultNamed(ctx context.Context, cs kubernetes.Interface, name string) (bool, error) {
	sc, err := cs.StorageV1().StorageClasses().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	return IsDefault(sc), nil
}

// MakeDefault sets the default-class annotation on a class (someone may
// have removed it since the chart set it).
func MakeDefault(ctx context.Context, cs kubernetes.Interface, name string) error {
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, DefaultClassAnnotation)
	_, err := cs.StorageV1().StorageClasses().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}
