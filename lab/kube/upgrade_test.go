package kube_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
)

// TestServersRestartAtANewVersion: a control plane started at the previous
// Kubernetes minor is moved to the pinned one a server at a time, as
// kubelet restarts static pods with new images; the servers report the
// new version and what etcd held before is still there. A minor the lab
// does not build is refused, naming the two it does.
func TestServersRestartAtANewVersion(t *testing.T) {
	ctx := context.Background()
	bins := kubetest.Binaries(t)
	prev, pinned := bins.PreviousKubernetesVersion(), bins.KubernetesVersion()
	versions := map[string]string{}
	for _, s := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		versions[s] = prev
	}
	c := kubetest.Start(t, kube.Options{ClusterName: "upgrade", PKI: kubetest.PKI(t), KubernetesVersions: versions})
	v, err := c.Client().Discovery().ServerVersion()
	if err != nil || v.GitVersion != prev {
		t.Fatalf("API server version %v %v, want %s", v, err, prev)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kept", Namespace: "default"}, Data: map[string]string{"k": "v"}}
	if _, err := c.Client().CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
		if err := c.RestartServer(ctx, s, pinned); err != nil {
			t.Fatal(err)
		}
		if got := c.ServerVersion(s); got != pinned {
			t.Fatalf("%s runs %s after its restart, want %s", s, got, pinned)
		}
	}
	v, err = c.Client().Discovery().ServerVersion()
	if err != nil || v.GitVersion != pinned {
		t.Fatalf("API server version %v %v after the restart, want %s", v, err, pinned)
	}
	if got, err := c.Client().CoreV1().ConfigMaps("default").Get(ctx, "kept", metav1.GetOptions{}); err != nil || got.Data["k"] != "v" {
		t.Fatalf("the ConfigMap after the restart: %v %v", got, err)
	}
	if err := c.Healthy(ctx); err != nil {
		t.Fatalf("after the restarts: %v", err)
	}
	if err := c.RestartServer(ctx, "kube-apiserver", "v1.20.0"); err == nil || !strings.Contains(err.Error(), prev) || !strings.Contains(err.Error(), pinned) {
		t.Fatalf("an unbuilt minor: %v", err)
	}
}
