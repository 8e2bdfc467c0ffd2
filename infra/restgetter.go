package infra

import (
	"net/http"

	helmkube "helm.sh/helm/v3/pkg/kube"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// memoryGetter is the genericclioptions.RESTClientGetter Helm's actions run
// with, over a kubeconfig held in memory: Helm's own getter reads a file,
// and a kubeconfig kept age-encrypted is never written out in plaintext.
// The client is tuned as Helm's CLI tunes its own (pkg/cli/environment.go
// at helm v3.22.0: burst and QPS from the settings, requests retried by
// kube.RetryingRoundTripper). Discovery is cached in memory for the life
// of the Helm client, where Helm's CLI caches it on disk.
type memoryGetter struct {
	raw       clientcmdapi.Config
	rest      *rest.Config
	disco     discovery.CachedDiscoveryInterface
	namespace string
}

// newMemoryGetter parses kubeconfig (its current context) for Helm.
func newMemoryGetter(kubeconfig []byte, burst int, qps float32) (*memoryGetter, error) {
	raw, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return nil, err
	}
	rc, err := clientcmd.NewDefaultClientConfig(*raw, nil).ClientConfig()
	if err != nil {
		return nil, err
	}
	rc.Burst, rc.QPS = burst, qps
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &helmkube.RetryingRoundTripper{Wrapped: rt} })
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &memoryGetter{raw: *raw, rest: rc, disco: memory.NewMemCacheClient(dc)}, nil
}

// inNamespace is the getter for one namespace: templates without one land
// there, as with Helm's --namespace.
func (g *memoryGetter) inNamespace(ns string) *memoryGetter {
	c := *g
	c.namespace = ns
	return &c
}

// ToRESTConfig implements genericclioptions.RESTClientGetter.
func (g *memoryGetter) ToRESTConfig() (*rest.Config, error) { return rest.CopyConfig(g.rest), nil }

// ToDiscoveryClient implements genericclioptions.RESTClientGetter.
func (g *memoryGetter) ToDiscoveryClient() (discovery.CachedDiscoveryInterface, error) {
	return g.disco, nil
}

// ToRESTMapper implements genericclioptions.RESTClientGetter, as
// ConfigFlags does: deferred discovery with kubectl's short names.
func (g *memoryGetter) ToRESTMapper() (meta.RESTMapper, error) {
	m := restmapper.NewDeferredDiscoveryRESTMapper(g.disco)
	return restmapper.NewShortcutExpander(m, g.disco, nil), nil
}

// ToRawKubeConfigLoader implements genericclioptions.RESTClientGetter.
func (g *memoryGetter) ToRawKubeConfigLoader() clientcmd.ClientConfig {
	return clientcmd.NewDefaultClientConfig(g.raw, &clientcmd.ConfigOverrides{Context: clientcmdapi.Context{Namespace: g.namespace}})
}
