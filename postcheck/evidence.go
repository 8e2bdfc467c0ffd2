package postcheck

import (
	"context"
	"fmt"
	"path"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/homelab/bootstrap/flux"
)

type evidenceSource struct {
	file      string
	gvr       schema.GroupVersionResource
	namespace string
}

// Evidence lists the cluster objects behind the checks as YAML files, keyed
// by their path in the archive. Secrets are never collected. A list that
// fails (a CRD not installed, the API down) is recorded as a file with the
// error instead, so the archive shows what could not be seen, as does a
// kubeconfig that load cannot read.
func Evidence(ctx context.Context, load func() (*rest.Config, error), fluxNS, pvcNS string) map[string][]byte {
	out := map[string][]byte{}
	cfg, err := load()
	var dyn dynamic.Interface
	if err == nil {
		dyn, err = dynamic.NewForConfig(cfg)
	}
	if err != nil {
		out["evidence/ERROR.txt"] = []byte(err.Error() + "\n")
		return out
	}
	core := func(r string) schema.GroupVersionResource {
		return schema.GroupVersionResource{Version: "v1", Resource: r}
	}
	sources := []evidenceSource{
		{"nodes.yaml", core("nodes"), ""},
		{"storageclasses.yaml", schema.GroupVersionResource{Group: "storage.k8s.io", Version: "v1", Resource: "storageclasses"}, ""},
		{"persistentvolumes.yaml", core("persistentvolumes"), ""},
		{path.Join(pvcNS, "persistentvolumeclaims.yaml"), core("persistentvolumeclaims"), pvcNS},
		{path.Join(pvcNS, "deployments.yaml"), schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, pvcNS},
		{path.Join(pvcNS, "events.yaml"), core("events"), pvcNS},
		{path.Join(fluxNS, "gitrepositories.yaml"), flux.GitRepositoryGVR, fluxNS},
		{path.Join(fluxNS, "kustomizations.yaml"), flux.KustomizationGVR, fluxNS},
		{path.Join(fluxNS, "deployments.yaml"), schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, fluxNS},
		{path.Join(fluxNS, "events.yaml"), core("events"), fluxNS},
	}
	for _, s := range sources {
		name := path.Join("evidence", s.file)
		list, err := dyn.Resource(s.gvr).Namespace(s.namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			out[name] = []byte(fmt.Sprintf("# could not list %s: %v\n", s.gvr.Resource, err))
			continue
		}
		out[name] = listYAML(list)
	}
	return out
}

func listYAML(list *unstructured.UnstructuredList) []byte {
	items := make([]any, 0, len(list.Items))
	for _, it := range list.Items {
		// managedFields triple the size and say nothing about health.
		it.SetManagedFields(nil)
		items = append(items, it.Object)
	}
	b, err := yaml.Marshal(map[string]any{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		return []byte(fmt.Sprintf("# marshal error: %v\n", err))
	}
	return b
}
