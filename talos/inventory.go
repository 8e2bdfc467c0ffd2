package talos

import (
	"context"
	"fmt"
	"slices"

	"github.com/fluxcd/cli-utils/pkg/object"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
)

// The bootstrap manifests' inventory, kept as talosctl upgrade-k8s keeps
// it: Talos creates every bootstrap object with the owning-inventory
// annotation and records it in a ConfigMap
// (internal/app/machined/pkg/controllers/k8s/manifest_apply.go at v1.13.3),
// and upgrade-k8s syncs them through go-kubernetes' SSA manager
// (pkg/cluster/kubernetes/talos_managed.go syncManifestsSSA;
// siderolabs/go-kubernetes v0.2.37 kubernetes/ssa, which the proxy does
// not serve as a module: its rules are followed here).

// InventoryAnnotation marks the inventory that owns an object
// (go-kubernetes kubernetes/ssa/inventory.go InventoryAnnotationKey).
const InventoryAnnotation = "config.k8s.io/owning-inventory"

// BootstrapInventory is the inventory's ID, and the name of its ConfigMap
// in kube-system (machinery constants KubernetesBootstrapManifestsInventoryName,
// KubernetesInventoryNamespace).
const BootstrapInventory = constants.KubernetesBootstrapManifestsInventoryName

// InventoryPolicy says which live objects a sync may take over or prune
// (go-kubernetes kubernetes/ssa/inventory_policy.go).
type InventoryPolicy string

// Inventory policies. upgrade-k8s defaults to AdoptIfNoInventory
// (cmd/talosctl/cmd/talos/upgrade-k8s.go --manifests-inventory-policy).
const (
	InventoryMustMatch          InventoryPolicy = "MustMatch"
	InventoryAdoptIfNoInventory InventoryPolicy = "AdoptIfNoInventory"
	InventoryAdoptAll           InventoryPolicy = "AdoptAll"
)

// CheckInventoryPolicy is checkInventoryPolicy: an object whose annotation
// names this inventory may always be changed or pruned; one without the
// annotation unless the policy is MustMatch; one owned by another
// inventory only under AdoptAll.
func CheckInventoryPolicy(obj *unstructured.Unstructured, policy InventoryPolicy) error {
	value, found := obj.GetAnnotations()[InventoryAnnotation]
	switch {
	case found && value == BootstrapInventory:
		return nil
	case !found && policy != InventoryMustMatch:
		return nil
	case found && policy == InventoryAdoptAll:
		return nil
	}
	status := "NoMatch"
	if !found {
		status = "Empty"
	}
	return fmt.Errorf("inventory policy prevented actuation of %s %s/%s (status: %s, policy: %s)", obj.GetKind(), obj.GetNamespace(), obj.GetName(), status, policy)
}

// AnnotateForInventory sets the owning-inventory annotation on every
// object before it is diffed or applied (prepareObjects in
// kubernetes/ssa/apply.go): applied by the field manager that set it at
// creation, an object without it would lose it. An object that names
// another inventory is an error.
func AnnotateForInventory(objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		ann := o.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		if v, ok := ann[InventoryAnnotation]; ok && v != BootstrapInventory {
			return fmt.Errorf("%s %s/%s already has an inventory annotation (%s)", o.GetKind(), o.GetNamespace(), o.GetName(), v)
		}
		ann[InventoryAnnotation] = BootstrapInventory
		o.SetAnnotations(ann)
	}
	return nil
}

// ObjRef is the inventory's key for an object.
func ObjRef(o *unstructured.Unstructured) object.ObjMetadata {
	return object.ObjMetadata{Namespace: o.GetNamespace(), Name: o.GetName(), GroupKind: o.GroupVersionKind().GroupKind()}
}

// ReadInventory lists the objects the inventory ConfigMap records (its
// data keys are cli-utils ObjMetadata strings, the values empty:
// internal/inventory/configmap/inventory.go); exists is false when there
// is no ConfigMap yet.
func ReadInventory(ctx context.Context, cs kubernetes.Interface) (refs object.ObjMetadataSet, exists bool, err error) {
	cm, err := cs.CoreV1().ConfigMaps(constants.KubernetesInventoryNamespace).Get(ctx, BootstrapInventory, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("reading the inventory %s/%s: %w", constants.KubernetesInventoryNamespace, BootstrapInventory, err)
	}
	keys := make([]string, 0, len(cm.Data))
	for k := range cm.Data {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		ref, err := object.ParseObjMetadata(k)
		if err != nil {
			return nil, true, fmt.Errorf("the inventory %s/%s: %w", constants.KubernetesInventoryNamespace, BootstrapInventory, err)
		}
		refs = append(refs, ref)
	}
	return refs, true, nil
}

// WriteInventory replaces what the inventory ConfigMap records with refs,
// creating it first when it does not exist (GetInventory then Write).
func WriteInventory(ctx context.Context, cs kubernetes.Interface, refs object.ObjMetadataSet) error {
	cms := cs.CoreV1().ConfigMaps(constants.KubernetesInventoryNamespace)
	meta := metav1.ObjectMeta{Name: BootstrapInventory, Namespace: constants.KubernetesInventoryNamespace}
	if _, err := cms.Get(ctx, BootstrapInventory, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: meta}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating the inventory %s/%s: %w", meta.Namespace, meta.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("reading the inventory %s/%s: %w", meta.Namespace, meta.Name, err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: meta, Data: make(map[string]string, len(refs))}
	for _, r := range refs {
		cm.Data[r.String()] = ""
	}
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating the inventory %s/%s: %w", meta.Namespace, meta.Name, err)
	}
	return nil
}

// PruneRefs are the objects the inventory records that objs no longer
// render (calculatePruneObjects): a sync deletes them.
func PruneRefs(inv object.ObjMetadataSet, objs []*unstructured.Unstructured) object.ObjMetadataSet {
	var out object.ObjMetadataSet
	for _, r := range inv {
		if !slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool { return ObjRef(o) == r }) {
			out = append(out, r)
		}
	}
	return out
}
