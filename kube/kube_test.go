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

// TestWaitNodesOpenNeedsOneNodeThatTakesPods: one Ready worker free of
// taints is enough while another keeps its not-ready taint; a control
// plane (NoSchedule control-plane taint) does not count, so a cluster of
// it and a still-tainted worker waits.
func TestWaitNodesOpenNeedsOneNodeThatTakesPods(t *testing.T) {
	ready := corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}
	notReadyTaint := corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoSchedule}
	cp := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-1"}, Status: ready,
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule}}}}
	wk1 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "wk-1"}, Status: ready, Spec: corev1.NodeSpec{Taints: []corev1.Taint{notReadyTaint}}}
	wk2 := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "wk-2"}, Status: ready}
	ctx := context.Background()
	names := []string{"cp-1", "wk-1", "wk-2"}
	if err := WaitNodesOpen(ctx, fake.NewClientset(cp, wk1, wk2), names, 2*time.Second, zerolog.Nop()); err != nil {
		t.Errorf("wk-2 takes pods: %v", err)
	}
	if err := WaitNodesReady(ctx, fake.NewClientset(cp, wk1, wk2), names, 300*time.Millisecond, zerolog.Nop()); err == nil {
		t.Error("WaitNodesReady did not wait for wk-1's taint")
	}
	wk2.Spec.Taints = []corev1.Taint{notReadyTaint}
	err := WaitNodesOpen(ctx, fake.NewClientset(cp, wk1, wk2), names, 300*time.Millisecond, zerolog.Nop())
	if err == nil || !strings.Contains(err.Error(), "still tainted not-ready: wk-1, wk-2") {
		t.Errorf("no node takes pods: want a timeout naming the tainted workers, got %v", err)
	}
}
