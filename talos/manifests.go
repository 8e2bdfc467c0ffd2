package talos

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// BootstrapManifests reads the bootstrap manifests a control plane renders
// from its config (kube-proxy, CoreDNS, flannel, RBAC: its k8s.Manifest
// resources in the controlplane namespace, which ManifestController keeps
// current), in ID order, as talosctl upgrade-k8s reads them before it
// syncs them (pkg/cluster/kubernetes/talos_managed.go getManifests at
// v1.13.3). Talos itself only creates the ones missing from the cluster
// (ManifestApplyController), so without a sync a Kubernetes upgrade leaves
// kube-proxy at its first version.
func (o *Ops) BootstrapManifests(ctx context.Context, cp Target) ([]*unstructured.Unstructured, error) {
	type manifest struct {
		id      string
		objects []*unstructured.Unstructured
	}
	var ms []manifest
	err := o.callRetrying(ctx, cp.IP, "reading the bootstrap manifests of "+cp.String(), func(ctx context.Context, c *client.Client) error {
		list, err := safe.StateListAll[*k8s.Manifest](ctx, c.COSI)
		if err != nil {
			return err
		}
		ms = ms[:0]
		for r := range list.All() {
			m := manifest{id: r.Metadata().ID()}
			for _, item := range r.TypedSpec().Items {
				// Through JSON: the decoded spec may hold Go types
				// (int, []map) unstructured does not take.
				b, err := json.Marshal(item.Object)
				if err != nil {
					return fmt.Errorf("manifest %s: %w", m.id, err)
				}
				u := &unstructured.Unstructured{}
				if err := u.UnmarshalJSON(b); err != nil {
					return fmt.Errorf("manifest %s: %w", m.id, err)
				}
				m.objects = append(m.objects, u)
			}
			ms = append(ms, m)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].id < ms[j].id })
	var out []*unstructured.Unstructured
	for _, m := range ms {
		out = append(out, m.objects...)
	}
	return out, nil
}
