// Package kube holds the client-go plumbing the stages share: clients from a
// kubeconfig file, and bounded waits for nodes and Deployments that report
// what they wait for.
package kube

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/rs/zerolog"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/homelab/bootstrap/internal/retry"
	"github.com/homelab/bootstrap/internal/wait"
)

// RESTConfig loads a kubeconfig file (its current context) with a request
// timeout, so no API call can hang a stage.
func RESTConfig(kubeconfigPath string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigPath)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfigPath, err)
	}
	return bounded(cfg), nil
}

// RESTConfigFrom is RESTConfig for a kubeconfig held in memory (one kept
// age-encrypted is opened in memory only); source names it in errors.
func RESTConfigFrom(kubeconfig []byte, source string) (*rest.Config, error) {
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig %s: %w", source, err)
	}
	return bounded(cfg), nil
}

// bounded gives a client config its request timeout and rate limits.
func bounded(cfg *rest.Config) *rest.Config {
	cfg.Timeout = 30 * time.Second
	cfg.QPS, cfg.Burst = 50, 100
	return cfg
}

// Clientset builds a typed client from a kubeconfig file.
func Clientset(kubeconfigPath string) (*kubernetes.Clientset, *rest.Config, error) {
	cfg, err := RESTConfig(kubeconfigPath)
	if err != nil {
		return nil, nil, err
	}
	return clientset(cfg)
}

// ClientsetFrom builds a typed client from a kubeconfig held in memory.
func ClientsetFrom(kubeconfig []byte, source string) (*kubernetes.Clientset, *rest.Config, error) {
	cfg, err := RESTConfigFrom(kubeconfig, source)
	if err != nil {
		return nil, nil, err
	}
	return clientset(cfg)
}

func clientset(cfg *rest.Config) (*kubernetes.Clientset, *rest.Config, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	return cs, cfg, nil
}

// Classify marks Kubernetes errors that a retry can cure (conflicts,
// timeouts, throttling, unavailable servers) as retryable.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	if apierrors.IsConflict(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
		apierrors.IsTooManyRequests(err) || apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) ||
		isConnectionError(err) {
		return retry.Retryable(err)
	}
	return err
}

func isConnectionError(err error) bool {
	s := err.Error()
	for _, frag := range []string{"connection refused", "connection reset", "i/o timeout", "EOF", "TLS handshake timeout"} {
		if strings.Contains(s, frag) {
			return true
		}
	}
	return false
}

// NodeReady reports whether a node's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// PodReady reports whether a pod's Ready condition is True.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// NodeStatus compares the registered nodes with the expected names and
// returns the ones missing and the ones registered but not Ready.
func NodeStatus(ctx context.Context, cs kubernetes.Interface, names []string) (missing, notReady []string, err error) {
	list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, Classify(err)
	}
	byName := map[string]*corev1.Node{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	for _, n := range names {
		node, ok := byName[n]
		switch {
		case !ok:
			missing = append(missing, n)
		case !NodeReady(node):
			notReady = append(notReady, n)
		}
	}
	sort.Strings(missing)
	sort.Strings(notReady)
	return missing, notReady, nil
}

// pollInterval spaces the reads of a wait: a GET against the API server
// is cheap, and a Deployment is often Available within a second.
const pollInterval = 250 * time.Millisecond

// WaitNodesReady waits until every named node is registered, Ready, and
// rid of the not-ready taint the node lifecycle controller lifts a moment
// after: a pod created before that is unschedulable and waits out the
// scheduler's backoff even once the node is fine.
func WaitNodesReady(ctx context.Context, cs kubernetes.Interface, names []string, timeout time.Duration, log zerolog.Logger) error {
	return waitNodes(ctx, cs, names, false, timeout, log)
}

// WaitNodesOpen waits as WaitNodesReady does, except that one node a pod
// without tolerations can land on (Ready, no NoSchedule or NoExecute taint
// at all) is enough for the rest to keep their not-ready taint: a pod
// created then schedules at once, while the node lifecycle controller,
// which lifts those taints one node at a time, may take a second more for
// fifteen nodes. Without such a node (a control plane alone) every node
// must lose its not-ready taint.
func WaitNodesOpen(ctx context.Context, cs kubernetes.Interface, names []string, timeout time.Duration, log zerolog.Logger) error {
	return waitNodes(ctx, cs, names, true, timeout, log)
}

func waitNodes(ctx context.Context, cs kubernetes.Interface, names []string, oneOpen bool, timeout time.Duration, log zerolog.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wake := Wake(ctx, func(ctx context.Context) (watch.Interface, error) {
		return cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
	})
	return wait.Until(ctx, wait.Spec{What: fmt.Sprintf("%d node(s) Ready", len(names)), Timeout: timeout, Interval: pollInterval, Log: log, Wake: wake},
		func(ctx context.Context) (bool, string, error) {
			missing, notReady, err := NodeStatus(ctx, cs, names)
			if err == nil && len(missing)+len(notReady) == 0 {
				var tainted, open []string
				if tainted, open, err = nodeTaints(ctx, cs, names); err == nil && len(tainted) > 0 {
					if oneOpen && len(open) > 0 {
						return true, "Ready; " + open[0] + " takes pods, still tainted not-ready: " + strings.Join(tainted, ", "), nil
					}
					return false, "Ready, still tainted not-ready: " + strings.Join(tainted, ", "), nil
				}
			}
			if err != nil {
				if retry.IsRetryable(err) {
					return false, "API not answering: " + err.Error(), nil
				}
				return false, "", err
			}
			ready := len(names) - len(missing) - len(notReady)
			st := fmt.Sprintf("%d/%d Ready", ready, len(names))
			if len(missing) > 0 {
				st += ", not registered: " + strings.Join(missing, ", ")
			}
			if len(notReady) > 0 {
				st += ", NotReady: " + strings.Join(notReady, ", ")
			}
			return ready == len(names), st, nil
		})
}

// nodeTaints lists the named nodes that still carry the not-ready or
// unreachable NoSchedule taint, and those that carry no NoSchedule or
// NoExecute taint at all (open to any pod).
func nodeTaints(ctx context.Context, cs kubernetes.Interface, names []string) (tainted, open []string, err error) {
	list, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, Classify(err)
	}
	for _, n := range list.Items {
		if !slices.Contains(names, n.Name) {
			continue
		}
		lifecycle, closed := false, false
		for _, t := range n.Spec.Taints {
			lifecycle = lifecycle || t.Effect == corev1.TaintEffectNoSchedule && (t.Key == corev1.TaintNodeNotReady || t.Key == corev1.TaintNodeUnreachable)
			closed = closed || t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
		}
		if lifecycle {
			tainted = append(tainted, n.Name)
		}
		if !closed {
			open = append(open, n.Name)
		}
	}
	sort.Strings(tainted)
	sort.Strings(open)
	return tainted, open, nil
}

// DeploymentAvailable reports whether a Deployment has rolled out its
// current generation and has its Available condition True.
func DeploymentAvailable(d *appsv1.Deployment) (bool, string) {
	if d.Status.ObservedGeneration < d.Generation {
		return false, "rollout not observed yet"
	}
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	if d.Status.UpdatedReplicas < want || d.Status.AvailableReplicas < want {
		return false, fmt.Sprintf("%d/%d replicas available", d.Status.AvailableReplicas, want)
	}
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable {
			return c.Status == corev1.ConditionTrue, fmt.Sprintf("%d/%d replicas available", d.Status.AvailableReplicas, want)
		}
	}
	return false, "no Available condition yet"
}

// WaitDeploymentAvailable waits for ns/name to be Available.
func WaitDeploymentAvailable(ctx context.Context, cs kubernetes.Interface, ns, name string, timeout time.Duration, log zerolog.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wake := Wake(ctx, func(ctx context.Context) (watch.Interface, error) {
		return cs.AppsV1().Deployments(ns).Watch(ctx, Named(name))
	})
	return wait.Until(ctx, wait.Spec{What: fmt.Sprintf("Deployment %s/%s Available", ns, name), Timeout: timeout, Interval: pollInterval, Log: log, Wake: wake},
		func(ctx context.Context) (bool, string, error) {
			d, err := cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return false, "not created yet", nil
			}
			if err != nil {
				if retry.IsRetryable(Classify(err)) {
					return false, err.Error(), nil
				}
				return false, "", err
			}
			ok, st := DeploymentAvailable(d)
			if !ok {
				if why := unschedulable(ctx, cs, d); why != "" {
					st += "; " + why
				}
			}
			return ok, st, nil
		})
}

// unschedulable says why the scheduler leaves one of the Deployment's pods
// Pending (its PodScheduled condition), e.g. "0/1 nodes are available: 1
// node(s) didn't match pod anti-affinity rules", so a wait that will time
// out says what to change instead of only counting replicas.
func unschedulable(ctx context.Context, cs kubernetes.Interface, d *appsv1.Deployment) string {
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || sel.Empty() {
		return ""
	}
	pods, err := cs.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return ""
	}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodPending {
			continue
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return fmt.Sprintf("pod %s unschedulable: %s", p.Name, c.Message)
			}
		}
	}
	return ""
}

// ApplyObject turns a typed object into what a client applies or writes to
// a repository: without status and the zero creationTimestamp, which only
// the server fills (applying them would claim fields that are not ours).
func ApplyObject(obj runtime.Object) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	unstructured.RemoveNestedField(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	return u, nil
}

// NetworkAgents lists the DaemonSets that can run on a node that is not
// Ready yet, as "namespace/name: ready/desired ready": a CNI's agent must
// (it is what makes the node Ready), so its DaemonSet tolerates the
// not-ready NoSchedule taint the node lifecycle controller puts on such a
// node (flannel's and Cilium's manifests tolerate every NoSchedule taint).
// Talos' own kube-proxy is left out: it runs whatever the CNI. A DaemonSet
// the controller wants on no node (desired 0) is no rollout either.
func NetworkAgents(ctx context.Context, cs kubernetes.Interface) ([]string, error) {
	list, err := cs.AppsV1().DaemonSets("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, Classify(err)
	}
	var out []string
	for _, ds := range list.Items {
		if (ds.Namespace == metav1.NamespaceSystem && ds.Name == "kube-proxy") || ds.Status.DesiredNumberScheduled == 0 ||
			!slices.ContainsFunc(ds.Spec.Template.Spec.Tolerations, toleratesNotReady) {
			continue
		}
		out = append(out, fmt.Sprintf("%s/%s: %d/%d ready", ds.Namespace, ds.Name, ds.Status.NumberReady, ds.Status.DesiredNumberScheduled))
	}
	sort.Strings(out)
	return out, nil
}

// toleratesNotReady reports whether t tolerates the not-ready NoSchedule
// taint (core/v1 Toleration.ToleratesTaint's rules for the Exists and
// Equal operators, without the comparison operators no CNI uses).
func toleratesNotReady(t corev1.Toleration) bool {
	if t.Effect != "" && t.Effect != corev1.TaintEffectNoSchedule {
		return false
	}
	switch {
	case t.Key == "" && t.Operator == corev1.TolerationOpExists:
		return true
	case t.Key != corev1.TaintNodeNotReady:
		return false
	}
	return t.Operator == corev1.TolerationOpExists || t.Value == ""
}
