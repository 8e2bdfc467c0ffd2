package talos

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/kube"
)

// The health check's reporting: the assertions' names, the report, one
// poll that asks both sides at once (Health) and the wait on it. Each side
// is judged in its own file: health_talos.go (what the nodes' Talos API
// says) and health_kube.go (what the Kubernetes API says).

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
