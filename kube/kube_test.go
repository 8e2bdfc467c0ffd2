package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestWaitNodesReadyWaitsForTheTaint: Ready is not enough while the node
// lifecycle controller has not lifted its not-ready taint yet.
func TestWaitNodesReadyWaitsForTheTaint(t *testing.T) {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "cp-1"},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}}},
		Status:     corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}
	cs := fake.NewClientset(node)
	ctx := context.Background()
	err := WaitNodesReady(ctx, cs, []string{"cp-1"}, 600*time.Millisecond, zerolog.Nop())
	if err == nil || !strings.Contains(err.Error(), "still tainted not-ready: cp-1") {
		t.Fatalf("want a timeout naming the tainted node, got %v", err)
	}
	time.AfterFunc(300*time.Millisecond, func() {
		n := node.DeepCopy()
		n.Spec.Taints = nil
		cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
	})
	start := time.Now()
	if err := WaitNodesReady(ctx, cs, []string{"cp-1"}, 5*time.Second, zerolog.Nop()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 2*time.Second {
		t.Errorf("returned after %s, want soon after the taint was lifted (300ms)", d)
	}
}
