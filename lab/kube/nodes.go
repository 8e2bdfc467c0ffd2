package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/homelab/bootstrap/internal/wait"
)

// Role is a node's role in the cluster.
type Role string

// Node roles.
const (
	RoleControlPlane Role = "controlplane"
	RoleWorker       Role = "worker"
)

// Labels and taints the lab puts on nodes.
const (
	LabelControlPlane = "node-role.kubernetes.io/control-plane"
	LabelWorker       = "node-role.kubernetes.io/worker"
	// HeartbeatLabel set to "stopped" takes a node away from kwok: its lease
	// is no longer renewed nor its status updated, as when a kubelet dies,
	// and the controller manager marks it NotReady after the grace period.
	HeartbeatLabel   = "lab.bootstrap.homelab/heartbeat"
	heartbeatStopped = "stopped"
)

// RegisterNode creates (or updates) the Node object a kubelet would register
// for a machine: name, InternalIP and Hostname addresses, the usual
// kubernetes.io labels and the role label; control-plane nodes get the
// NoSchedule taint unless Options.ScheduleOnControlPlanes. kwok then marks
// it Ready and keeps its heartbeat.
func (c *Cluster) RegisterNode(ctx context.Context, name, ip string, role Role) error {
	return c.RegisterKubelet(ctx, name, ip, role, "")
}

// RegisterKubelet is RegisterNode for a kubelet of kubeletVersion
// ("v1.36.1"; empty: kwok's own), which the Node reports in
// status.nodeInfo from its creation on, as a kubelet registers it (kwok's
// node stages keep a version that is set: node-initialize.yaml at v0.8.0,
// "or $nodeInfo.kubeletVersion"; one set after kwok saw the Node may be
// overwritten by kwok's first status update).
func (c *Cluster) RegisterKubelet(ctx context.Context, name, ip string, role Role, kubeletVersion string) error {
	if net.ParseIP(ip) == nil {
		return fmt.Errorf("registering node %s: %q is not an IP address", name, ip)
	}
	if role != RoleControlPlane && role != RoleWorker {
		return fmt.Errorf("registering node %s: unknown role %q", name, role)
	}
	labels := map[string]string{
		"kubernetes.io/hostname": name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     "amd64",
	}
	var taints []corev1.Taint
	if role == RoleControlPlane {
		labels[LabelControlPlane] = ""
		if !c.opts.ScheduleOnControlPlanes {
			taints = append(taints, corev1.Taint{Key: LabelControlPlane, Effect: corev1.TaintEffectNoSchedule})
		}
	} else {
		labels[LabelWorker] = ""
	}
	addrs := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}
	var nodeInfo corev1.NodeSystemInfo
	if kubeletVersion != "" {
		nodeInfo.KubeletVersion = "v" + strings.TrimPrefix(kubeletVersion, "v")
	}

	nodes := c.client.CoreV1().Nodes()
	n, err := nodes.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		n = &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec:       corev1.NodeSpec{Taints: taints},
			Status:     corev1.NodeStatus{Addresses: addrs, NodeInfo: nodeInfo},
		}
		if c.opts.NetworkGate {
			n.Status.Conditions = []corev1.NodeCondition{networkNotReady(metav1.Now())}
		}
		if _, err := nodes.Create(ctx, n, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("registering node %s: %w", name, err)
		}
		c.log.Info().Str("node", name).Str("ip", ip).Str("role", string(role)).Msg("node registered")
		return nil
	case err != nil:
		return fmt.Errorf("registering node %s: %w", name, err)
	}
	// Re-registration (a node rebooted): refresh labels and addresses. The
	// node controller and kwok write the same Node meanwhile; kubelet
	// patches the Node it finds and its registration loop retries a failed
	// attempt (pkg/kubelet/kubelet_node_status.go tryRegisterWithAPIServer,
	// registerWithAPIServer at kubernetes v1.36.1): here a conflicting
	// update is retried on the fresh Node.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		for k, v := range labels {
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			n.Labels[k] = v
		}
		_, err := nodes.Update(ctx, n, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			if fresh, gerr := nodes.Get(ctx, name, metav1.GetOptions{}); gerr == nil {
				n = fresh
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("updating node %s: %w", name, err)
	}
	status := map[string]any{"addresses": addrs}
	if nodeInfo.KubeletVersion != "" {
		status["nodeInfo"] = map[string]any{"kubeletVersion": nodeInfo.KubeletVersion}
	}
	patch, _ := json.Marshal(map[string]any{"status": status})
	if _, err := nodes.PatchStatus(ctx, name, patch); err != nil {
		return fmt.Errorf("updating node %s addresses: %w", name, err)
	}
	return nil
}

// SetKubeletVersion makes a registered Node report version
// (status.nodeInfo.kubeletVersion), as a kubelet restarted at that version
// does when it updates its status.
func (c *Cluster) SetKubeletVersion(ctx context.Context, name, version string) error {
	version = "v" + strings.TrimPrefix(version, "v")
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"nodeInfo": map[string]any{"kubeletVersion": version}}})
	if _, err := c.client.CoreV1().Nodes().PatchStatus(ctx, name, patch); err != nil {
		return fmt.Errorf("setting the kubelet version of node %s to %s: %w", name, version, err)
	}
	return nil
}

// StopHeartbeat takes the node away from kwok, as if its kubelet died: the
// node lease and status stop being renewed, so after
// Options.NodeMonitorGracePeriod the controller manager sets its Ready
// condition to Unknown. Pods on it are left as they are.
func (c *Cluster) StopHeartbeat(ctx context.Context, name string) error {
	return c.setHeartbeatLabel(ctx, name, heartbeatStopped)
}

// ResumeHeartbeat hands the node back to kwok, which marks it Ready again,
// and reports its pods Ready again as a returning kubelet's status sync
// does: the node lifecycle controller marked them not Ready while the node
// was unreachable, and kwok does not undo that.
func (c *Cluster) ResumeHeartbeat(ctx context.Context, name string) error {
	if err := c.setHeartbeatLabel(ctx, name, ""); err != nil {
		return err
	}
	pods, err := c.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + name})
	if err != nil {
		return fmt.Errorf("listing the pods of node %s: %w", name, err)
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		changed := false
		for j := range p.Status.Conditions {
			cond := &p.Status.Conditions[j]
			if (cond.Type == corev1.PodReady || cond.Type == corev1.ContainersReady) && cond.Status != corev1.ConditionTrue {
				cond.Status, cond.LastTransitionTime, cond.Reason, cond.Message = corev1.ConditionTrue, metav1.Now(), "", ""
				changed = true
			}
		}
		if !changed || p.Status.Phase != corev1.PodRunning {
			continue
		}
		if _, err := c.client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return fmt.Errorf("reporting pod %s/%s Ready again: %w", p.Namespace, p.Name, err)
		}
	}
	return nil
}

func (c *Cluster) setHeartbeatLabel(ctx context.Context, name, value string) error {
	var v any
	if value != "" {
		v = value
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{HeartbeatLabel: v}}})
	if _, err := c.client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("setting heartbeat of node %s to %q: %w", name, value, err)
	}
	return nil
}

// WaitNodesReady waits until every named node reports Ready=True.
func (c *Cluster) WaitNodesReady(ctx context.Context, names []string, timeout time.Duration) error {
	tr := wait.NewTracker(c.log, "nodes Ready", names)
	defer tr.Close()
	return wait.Until(ctx, wait.Spec{What: "nodes Ready", Timeout: timeout, Interval: 200 * time.Millisecond, Log: c.log},
		func(ctx context.Context) (bool, string, error) {
			for _, n := range tr.Pending() {
				node, err := c.client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
				if err != nil {
					if apierrors.IsNotFound(err) {
						continue
					}
					return false, tr.Status(), nil
				}
				if NodeReady(node) == corev1.ConditionTrue {
					tr.Done(n)
				}
			}
			return len(tr.Pending()) == 0, tr.Status(), nil
		})
}

// NodeReady returns the status of the node's Ready condition ("" if absent).
func NodeReady(n *corev1.Node) corev1.ConditionStatus {
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status
		}
	}
	return ""
}

// kwokStages joins the kwok Stage files the lab uses, read from the pinned
// kwok module's source: nodes become Ready and keep a heartbeat, pods become
// Running (or Succeeded) and go away when deleted.
func (c *Cluster) kwokStages(ctx context.Context) ([]byte, error) {
	dir, err := c.bins.ModuleDir(ctx, modKwok)
	if err != nil {
		return nil, fmt.Errorf("locating kwok's stages: %w", err)
	}
	files := []string{
		"kustomize/stage/node/fast/node-initialize.yaml",
		"kustomize/stage/node/heartbeat/node-heartbeat.yaml",
		"kustomize/stage/pod/fast/pod-ready.yaml",
		"kustomize/stage/pod/fast/pod-complete.yaml",
		"kustomize/stage/pod/fast/pod-delete.yaml",
	}
	var docs []string
	for _, f := range files {
		data, err := readFileIn(dir, f)
		if err != nil {
			return nil, fmt.Errorf("reading kwok stage %s: %w", f, err)
		}
		if c.opts.NetworkGate && strings.HasSuffix(f, "/node-initialize.yaml") {
			gated, err := gateNodeStages(string(data))
			if err != nil {
				return nil, err
			}
			data = []byte(gated)
		}
		docs = append(docs, strings.TrimSpace(string(data)))
	}
	if len(docs) == 0 {
		return nil, errors.New("no kwok stages")
	}
	return []byte(strings.Join(docs, "\n---\n") + "\n"), nil
}
