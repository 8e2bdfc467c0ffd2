package infra

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"strings"

	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
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
}

// CheckClass looks for an existing class of that name that the chart could
// not take over because an immutable field differs. It returns whether the
// class exists.
func CheckClass(ctx context.Context, cs kubernetes.Interface, want ClassSpec) (bool, error) {
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
	if len(diffs) > 0 {
		return true, fmt.Errorf("StorageClass %s already exists with %s; these fields are immutable, so it cannot be updated: "+
			"delete it (kubectl delete storageclass %s; existing volumes keep working) or set storage.nfs.storageClass to another name",
			want.Name, strings.Join(diffs, ", "), want.Name)
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
