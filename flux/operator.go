package flux

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// FluxInstanceGVK is the Flux Operator's FluxInstance: the one object
// (named flux, in the operator's namespace) from which the operator
// installs, upgrades and reconciles Flux itself (the Flux Operator's
// FluxInstance documentation, fluxcd.controlplane.io/v1).
var FluxInstanceGVK = schema.GroupVersionKind{Group: "fluxcd.controlplane.io", Version: "v1", Kind: "FluxInstance"}

// OperatorInstances names ("namespace/name") the FluxInstances on the
// cluster: a Flux the operator manages, which applying Flux's release
// manifests over would fight on every controller. A cluster without the
// operator's CRD has none.
func (c *Client) OperatorInstances(ctx context.Context) ([]string, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(FluxInstanceGVK.GroupVersion().WithKind(FluxInstanceGVK.Kind + "List"))
	err := c.kube.List(ctx, list)
	if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("looking for a Flux Operator's FluxInstance: %w", err)
	}
	out := make([]string, 0, len(list.Items))
	for _, it := range list.Items {
		out = append(out, it.GetNamespace()+"/"+it.GetName())
	}
	return out, nil
}
