package talos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubectl/pkg/drain"

	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/kube"
)

// AnnotationCordoned marks a Node this tool cordoned before rebooting it
// into a new Talos. Only a Node carrying it is uncordoned afterwards: a
// Node the user cordoned stays so. Talos keeps its own cordons the same
// way (constants.AnnotationCordonedKey, NodeApplyController.ApplyCordoned
// in internal/app/machined/pkg/controllers/k8s/node_apply.go at
// v1.14.0-rc.1: "not cordoned by Talos, skip"), so neither undoes the
// other's.
const AnnotationCordoned = "bootstrap.homelab/cordoned-for-upgrade"

// cordonAndDrain cordons the Node and evicts its pods as talosctl upgrade
// does before its reboot (nodedrain.CordonAndDrain in
// cmd/talosctl/pkg/talos/nodedrain at v1.14.0-rc.1, over
// siderolabs/go-kubernetes v0.2.41 kubernetes/nodedrain): kubectl's drain
// library, each pod's own grace period, PodDisruptionBudgets honoured
// through the eviction API, DaemonSet and mirror pods left, emptyDir data
// deleted, unmanaged pods deleted, bounded by DrainTimeout. A Node the
// cluster does not have (not registered yet) has nothing to drain.
func (o *Ops) cordonAndDrain(ctx context.Context, kc kubernetes.Interface, name string) error {
	node, err := kc.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		o.opts.Log.Warn().Str("node", name).Msgf("Kubernetes has no Node %s: nothing to drain", name)
		return nil
	}
	if err != nil {
		return fmt.Errorf("cordoning the Kubernetes node %s: %w", name, err)
	}
	if err := cordon(ctx, kc, node); err != nil {
		return err
	}
	log := o.opts.Log.With().Str("node", name).Logger()
	log.Info().Msgf("draining %s (at most %s)", name, o.opts.DrainTimeout)
	dctx, cancel := context.WithTimeout(ctx, o.opts.DrainTimeout)
	defer cancel()
	h := &drain.Helper{
		Ctx: dctx, Client: kc,
		Force: true, GracePeriodSeconds: -1, IgnoreAllDaemonSets: true, DeleteEmptyDirData: true,
		Timeout: o.opts.DrainTimeout, Out: io.Discard, ErrOut: io.Discard,
		OnPodDeletionOrEvictionFinished: func(pod *corev1.Pod, usingEviction bool, err error) {
			if err != nil {
				log.Warn().Err(err).Msgf("could not evict pod %s/%s", pod.Namespace, pod.Name)
				return
			}
			log.Debug().Msgf("evicted pod %s/%s", pod.Namespace, pod.Name)
		},
	}
	if err := drain.RunNodeDrain(h, name); err != nil {
		return fmt.Errorf("draining the Kubernetes node %s (at most %s): %w%s", name, o.opts.DrainTimeout, err, stillThere(ctx, kc, name))
	}
	return nil
}

// stillThere names the pods a failed drain left on node with their state
// (kubectl's own error says only that its time ran out): a pod whose
// eviction a PodDisruptionBudget refuses runs on, one the kubelet does not
// finish deleting is Terminating.
func stillThere(ctx context.Context, kc kubernetes.Interface, node string) string {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	pods, err := kube.PodsOn(lctx, kc, node)
	if err != nil {
		return fmt.Sprintf("; listing the pods left on it: %v", err)
	}
	var left []string
	for _, p := range pods {
		if kube.StaysThroughDrain(&p) {
			continue
		}
		state := string(p.Status.Phase)
		if p.DeletionTimestamp != nil {
			state = "Terminating since " + p.DeletionTimestamp.UTC().Format(time.RFC3339)
		}
		left = append(left, fmt.Sprintf("%s/%s (%s)", p.Namespace, p.Name, state))
	}
	if len(left) == 0 {
		return "; no pod it drains is left on it"
	}
	slices.Sort(left)
	return "; still there: " + strings.Join(left, ", ")
}

// cordon marks node unschedulable with AnnotationCordoned, unless the user
// cordoned it already (it is then left as it is, and stays cordoned).
func cordon(ctx context.Context, kc kubernetes.Interface, node *corev1.Node) error {
	if node.Spec.Unschedulable {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]string{AnnotationCordoned: "true"}},
		"spec":     map[string]any{"unschedulable": true},
	})
	if _, err := kc.CoreV1().Nodes().Patch(ctx, node.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("cordoning the Kubernetes node %s: %w", node.Name, err)
	}
	return nil
}

// uncordon makes the Node schedulable again if this tool cordoned it
// (AnnotationCordoned); a missing Node or one without the mark is left.
func (o *Ops) uncordon(ctx context.Context, kc kubernetes.Interface, name string) error {
	node, err := kc.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("uncordoning the Kubernetes node %s: %w", name, err)
	}
	if _, ours := node.Annotations[AnnotationCordoned]; !ours {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{AnnotationCordoned: nil}},
		"spec":     map[string]any{"unschedulable": false},
	})
	if _, err := kc.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("uncordoning the Kubernetes node %s: %w", name, err)
	}
	o.opts.Log.Info().Str("node", name).Msgf("uncordoned %s", name)
	return nil
}

// waitUncordoned uncordons the Node after its reboot, waiting (bounded by
// RebootTimeout) while the Kubernetes API does not answer: with one
// control plane it went down with the node.
func (o *Ops) waitUncordoned(ctx context.Context, kc kubernetes.Interface, name string) error {
	spec := wait.Spec{What: fmt.Sprintf("the Kubernetes node %s uncordoned after its reboot", name), Timeout: o.opts.RebootTimeout,
		Interval: o.opts.PollInterval, ProgressEvery: o.opts.ProgressEvery, Log: o.opts.Log}
	return wait.Until(ctx, spec, func(ctx context.Context) (bool, string, error) {
		if err := o.uncordon(ctx, kc, name); err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	})
}
