package kube

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// Cordon marks the node unschedulable; it reports whether it changed
// anything (false when it already was). A missing Node is not an error:
// there is nothing to schedule onto.
func Cordon(ctx context.Context, cs kubernetes.Interface, node string) (changed bool, err error) {
	n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, Classify(err)
	}
	if n.Spec.Unschedulable {
		return false, nil
	}
	patch := []byte(`{"spec":{"unschedulable":true}}`)
	if _, err := cs.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return false, Classify(err)
	}
	return true, nil
}

// PodsOn lists the pods bound to node, in every namespace.
func PodsOn(ctx context.Context, cs kubernetes.Interface, node string) ([]corev1.Pod, error) {
	pods, err := cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String(),
	})
	if err != nil {
		return nil, Classify(err)
	}
	return pods.Items, nil
}

// Evictable lists the pods a drain of node evicts, as namespace/name:
// what Talos' own drain before a reset or shutdown evicts
// (pkg/kubernetes/kubernetes.go Drain at v1.13.3): every pod bound to
// the node except mirror pods (static pods, which go with the node),
// pods no controller owns (nothing would re-create them; kubectl drain
// refuses them without --force) and DaemonSet pods (their controller
// puts them back on the node at once).
func Evictable(ctx context.Context, cs kubernetes.Interface, node string) ([]corev1.Pod, error) {
	pods, err := PodsOn(ctx, cs, node)
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range pods {
		if StaysThroughDrain(&p) || metav1.GetControllerOf(&p) == nil {
			continue
		}
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name })
	return out, nil
}

// StaysThroughDrain reports whether a drain leaves p on its node, as both
// Talos' drain and kubectl's (--ignore-daemonsets) do: a mirror pod (a
// static pod, which goes with the node) or a DaemonSet's pod (its
// controller puts it back on the node at once).
func StaysThroughDrain(p *corev1.Pod) bool {
	if _, mirror := p.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return true
	}
	owner := metav1.GetControllerOf(p)
	return owner != nil && owner.Kind == "DaemonSet"
}

// Drain evicts the node's evictable pods through the Eviction API, so
// PodDisruptionBudgets hold (a refused eviction, 429, is asked again
// every retry until timeout), and waits until each is gone; it returns
// the pods it evicted. It waits at most timeout and says for which pods
// when that runs out. The node should be cordoned first, or the
// scheduler may put a replacement back on it.
func Drain(ctx context.Context, cs kubernetes.Interface, node string, timeout, retry time.Duration) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pods, err := Evictable(ctx, cs, node)
	if err != nil {
		return nil, err
	}
	var (
		mu      sync.Mutex
		evicted []string
		pending = map[string]string{}
		wg      sync.WaitGroup
		errs    = make([]error, len(pods))
	)
	for i, p := range pods {
		id := p.Namespace + "/" + p.Name
		pending[id] = "eviction not yet accepted"
		wg.Add(1)
		go func() {
			defer wg.Done()
			note := func(s string) { mu.Lock(); pending[id] = s; mu.Unlock() }
			if err := evict(ctx, cs, p, retry, note); err != nil {
				errs[i] = err
				return
			}
			mu.Lock()
			delete(pending, id)
			evicted = append(evicted, id)
			mu.Unlock()
		}()
	}
	wg.Wait()
	sort.Strings(evicted)
	if err := errors.Join(errs...); err != nil {
		if ctx.Err() != nil {
			var left []string
			for id, why := range pending {
				left = append(left, id+" ("+why+")")
			}
			sort.Strings(left)
			return evicted, fmt.Errorf("draining node %s: waited %s for its pods to leave; still there: %v", node, timeout, left)
		}
		return evicted, err
	}
	return evicted, nil
}

// evict asks the Eviction API to evict p until it accepts (a 429 is a
// PodDisruptionBudget saying not now), then waits until the pod is gone
// (or replaced by another of the same name).
func evict(ctx context.Context, cs kubernetes.Interface, p corev1.Pod, retry time.Duration, note func(string)) error {
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
	for {
		err := cs.PolicyV1().Evictions(p.Namespace).Evict(ctx, ev)
		switch {
		case err == nil:
		case apierrors.IsNotFound(err):
			return nil
		case apierrors.IsTooManyRequests(err):
			note("eviction refused: " + err.Error())
			if !sleep(ctx, retry) {
				return ctx.Err()
			}
			continue
		default:
			return fmt.Errorf("evicting pod %s/%s: %w", p.Namespace, p.Name, Classify(err))
		}
		break
	}
	note("evicted, waiting for it to terminate")
	for {
		got, err := cs.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && got.UID != p.UID {
			return nil
		}
		if !sleep(ctx, retry) {
			return ctx.Err()
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// DeleteNode deletes the Node object; it reports whether it existed.
func DeleteNode(ctx context.Context, cs kubernetes.Interface, node string) (bool, error) {
	err := cs.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, Classify(err)
	}
	return true, nil
}

// DeleteNodePods force-deletes the pods still bound to a node that no
// longer exists (its mirror pods, its DaemonSet pods), as the pod garbage
// collector does for pods of a deleted node once its 40 s quarantine has
// passed (k8s.io/kubernetes v1.36.1 pkg/controller/podgc/gc_controller.go
// gcOrphaned, markFailedAndDeletePod: grace period 0, since no kubelet is
// left to confirm a graceful deletion). It returns how many it deleted.
func DeleteNodePods(ctx context.Context, cs kubernetes.Interface, node string) (int, error) {
	pods, err := PodsOn(ctx, cs, node)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, p := range pods {
		err := cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, *metav1.NewDeleteOptions(0))
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return n, fmt.Errorf("deleting pod %s/%s of the removed node %s: %w", p.Namespace, p.Name, node, Classify(err))
		default:
			n++
		}
	}
	return n, nil
}
