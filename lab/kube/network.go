package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// A real node is NotReady until a CNI runs on it: kubelet asks the
// container runtime, which reports NetworkReady=false until a CNI config
// is in /etc/cni/net.d (written by the CNI agent's pod: flannel's
// install-config init container, cilium-agent), and kubelet's Ready
// condition then says "container runtime network not ready"
// (pkg/kubelet/kubelet.go updateRuntimeUp, nodestatus/setters.go
// ReadyCondition at Kubernetes v1.36.1). The node lifecycle controller
// taints such a node not-ready, so only pods that tolerate it (the CNI's
// own DaemonSet, kube-proxy) run there until then.
//
// With Options.NetworkGate the lab does the same with kwok: the node
// stages are read from kwok's module as always, and kwok's
// node-initialize applies only to a Node marked network-ready; a derived
// stage gives an unmarked Node kwok's initial status with Ready False and
// kubelet's reason and message. The Node is registered with that Ready
// condition already, as a kubelet posts its status with the Node it
// creates: without one the node lifecycle controller lifts the not-ready
// taint the API server's admission put on it, and for a moment a pod can
// be scheduled there. The lab marks a Node once a CNI agent pod
// runs on it (cniAgents).
const (
	// AnnotationNetworkReady marks a Node whose CNI config exists.
	AnnotationNetworkReady = "lab.bootstrap.homelab/network-ready"
	// networkNotReadyMessage is kubelet's message; the part after
	// "message:" is containerd's CRI plugin's wording (unverified: not
	// in the sources read).
	networkNotReadyMessage = "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized"
)

// cniAgents select the pods whose running makes their node's network
// ready: Talos' flannel DaemonSet (k8stemplates/flannel.go at v1.13.3:
// k8s-app=flannel), the Cilium chart's agent (k8s-app=cilium) and
// Calico's node agent (k8s-app=calico-node).
const cniAgents = "k8s-app in (flannel,cilium,calico-node)"

// gateNodeStages rewrites kwok's node-initialize stage (YAML text, as
// read from kwok's module) into the network-gated pair. It fails when
// kwok's text is not what it was written against, so a kwok bump cannot
// silently drop the gate.
func gateNodeStages(initialize string) (string, error) {
	const readySel = `    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values:
      - 'True'
`
	const condFields = `        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
`
	if strings.Count(initialize, readySel) != 1 || strings.Count(initialize, condFields) != 1 || !strings.Contains(initialize, "name: node-initialize\n") {
		return "", fmt.Errorf("kwok's node-initialize stage is not the one the lab's network gate was written against")
	}
	key := fmt.Sprintf(`.metadata.annotations["%s"]`, AnnotationNetworkReady)
	gated := strings.Replace(initialize, readySel, readySel+fmt.Sprintf(`    - key: '%s'
      operator: 'In'
      values:
      - 'true'
`, key), 1)
	notReady := strings.Replace(initialize, "name: node-initialize\n", "name: node-network-not-ready\n", 1)
	notReady = strings.Replace(notReady, readySel, fmt.Sprintf(`    - key: '.status.phase'
      operator: 'NotIn'
      values:
      - 'Running'
    - key: '%s'
      operator: 'DoesNotExist'
`, key), 1)
	notReady = strings.Replace(notReady, condFields, fmt.Sprintf(`        {{ if eq .type "Ready" }}
        message: %q
        reason: "KubeletNotReady"
        status: "False"
        {{ else }}
`, networkNotReadyMessage)+condFields+"        {{ end }}\n", 1)
	return gated + "\n---\n" + notReady, nil
}

// markNetworkReady annotates, until ctx ends, every Node on which a CNI
// agent pod runs. It remembers the pods it acted on, not the node names: a
// Node deleted and registered again under its name (a replaced node) gets
// a new agent pod, which marks the new Node, as its kubelet reports the
// network ready once its CNI runs.
func (c *Cluster) markNetworkReady(ctx context.Context) {
	marked := map[types.UID]bool{}
	for {
		pods, err := c.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{LabelSelector: cniAgents})
		if err == nil {
			for _, p := range pods.Items {
				node := p.Spec.NodeName
				if node == "" || marked[p.UID] || p.Status.Phase != corev1.PodRunning {
					continue
				}
				patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{AnnotationNetworkReady: "true"}}})
				if _, err := c.client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err == nil {
					marked[p.UID] = true
					c.log.Debug().Str("node", node).Str("pod", p.Namespace+"/"+p.Name).Msg("CNI agent runs: node network ready")
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// networkNotReady is the Ready condition a kubelet registers with before
// its CNI runs.
func networkNotReady(now metav1.Time) corev1.NodeCondition {
	return corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady",
		Message: networkNotReadyMessage, LastHeartbeatTime: now, LastTransitionTime: now}
}

// resyncPodReady plays the kubelet's status reconcile, until ctx ends. The
// node lifecycle controller sets Ready=False on the pods of a node that is
// not Ready (MarkPodsNotReady, pkg/controller/util/node/controller_utils.go
// at Kubernetes v1.36.1) — with the network gate that includes a node whose
// CNI has not run yet. A real kubelet puts it back once its node is Ready:
// its status manager re-posts any pod whose API status differs from its own
// (pkg/kubelet/status/status_manager.go needsReconcile, syncBatch), and its
// own Ready is ContainersReady and every readiness gate
// (pkg/kubelet/status/generate.go GeneratePodReadyCondition). kwok's
// pod-ready stage only acts on Pending pods, so without this a pod the
// controller marked while its node waited for the CNI stayed not Ready for
// good (seen: CoreDNS on a worker of the 3+3 benchmark, the health wait
// never ended). Pods of a node that is not Ready are left as they are, and
// so are mirror pods.
func (c *Cluster) resyncPodReady(ctx context.Context) {
	for {
		c.reconcilePodReady(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// reconcilePodReady is one pass of resyncPodReady; it returns the pods it
// set Ready.
func (c *Cluster) reconcilePodReady(ctx context.Context) []string {
	nodes, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	ready := map[string]bool{}
	for i := range nodes.Items {
		ready[nodes.Items[i].Name] = NodeReady(&nodes.Items[i]) == corev1.ConditionTrue
	}
	pods, err := c.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "status.phase=Running"})
	if err != nil {
		return nil
	}
	var fixed []string
	for _, p := range pods.Items {
		// A mirror pod's status is its static pod's, as its node reports
		// it (mirror.go): not this reconcile's to change.
		if p.DeletionTimestamp != nil || p.Annotations[AnnotationMirror] != "" || !ready[p.Spec.NodeName] || !kubeletWouldBeReady(p) {
			continue
		}
		now := metav1.Now()
		patch, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []any{
			map[string]any{"type": corev1.PodReady, "status": corev1.ConditionTrue, "lastTransitionTime": now},
		}}})
		if _, err := c.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err == nil {
			fixed = append(fixed, p.Namespace+"/"+p.Name)
			c.log.Debug().Str("pod", p.Namespace+"/"+p.Name).Str("node", p.Spec.NodeName).Msg("pod Ready again: its node is Ready (kubelet status reconcile)")
		}
	}
	return fixed
}

// kubeletWouldBeReady: the pod is not Ready, yet its containers and every
// readiness gate are.
func kubeletWouldBeReady(p corev1.Pod) bool {
	cond := map[corev1.PodConditionType]corev1.ConditionStatus{}
	for _, c := range p.Status.Conditions {
		cond[c.Type] = c.Status
	}
	if cond[corev1.PodReady] == corev1.ConditionTrue || cond[corev1.ContainersReady] != corev1.ConditionTrue {
		return false
	}
	for _, g := range p.Spec.ReadinessGates {
		if cond[g.ConditionType] != corev1.ConditionTrue {
			return false
		}
	}
	return true
}
