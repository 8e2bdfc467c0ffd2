package talos

import (
	"testing"

	"k8s.io/client-go/kubernetes"
)

// The health wait's client runs at the product's rate limits, not
// client-go's 5 requests a second: eight calls a poll at the default
// spent its burst in a few polls and then queued for a second a poll.
func TestKubeClientIsNotThrottledAtClientGoDefaults(t *testing.T) {
	const kubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: lab, cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: t}}]
contexts: [{name: admin@lab, context: {cluster: lab, user: admin}}]
current-context: admin@lab
`
	cs, err := kubeClient([]byte(kubeconfig))
	if err != nil {
		t.Fatal(err)
	}
	if qps := cs.(*kubernetes.Clientset).CoreV1().RESTClient().GetRateLimiter().QPS(); qps < 50 {
		t.Errorf("the talos stage's Kubernetes client allows %v requests a second", qps)
	}
}
