package talos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/imager/quirks"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc/codes"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/kube"
)

// The cluster health assertions, named and ordered as `talosctl health`
// runs them (pkg/cluster/check/default.go at v1.13.3: PreBootSequenceChecks,
// then K8sComponentsReadinessChecks and the rest of DefaultClusterChecks).
const (
	HealthEtcdHealthy         = "etcd to be healthy"
	HealthEtcdConsistent      = "etcd members to be consistent across nodes"
	HealthEtcdControlPlanes   = "etcd members to be control plane nodes"
	HealthApidReady           = "apid to be ready"
	HealthMemorySizes         = "all nodes memory sizes"
	HealthDiskSizes           = "all nodes disk sizes"
	HealthNoDiagnostics       = "no diagnostics"
	HealthKubeletHealthy      = "kubelet to be healthy"
	HealthBootFinished        = "all nodes to finish boot sequence"
	HealthK8sNodesReported    = "all k8s nodes to report"
	HealthStaticPods          = "all control plane static pods to be running"
	HealthControlPlaneReady   = "all control plane components to be ready"
	HealthK8sNodesReady       = "all k8s nodes to report ready"
	HealthKubeProxyReady      = "kube-proxy to report ready"
	HealthCoreDNSReady        = "coredns to report ready"
	HealthK8sNodesSchedulable = "all k8s nodes to report schedulable"
)

// HealthInput is what the cluster health is judged against.
type HealthInput struct {
	// Nodes of the config, with their roles.
	Nodes []HealthTarget
	// Kube, when set, adds the Kubernetes assertions (once a kubeconfig
	// exists); without it only the Talos side is checked.
	Kube kubernetes.Interface
	// KubeSideOnly asks only the Kubernetes assertions (with Kube), for a
	// wait that follows one on the Talos side's: talosctl health waits for
	// its checks one after another and does not ask a passed one again
	// (Wait in pkg/cluster/check/check.go at v1.13.3).
	KubeSideOnly bool
	// CNIDisabled is true when Talos deploys no CNI (cluster.network.cni
	// none, e.g. for Cilium installed later): nodes cannot be Ready and
	// CoreDNS cannot run before it, so those assertions are skipped, as
	// talosctl does.
	CNIDisabled bool
	// TolerateUnexpected keeps a registered Node, or an etcd member, that
	// no config entry accounts for (removed from the config, joined by
	// hand) from failing "all k8s nodes to report" and "etcd members to be
	// control plane nodes". The talos stage's waits set it: waiting cannot
	// make such a node go away, it is the user's to remove or to add; the
	// postcheck, which does not wait, reports it.
	TolerateUnexpected bool
}

// HealthCheck is one assertion's verdict.
type HealthCheck struct {
	Name string
	OK   bool
	// Skipped is true when the assertion does not apply (no kube-proxy
	// DaemonSet, CNI not deployed yet); Skipped checks are OK.
	Skipped bool
	Detail  string
}

// HealthReport is every assertion's verdict, in talosctl's order.
type HealthReport []HealthCheck

// OK reports whether every assertion passed or was skipped.
func (r HealthReport) OK() bool {
	return !slices.ContainsFunc(r, func(c HealthCheck) bool { return !c.OK })
}

// Failing lists the assertions that did not pass.
func (r HealthReport) Failing() []HealthCheck {
	var out []HealthCheck
	for _, c := range r {
		if !c.OK {
			out = append(out, c)
		}
	}
	return out
}

// Get returns the verdict of the named assertion.
func (r HealthReport) Get(name string) (HealthCheck, bool) {
	i := slices.IndexFunc(r, func(c HealthCheck) bool { return c.Name == name })
	if i < 0 {
		return HealthCheck{}, false
	}
	return r[i], true
}

// Summary is the failing assertions on one line ("" when healthy).
func (r HealthReport) Summary() string {
	var parts []string
	for _, c := range r.Failing() {
		parts = append(parts, c.Name+": "+c.Detail)
	}
	return strings.Join(parts, "; ")
}

// nodeFacts is what one health poll learnt from one node.
type nodeFacts struct {
	svcs      []Service
	svcErr    error
	members   []EtcdMember
	memberErr error
	stage     MachineStage
	stageErr  error
	versionOK error
	static    []string
	staticErr error
	memTotal  uint64 // bytes
	memErr    error
	ephemeral uint64 // bytes; 0 when the node does not report it
	ephErr    error
	diags     []string
	diagErr   error
}

// Health judges the cluster as `talosctl health` does. It is the one
// condition behind both the talos stage's wait (WaitHealthy) and the
// postcheck: etcd healthy on every control plane, the membership each
// control plane sees identical and equal to the control planes (no
// learners), apid answering on every node, kubelet healthy on the control
// planes, every node's boot sequence finished (MachineStatus running), and
// with a Kubernetes client: every node registered and no other (matched by
// address), the control-plane static pods on every control plane and their
// mirror pods Ready, nodes Ready and schedulable, kube-proxy and CoreDNS
// ready where they are deployed. Every assertion runs; none short-circuits.
func (o *Ops) Health(ctx context.Context, in HealthInput) HealthReport {
	var cps, all []HealthTarget
	for _, n := range in.Nodes {
		all = append(all, n)
		if n.Role == RoleControlPlane {
			cps = append(cps, n)
		}
	}
	facts := make(map[string]*nodeFacts, len(all))
	// The Kubernetes reads are independent of the nodes' questions: made
	// beside them, a poll takes the slower of the two, not their sum.
	var kf chan kubeFacts
	if in.Kube != nil {
		kf = make(chan kubeFacts, 1)
		go func() { kf <- o.readKube(ctx, in.Kube) }()
	}
	var wg sync.WaitGroup
	for _, n := range all {
		f := &nodeFacts{}
		facts[n.Name] = f
		if in.KubeSideOnly && n.Role != RoleControlPlane {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// One connection per node for all its calls: a health poll
			// asks every node six to eight questions.
			err := o.read(ctx, n.IP, o.opts.CallTimeout, func(ctx context.Context, c *client.Client) error {
				// The questions are independent reads: asked at once on
				// the node's one connection (gRPC multiplexes them), a
				// poll takes about one call's time, not eight.
				var versionErr error
				var calls sync.WaitGroup
				ask := func(fn func()) {
					calls.Add(1)
					go func() {
						defer calls.Done()
						fn()
					}()
				}
				if in.KubeSideOnly {
					// Only what the Kubernetes side asks of the nodes.
					f.static, f.staticErr = staticPodsOn(ctx, c)
					return nil
				}
				ask(func() { _, versionErr = c.Version(ctx) })
				ask(func() { f.svcs, f.svcErr = servicesOn(ctx, c) })
				ask(func() { f.stage, _, f.stageErr = machineStatusOn(ctx, c) })
				ask(func() { f.memTotal, f.memErr = memTotalOn(ctx, c) })
				ask(func() { f.ephemeral, f.ephErr = ephemeralSizeOn(ctx, c) })
				ask(func() { f.diags, f.diagErr = diagnosticsOn(ctx, c) })
				if n.Role == RoleControlPlane {
					ask(func() { f.members, f.memberErr = etcdMembersOn(ctx, c) })
					if in.Kube != nil {
						ask(func() { f.static, f.staticErr = staticPodsOn(ctx, c) })
					}
				}
				calls.Wait()
				return versionErr
			})
			if err != nil {
				f.versionOK, f.svcErr, f.stageErr, f.memberErr, f.staticErr = err, err, err, err, err
				f.memErr, f.ephErr, f.diagErr = err, err, err
			}
		}()
	}
	wg.Wait()

	var r HealthReport
	if !in.KubeSideOnly {
		r = talosSideHealth(in, cps, all, facts)
	}

	if in.Kube != nil {
		r = append(r, kubeHealth(in, cps, all, <-kf, func(name string) ([]string, error) {
			f := facts[name]
			return f.static, f.staticErr
		})...)
	}
	return r
}

// talosSideHealth judges the Talos side's assertions, in talosctl's
// order, from each node's facts.
func talosSideHealth(in HealthInput, cps, all []HealthTarget, facts map[string]*nodeFacts) HealthReport {
	var r HealthReport
	add := func(name string, problems []string) {
		c := HealthCheck{Name: name, OK: len(problems) == 0}
		c.Detail = strings.Join(problems, "; ")
		r = append(r, c)
	}
	// etcd healthy on every control plane.
	var problems []string
	for _, n := range cps {
		f := facts[n.Name]
		if f.svcErr != nil {
			problems = append(problems, fmt.Sprintf("%s: %s", n.Name, shortErr(f.svcErr)))
			continue
		}
		if s, ok := findService(f.svcs, "etcd"); !ok {
			problems = append(problems, n.Name+": etcd absent")
		} else if !s.Healthy {
			problems = append(problems, fmt.Sprintf("%s: etcd %s %s", n.Name, s.State, s.LastEvent))
		}
	}
	add(HealthEtcdHealthy, problems)

	// The same membership on every control plane.
	problems = nil
	var first []string
	firstNode := ""
	for _, n := range cps {
		f := facts[n.Name]
		if f.memberErr != nil {
			problems = append(problems, fmt.Sprintf("%s: %s", n.Name, shortErr(f.memberErr)))
			continue
		}
		view := memberView(f.members)
		if firstNode == "" {
			first, firstNode = view, n.Name
			continue
		}
		if !slices.Equal(view, first) {
			problems = append(problems, fmt.Sprintf("%s sees %s, %s sees %s", n.Name, strings.Join(view, ", "), firstNode, strings.Join(first, ", ")))
		}
	}
	add(HealthEtcdConsistent, problems)

	// Members are exactly the control planes, none a learner.
	problems = nil
	want := make([]string, 0, len(cps))
	for _, n := range cps {
		want = append(want, n.Name)
	}
	slices.Sort(want)
	if firstNode == "" {
		problems = append(problems, "no control plane lists the etcd members")
	} else {
		var got []string
		for _, m := range facts[firstNode].members {
			if m.Learner {
				problems = append(problems, m.Hostname+" is still a learner")
			}
			got = append(got, m.Hostname)
		}
		slices.Sort(got)
		// A member outside the config (a control plane removed from
		// it) is, like an unexpected Node, the user's to take out:
		// the waits tolerate it, the postcheck names the command.
		var extra []string
		for _, g := range got {
			if !slices.Contains(want, g) {
				extra = append(extra, g)
			}
		}
		missing := slices.ContainsFunc(want, func(w string) bool { return !slices.Contains(got, w) })
		if missing || len(extra) > 0 && !in.TolerateUnexpected {
			p := fmt.Sprintf("members %s, want the control planes %s", strings.Join(got, ", "), strings.Join(want, ", "))
			if len(extra) > 0 {
				p += " (take " + strings.Join(extra, ", ") + " out with " + removeCommands(extra) + ")"
			}
			problems = append(problems, p)
		}
	}
	add(HealthEtcdControlPlanes, problems)

	problems = nil
	for _, n := range all {
		if err := facts[n.Name].versionOK; err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", n.Name, err))
		}
	}
	add(HealthApidReady, problems)

	// Talos' minimums (talosctl health's AllNodesMemorySizes and
	// AllNodesDiskSizes, pkg/cluster/check/nodes.go at v1.13.3) and no
	// active diagnostics: one problem per node that has one, its read
	// error first.
	perNode := func(name string, read func(f *nodeFacts) error, judge func(n HealthTarget, f *nodeFacts) string) {
		var problems []string
		for _, n := range all {
			f := facts[n.Name]
			if err := read(f); err != nil {
				problems = append(problems, fmt.Sprintf("%s: %s", n.Name, shortErr(err)))
			} else if p := judge(n, f); p != "" {
				problems = append(problems, p)
			}
		}
		add(name, problems)
	}
	perNode(HealthMemorySizes, func(f *nodeFacts) error { return f.memErr }, func(n HealthTarget, f *nodeFacts) string {
		if min := MinimumMemory(n.Role); f.memTotal < min {
			return fmt.Sprintf("node %s does not meet memory requirements: expected at least %d MiB, actual %d MiB", n.Name, min>>20, f.memTotal>>20)
		}
		return ""
	})
	perNode(HealthDiskSizes, func(f *nodeFacts) error { return f.ephErr }, func(n HealthTarget, f *nodeFacts) string {
		if f.ephemeral > 0 && f.ephemeral < MinimumEphemeral() {
			return fmt.Sprintf("the EPHEMERAL partition of %s is too small: expected at least %d MiB, actual %d MiB", n.Name, MinimumEphemeral()>>20, f.ephemeral>>20)
		}
		return ""
	})
	perNode(HealthNoDiagnostics, func(f *nodeFacts) error { return f.diagErr }, func(n HealthTarget, f *nodeFacts) string {
		if len(f.diags) > 0 {
			return fmt.Sprintf("%s: %s", n.Name, strings.Join(f.diags, ", "))
		}
		return ""
	})

	problems = nil
	for _, n := range cps {
		f := facts[n.Name]
		if f.svcErr != nil {
			problems = append(problems, fmt.Sprintf("%s: %s", n.Name, shortErr(f.svcErr)))
			continue
		}
		if s, ok := findService(f.svcs, "kubelet"); !ok || !s.Healthy {
			problems = append(problems, fmt.Sprintf("%s: kubelet %s %s", n.Name, s.State, s.LastEvent))
		}
	}
	add(HealthKubeletHealthy, problems)

	problems = nil
	for _, n := range all {
		f := facts[n.Name]
		switch {
		case f.stageErr != nil:
			problems = append(problems, fmt.Sprintf("%s: %s", n.Name, shortErr(f.stageErr)))
		case f.stage != StageRunning:
			problems = append(problems, fmt.Sprintf("%s: %s", n.Name, f.stage))
		}
	}
	add(HealthBootFinished, problems)
	return r
}

// memberView is one control plane's view of the membership, comparable
// across nodes: id, hostname and learner state (EtcdConsistentAssertion).
func memberView(members []EtcdMember) []string {
	out := make([]string, 0, len(members))
	for _, m := range members {
		s := fmt.Sprintf("%s(%x)", m.Hostname, m.ID)
		if m.Learner {
			s += "[learner]"
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

func findService(svcs []Service, id string) (Service, bool) {
	i := slices.IndexFunc(svcs, func(s Service) bool { return s.ID == id })
	if i < 0 {
		return Service{}, false
	}
	return svcs[i], true
}

// staticPodsOn lists the static pods kubelet reports on a control plane
// (k8s.StaticPodStatus, "namespace/name-hostname").
func staticPodsOn(ctx context.Context, c *client.Client) ([]string, error) {
	list, err := safe.StateListAll[*k8s.StaticPodStatus](ctx, c.COSI)
	if err != nil {
		return nil, err
	}
	var out []string
	for p := range list.All() {
		out = append(out, p.Metadata().ID())
	}
	return out, nil
}

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

// WaitHealthy waits, bounded by HealthTimeout, until Health passes; the
// wait's status names the failing assertions.
func (o *Ops) WaitHealthy(ctx context.Context, what string, in HealthInput) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wake := make(chan struct{}, 1)
	spec := wait.Spec{
		What:          what,
		Timeout:       o.opts.HealthTimeout,
		Interval:      o.opts.PollInterval,
		ProgressEvery: o.opts.ProgressEvery,
		Log:           o.opts.Log,
		Wake:          wake,
	}
	var watching sync.Once
	return wait.Until(ctx, spec, func(pctx context.Context) (bool, string, error) {
		r := o.Health(pctx, in)
		if !r.OK() {
			// A health poll asks every node several questions: one that
			// starts when something it reads changes saves most of a
			// poll. Watched from the first poll that is not done (a
			// healthy cluster costs no watch); a change before the
			// watches start is seen by the next poll.
			watching.Do(func() { o.wakeOnHealthChange(ctx, in, wake) })
		}
		return r.OK(), r.Summary(), nil
	})
}

// wakeOnHealthChange delivers on wake, until ctx ends, when something a
// health poll reads changes for the better: a service on a node turns
// healthy (etcd joined, kubelet up), a node's boot sequence ends, or, with
// in.Kube, a Node object or a pod in kube-system changes (a node turning
// Ready, a static pod running: usually the last assertions to pass).
func (o *Ops) wakeOnHealthChange(ctx context.Context, in HealthInput, wake chan<- struct{}) {
	changed := make(chan struct{}, 1)
	for _, n := range in.Nodes {
		if in.KubeSideOnly {
			break // the Kubernetes watches below see what it asserts
		}
		o.nodeEvents(ctx, n.IP, changed)
	}
	// Without a kubeconfig kw stays nil: a receive from it never happens.
	var kw <-chan struct{}
	if in.Kube != nil {
		kw = kube.Wake(ctx, func(ctx context.Context) (watch.Interface, error) {
			return in.Kube.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
		}, func(ctx context.Context) (watch.Interface, error) {
			// The control plane's static pods, kube-proxy and CoreDNS.
			return in.Kube.CoreV1().Pods(metav1.NamespaceSystem).Watch(ctx, metav1.ListOptions{})
		})
	}
	// Nodes booted together change together (their kubelets turn healthy
	// within milliseconds of each other): one poll for such a burst, not
	// one per node.
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-kw:
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(healthWakeCoalesce):
			}
			signal(wake)
		}
	}()
}

// signal delivers on ch unless a signal is already waiting there.
func signal(ch chan<- struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// healthWakeCoalesce is how long a health wait's wake waits for more
// changes before it polls: a burst of changes costs one poll.
const healthWakeCoalesce = 20 * time.Millisecond

// nodeEvents signals changed, until ctx ends, each time a service on the
// node at ip turns healthy or the node's machine status turns ready.
// machined publishes a ServiceStateEvent on its runtime event stream for
// every change of a service's state or health (ServiceRunner.UpdateState
// and healthUpdate, internal/app/machined/pkg/system/service_runner.go at
// v1.13.3) and a MachineStatusEvent for every machine status change
// (controllers/runtime/machine_status_publisher.go). A stream that cannot
// be opened or breaks (the node reboots) is not opened again: the waits it
// wakes (a health wait; a node's config-run wait for its cri) poll anyway.
func (o *Ops) nodeEvents(ctx context.Context, ip string, changed chan<- struct{}) {
	go func() {
		err := o.read(ctx, ip, o.opts.HealthTimeout, func(ctx context.Context, c *client.Client) error {
			return followEvents(ctx, c, func(ev client.Event) bool {
				// Only a change for the better can end a health wait: a
				// service turning healthy, a boot sequence ending.
				switch p := ev.Payload.(type) {
				case *machine.ServiceStateEvent:
					if p.GetHealth().GetHealthy() {
						signal(changed)
					}
				case *machine.MachineStatusEvent:
					if p.GetStatus().GetReady() {
						signal(changed)
					}
				}
				return false
			}, client.WithTailEvents(0))
		})
		if err != nil && ctx.Err() == nil {
			o.opts.Log.Debug().Err(err).Str("node", ip).Msg("the node's event stream ended; the health polls go on without it")
		}
	}()
}

// followEvents reads the node's runtime event stream over c (the options
// pick the tail and the actor) and hands each event to fn until fn says
// stop or ctx ends (nil), or the stream breaks (its error).
func followEvents(ctx context.Context, c *client.Client, fn func(client.Event) (stop bool), opts ...client.EventsOptionFunc) error {
	ch := make(chan client.EventResult)
	if err := c.EventsWatchV2(ctx, ch, opts...); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case r := <-ch:
			if r.Error != nil {
				return r.Error
			}
			if fn(r.Event) {
				return nil
			}
		}
	}
}

// MinimumMemory is the RAM Talos wants a node's kernel to report
// (MemTotal): 1848 MiB for a control plane and 1 GiB for a worker, each
// less 150 MiB the kernel keeps (pkg/minimal/limits.go Memory at v1.13.3,
// which talosctl health checks).
func MinimumMemory(r Role) uint64 {
	if r == RoleControlPlane {
		return (1848 - 150) << 20
	}
	return (1024 - 150) << 20
}

// MinimumEphemeral is the smallest EPHEMERAL partition talosctl health
// accepts: a 6 GiB disk (pkg/minimal DiskSize) less the EFI, STATE and
// META partitions and 10 MiB of GPT overhead (pkg/cluster/check/nodes.go
// AllNodesDiskSizes at v1.13.3, partition sizes from machinery's quirks).
func MinimumEphemeral() uint64 {
	ps := quirks.New("").PartitionSizes()
	return 6<<30 - (ps.UKIEFISize() + ps.StateSize() + ps.METASize() + 10<<20)
}

func memTotalOn(ctx context.Context, c *client.Client) (uint64, error) {
	resp, err := c.Memory(ctx)
	if err != nil {
		return 0, err
	}
	for _, m := range resp.GetMessages() {
		return m.GetMeminfo().GetMemtotal() * 1024, nil
	}
	return 0, errors.New("no memory information in the answer")
}

// ephemeralSizeOn reads the EPHEMERAL volume's size; a Talos that does
// not expose VolumeStatus (PermissionDenied, as talosctl health allows)
// reports 0.
func ephemeralSizeOn(ctx context.Context, c *client.Client) (uint64, error) {
	vs, err := safe.StateGetByID[*block.VolumeStatus](ctx, c.COSI, constants.EphemeralPartitionLabel)
	if err != nil {
		if client.StatusCode(err) == codes.PermissionDenied {
			return 0, nil
		}
		return 0, err
	}
	return vs.TypedSpec().Size, nil
}

// diagnosticsOn lists the node's active runtime diagnostics.
func diagnosticsOn(ctx context.Context, c *client.Client) ([]string, error) {
	list, err := safe.StateListAll[*runtime.Diagnostic](ctx, c.COSI)
	if err != nil {
		if client.StatusCode(err) == codes.PermissionDenied {
			return nil, nil
		}
		return nil, err
	}
	var out []string
	for d := range list.All() {
		out = append(out, d.TypedSpec().Message)
	}
	return out, nil
}
