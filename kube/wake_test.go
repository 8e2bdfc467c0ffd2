package kube

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
)

// TestWakeSignalsChangesAndReopens: a change to what is watched wakes the
// wait, and a watch that fails to open is opened again.
func TestWakeSignalsChangesAndReopens(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs := fake.NewClientset()
	var opens atomic.Int32
	wake := Wake(ctx, func(ctx context.Context) (watch.Interface, error) {
		if opens.Add(1) == 1 {
			return nil, errors.New("refused once")
		}
		return cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
	})
	// The first open fails; the second, a second later, watches.
	deadline := time.Now().Add(5 * time.Second)
	for opens.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if opens.Load() < 2 {
		t.Fatal("the watch was not opened again after failing")
	}
	time.Sleep(50 * time.Millisecond) // the fake's watch is registered once opened
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	case <-time.After(3 * time.Second):
		t.Fatal("a node created did not wake the wait")
	}
}
