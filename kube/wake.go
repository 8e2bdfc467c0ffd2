package kube

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
)

// Wake turns watches into a wait's wake (wait.Spec.Wake): every event a
// watch delivers signals the channel, so the wait polls as soon as what it
// waits for changes instead of at its next interval. The poll stays the
// judge; an event is only a hint, and signals coalesce (the channel holds
// one). A watch that cannot open or that the server ends is opened again a
// moment later; the wait's own polls cover the gap. The watches end with
// ctx, which the caller cancels when its wait is over.
func Wake(ctx context.Context, opens ...func(ctx context.Context) (watch.Interface, error)) <-chan struct{} {
	wake := make(chan struct{}, 1)
	for _, open := range opens {
		go func() {
			for ctx.Err() == nil {
				w, err := open(ctx)
				if err == nil {
					for range w.ResultChan() {
						select {
						case wake <- struct{}{}:
						default:
						}
					}
					w.Stop()
				}
				select {
				case <-ctx.Done():
				case <-time.After(wakeReopen):
				}
			}
		}()
	}
	return wake
}

// Named lists or watches the one object called name.
func Named(name string) metav1.ListOptions {
	return metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()}
}

// wakeReopen spaces the reopening of a watch that failed or ended.
const wakeReopen = time.Second
