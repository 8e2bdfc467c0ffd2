package talos

// The Kubernetes side of the health check: the Nodes and kube-system's
// workloads, judged as talosctl health's Kubernetes assertions judge them.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/siderolabs/talos/pkg/machinery/constants"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/homelab/bootstrap/kube"
)

// kubeFacts are the Kubernetes reads of one health poll: the Nodes, and
// kube-system's pods, DaemonSets and Deployments, each listed once. The
// assertions select from them by label as talosctl's lists do on the
// server (pkg/cluster/check/kubernetes.go at v1.13.3).
type kubeFacts struct {
	nodes       []corev1.Node
	nodesErr    error
	pods        []corev1.Pod
	podsErr     error
	daemonSets  []appsv1.DaemonSet
	dsErr       error
	deployments []appsv1.Deployment
	deployErr   error
}

// readKube lists what kubeHealth asserts on, at once.
func (o *Ops) readKube(ctx context.Context, cs kubernetes.Interface) kubeFacts {
	cctx, cancel := context.WithTimeout(ctx, o.opts.CallTimeout)
	defer cancel()
	var f kubeFacts
	var wg sync.WaitGroup
	wg.Go(func() {
		l, err := cs.CoreV1().Nodes().List(cctx, metav1.ListOptions{})
		if f.nodesErr = err; err == nil {
			f.nodes = l.Items
		}
	})
	wg.Go(func() {
		l, err := cs.CoreV1().Pods(metav1.NamespaceSystem).List(cctx, metav1.ListOptions{})
		if f.podsErr = err; err == nil {
			f.pods = l.Items
		}
	})
	wg.Go(func() {
		l, err := cs.AppsV1().DaemonSets(metav1.NamespaceSystem).List(cctx, metav1.ListOptions{})
		if f.dsErr = err; err == nil {
			f.daemonSets = l.Items
		}
	})
	wg.Go(func() {
		l, err := cs.AppsV1().Deployments(metav1.NamespaceSystem).List(cctx, metav1.ListOptions{})
		if f.deployErr = err; err == nil {
			f.deployments = l.Items
		}
	})
	wg.Wait()
	return f
}

// withLabel returns the items whose label key is value (a selector
// "key=value").
func withLabel[T any](items []T, meta func(*T) *metav1.ObjectMeta, key, value string) []T {
	var out []T
	for i := range items {
		if meta(&items[i]).Labels[key] == value {
			out = append(out, items[i])
		}
	}
	return out
}

func podMeta(p *corev1.Pod) *metav1.ObjectMeta { return &p.ObjectMeta }

func kubeHealth(in HealthInput, cps, all []HealthTarget, kf kubeFacts, static func(string) ([]string, error)) HealthReport {
	var r HealthReport
	add := func(name string, skipped bool, problems []string) {
		r = append(r, HealthCheck{Name: name, OK: len(problems) == 0, Skipped: skipped && len(problems) == 0, Detail: strings.Join(problems, "; ")})
	}
	nodes := corev1.NodeList{Items: kf.nodes}
	if err := kf.nodesErr; err != nil {
		msg := []string{"listing nodes: " + kube.Classify(err).Error()}
		for _, name := range []string{HealthK8sNodesReported, HealthStaticPods, HealthControlPlaneReady, HealthK8sNodesReady, HealthKubeProxyReady, HealthCoreDNSReady, HealthK8sNodesSchedulable} {
			add(name, false, msg)
		}
		return r
	}

	// Every node of the config registered and no other: talosctl matches
	// by address, not name (K8sAllNodesReportedAssertion, NodesMatch).
	missing, unexpected := matchNodes(all, nodes.Items)
	if !in.TolerateUnexpected {
		missing = append(missing, unexpected...)
	}
	add(HealthK8sNodesReported, false, missing)

	var problems []string
	for _, n := range cps {
		pods, err := static(n.Name)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %s", n.Name, shortErr(err)))
			continue
		}
		var absent []string
		for _, want := range []string{"kube-system/kube-apiserver", "kube-system/kube-controller-manager", "kube-system/kube-scheduler"} {
			if !slices.ContainsFunc(pods, func(id string) bool { return strings.HasPrefix(id, want) }) {
				absent = append(absent, want)
			}
		}
		if len(absent) > 0 {
			problems = append(problems, fmt.Sprintf("%s: missing %s", n.Name, strings.Join(absent, ", ")))
		}
	}
	add(HealthStaticPods, false, problems)

	add(HealthControlPlaneReady, false, controlPlaneReady(kf, cps, nodes.Items, in.TolerateUnexpected))

	// Every registered node Ready, as K8sAllNodesReadyAssertion lists them.
	problems = nil
	if !in.CNIDisabled {
		for i := range nodes.Items {
			if !kube.NodeReady(&nodes.Items[i]) {
				problems = append(problems, nodes.Items[i].Name+" not Ready")
			}
		}
	}
	add(HealthK8sNodesReady, in.CNIDisabled, problems)

	problems, present := podsReady(kf, "kube-proxy", true)
	add(HealthKubeProxyReady, !present, problems)
	if in.CNIDisabled {
		add(HealthCoreDNSReady, true, nil)
	} else {
		problems, present = podsReady(kf, "kube-dns", false)
		add(HealthCoreDNSReady, !present, problems)
	}

	problems = nil
	for _, n := range nodes.Items {
		if n.Spec.Unschedulable {
			problems = append(problems, n.Name+" is cordoned")
		}
	}
	add(HealthK8sNodesSchedulable, false, problems)
	return r
}

// nodeIPs are a Node's InternalIP and ExternalIP addresses, what talosctl
// health identifies it by.
func nodeIPs(n *corev1.Node) []string {
	var ips []string
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
			ips = append(ips, a.Address)
		}
	}
	return ips
}

// removeCommands names the command that takes each node out of the
// cluster.
func removeCommands(names []string) string {
	return "`bootstrap node remove " + strings.Join(names, "`, `bootstrap node remove ") + "`"
}

// matchNodes pairs each expected node with a registered one by address
// (cluster.NodesMatch in pkg/cluster/cluster.go at v1.13.3): an expected
// node none answers for is missing, a registered node left over is
// unexpected. Both fail talosctl health: a node removed from the config
// but not from the cluster keeps it unhealthy until it is deleted.
func matchNodes(want []HealthTarget, got []corev1.Node) (missing, unexpected []string) {
	left := make([]*corev1.Node, 0, len(got))
	for i := range got {
		left = append(left, &got[i])
	}
	var absent []string
	for _, w := range want {
		i := slices.IndexFunc(left, func(n *corev1.Node) bool { return slices.Contains(nodeIPs(n), w.IP) })
		if i < 0 {
			absent = append(absent, fmt.Sprintf("%s (%s)", w.Name, w.IP))
			continue
		}
		left = slices.Delete(left, i, i+1)
	}
	if len(absent) > 0 {
		missing = append(missing, "not registered: "+strings.Join(absent, ", "))
	}
	if len(left) > 0 {
		var extra, names []string
		for _, n := range left {
			extra = append(extra, fmt.Sprintf("%s (%s)", n.Name, strings.Join(nodeIPs(n), ", ")))
			names = append(names, n.Name)
		}
		unexpected = append(unexpected, "unexpected nodes, registered but not in the config: "+strings.Join(extra, ", ")+
			" (take each out with "+removeCommands(names)+", or add it back to nodes)")
	}
	return missing, unexpected
}

// controlPlaneReady is K8sFullControlPlaneAssertion (pkg/cluster/check/
// kubernetes.go at v1.13.3): the Nodes labelled control-plane are exactly
// the control planes (by address), and for each of kube-apiserver,
// kube-controller-manager and kube-scheduler there is one pod (the
// kubelet's mirror of the static pod, label k8s-app) per such Node, none
// reporting PodReady other than True. A pod with no PodReady condition yet
// is not counted as not ready, as there.
func controlPlaneReady(kf kubeFacts, cps []HealthTarget, nodes []corev1.Node, tolerateUnexpected bool) []string {
	var labelled []corev1.Node
	for _, n := range nodes {
		if _, ok := n.Labels[constants.LabelNodeRoleControlPlane]; ok {
			labelled = append(labelled, n)
		}
	}
	missing, unexpected := matchNodes(cps, labelled)
	if !tolerateUnexpected {
		missing = append(missing, unexpected...)
	}
	if problems := missing; len(problems) > 0 {
		return []string{"control-plane nodes: " + strings.Join(problems, "; ")}
	}
	if kf.podsErr != nil {
		return []string{fmt.Sprintf("listing the kube-system pods: %s", kube.Classify(kf.podsErr))}
	}
	var problems []string
	for _, app := range []string{"kube-apiserver", "kube-scheduler", "kube-controller-manager"} {
		var count int
		var notReady []string
		for _, p := range withLabel(kf.pods, podMeta, "k8s-app", app) {
			// Pod checkpoints of self-hosted control planes are not counted.
			if _, ok := p.Annotations["checkpointer.alpha.coreos.com/checkpoint-of"]; ok {
				continue
			}
			count++
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
					notReady = append(notReady, p.Name)
				}
			}
		}
		switch {
		case count != len(labelled):
			problems = append(problems, fmt.Sprintf("%d %s pods for %d control planes", count, app, len(labelled)))
		case len(notReady) > 0:
			problems = append(problems, fmt.Sprintf("%s not Ready: %s", app, strings.Join(notReady, ", ")))
		}
	}
	return problems
}

// podsReady is K8sPodReadyAssertion for the DaemonSet (or Deployment)
// labelled k8s-app=app (pkg/cluster/check/kubernetes.go at v1.13.3):
// deleted and failed pods and pods whose containers have all terminated
// (or that report none yet) are left out; of the rest at least one must
// be Ready, none may be not Ready, and the Ready ones must be as many as
// the workload wants (the DaemonSet's desired number scheduled, the
// Deployment's replicas). present is false when there is no such
// workload, and then the check is skipped.
func podsReady(kf kubeFacts, app string, daemonSet bool) (problems []string, present bool) {
	selector := "k8s-app=" + app
	var want int
	if daemonSet {
		if kf.dsErr != nil {
			return []string{kube.Classify(kf.dsErr).Error()}, true
		}
		list := withLabel(kf.daemonSets, func(d *appsv1.DaemonSet) *metav1.ObjectMeta { return &d.ObjectMeta }, "k8s-app", app)
		if len(list) == 0 {
			return nil, false
		}
		want = int(list[0].Status.DesiredNumberScheduled)
	} else {
		if kf.deployErr != nil {
			return []string{kube.Classify(kf.deployErr).Error()}, true
		}
		list := withLabel(kf.deployments, func(d *appsv1.Deployment) *metav1.ObjectMeta { return &d.ObjectMeta }, "k8s-app", app)
		if len(list) == 0 {
			return nil, false
		}
		want = int(deploymentReplicas(&list[0]))
	}
	if kf.podsErr != nil {
		return []string{kube.Classify(kf.podsErr).Error()}, true
	}
	pods := withLabel(kf.pods, podMeta, "k8s-app", app)
	if len(pods) == 0 {
		return []string{fmt.Sprintf("no pods (%s)", selector)}, true
	}
	var ready, notReady []string
	for _, p := range pods {
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodFailed || allContainersTerminated(&p) {
			continue
		}
		if kube.PodReady(&p) {
			ready = append(ready, p.Name)
		} else {
			notReady = append(notReady, p.Name)
		}
	}
	switch {
	case len(ready) == 0:
		return []string{fmt.Sprintf("no Ready pods (%s)", selector)}, true
	case len(notReady) > 0:
		return []string{fmt.Sprintf("not Ready: %s (%s)", strings.Join(notReady, ", "), selector)}, true
	case len(ready) != want:
		return []string{fmt.Sprintf("%d Ready pods, want %d (%s)", len(ready), want, selector)}, true
	}
	return nil, true
}

// allContainersTerminated is true for a pod `kubectl get pods` shows as
// Completed after a graceful kubelet shutdown, and for one that reports no
// container yet (the loop in K8sPodReadyAssertion finds nothing running).
func allContainersTerminated(p *corev1.Pod) bool {
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Terminated == nil {
			return false
		}
	}
	return true
}

func deploymentReplicas(d *appsv1.Deployment) int32 {
	if d.Spec.Replicas == nil {
		return 1
	}
	return *d.Spec.Replicas
}
