package kube_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
)

// TestNodesWaitForTheirCNI: with the network gate a registered node is
// NotReady with kubelet's "container runtime network not ready" and
// tainted not-ready, so an ordinary pod stays Pending; the CNI's own
// DaemonSet (tolerating the taint) runs there, and the node turns Ready.
func TestNodesWaitForTheirCNI(t *testing.T) {
	ctx := context.Background()
	c := kubetest.Start(t, kube.Options{PKI: kubetest.PKI(t), NetworkGate: true})
	cs := c.Client()
	if err := c.RegisterNode(ctx, "n1", kubetest.LoopbackIP(), kube.RoleWorker); err != nil {
		t.Fatal(err)
	}
	poll(t, "n1 NotReady for want of a CNI, and tainted", 30*time.Second, func(ctx context.Context) (bool, string, error) {
		n, err := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		// The node lifecycle controller's NoSchedule taint is what keeps
		// ordinary pods off (its NoExecute one they tolerate for 300 s).
		tainted := false
		for _, tn := range n.Spec.Taints {
			tainted = tainted || tn.Key == "node.kubernetes.io/not-ready" && tn.Effect == corev1.TaintEffectNoSchedule
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionFalse && strings.Contains(cond.Message, "container runtime network not ready") && tainted,
					string(cond.Status) + " " + cond.Message, nil
			}
		}
		return false, "no Ready condition", nil
	})
	web := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.k8s.io/pause:3.10"}}},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, web, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if p, err := cs.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		n, _ := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		t.Fatalf("a pod was scheduled onto a node without a network: %v %q; node conditions %+v taints %+v annotations %v", err, p.Spec.NodeName, n.Status.Conditions, n.Spec.Taints, n.Annotations)
	}

	ds := kubetest.FlannelDaemonSet("kube-system", "kube-flannel")
	if _, err := cs.AppsV1().DaemonSets("kube-system").Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "n1 Ready once flannel runs", 60*time.Second, func(ctx context.Context) (bool, string, error) {
		return nodeReady(ctx, cs, "n1") == corev1.ConditionTrue, string(nodeReady(ctx, cs, "n1")), nil
	})
	poll(t, "the ordinary pod scheduled", 60*time.Second, func(ctx context.Context) (bool, string, error) {
		p, err := cs.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return p.Spec.NodeName == "n1", string(p.Status.Phase), nil
	})

	// The node lifecycle controller marks a pod not Ready while its node
	// is not (MarkPodsNotReady); on a Ready node the kubelet's status
	// reconcile makes it Ready again.
	podReady := func(ctx context.Context) corev1.ConditionStatus {
		p, err := cs.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return ""
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady {
				return cond.Status
			}
		}
		return ""
	}
	poll(t, "the ordinary pod Ready", 60*time.Second, func(ctx context.Context) (bool, string, error) {
		return podReady(ctx) == corev1.ConditionTrue, string(podReady(ctx)), nil
	})
	p, err := cs.CoreV1().Pods("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			p.Status.Conditions[i].Status = corev1.ConditionFalse
		}
	}
	if _, err := cs.CoreV1().Pods("default").UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "the pod marked not Ready is Ready again on its Ready node", 30*time.Second, func(ctx context.Context) (bool, string, error) {
		return podReady(ctx) == corev1.ConditionTrue, string(podReady(ctx)), nil
	})
}
