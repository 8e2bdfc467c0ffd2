// Package nfsprovisioner stands in for nfs-subdir-external-provisioner in the
// lab, where kwok "runs" the chart's pod but nothing executes its image. It
// watches the chart's Deployments and, for each one that is Available and
// whose NFS export can be mounted, provisions exactly the provisioner name
// the Deployment carries (the one the chart put into its StorageClass): a
// directory per claim created over NFS and an NFS PersistentVolume. A wrong
// chart value, a foreign StorageClass or a broken Deployment therefore leave
// claims Pending, as they would on real hardware.
package nfsprovisioner

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/rs/zerolog"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v10/controller"

	"github.com/homelab/bootstrap/lab/nfs"
)

// ChartSelector selects the chart's Deployments (its "app" label).
const ChartSelector = "app=nfs-subdir-external-provisioner"

// Options configures the stand-in.
type Options struct {
	// Client talks to the lab API server.
	Client kubernetes.Interface
	// Log receives provisioning and serving changes.
	Log zerolog.Logger
	// NFSPort is the port of the NFS server the chart names; the chart only
	// carries a host, so this is the lab's way of saying where it listens
	// (default 2049).
	NFSPort int
	// PollInterval spaces the checks of the chart's Deployments (default 500ms).
	PollInterval time.Duration
}

// target is what one chart Deployment asks for.
type target struct {
	provisioner string
	server      string
	path        string
	deployment  string // namespace/name
}

// served is the provisioning controller of one provisioner name. It is made
// once and kept: the library's constructor registers types into client-go's
// global scheme, a map other goroutines read while decoding, so making
// controllers again and again would race with every client in the process.
// Whether it provisions is decided by its provisioner's active target.
type served struct {
	p      *provisioner
	cancel context.CancelFunc
	done   chan struct{}
}

// StandIn is the running stand-in.
type StandIn struct {
	opts   Options
	log    zerolog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu          sync.Mutex
	controllers map[string]*served // by provisioner name
	// why a Deployment is not served, so a change is logged once
	notServing map[string]string
	mountRetry map[target]time.Time
}

// Start runs the stand-in until Stop or ctx ends.
func Start(ctx context.Context, opts Options) (*StandIn, error) {
	if opts.Client == nil {
		return nil, errors.New("nfsprovisioner: Options.Client is required")
	}
	if opts.NFSPort == 0 {
		opts.NFSPort = nfs.StandardPort
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = 500 * time.Millisecond
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &StandIn{
		opts: opts, log: opts.Log.With().Str("component", "lab-nfs-provisioner").Logger(),
		cancel: cancel, done: make(chan struct{}),
		controllers: map[string]*served{}, notServing: map[string]string{}, mountRetry: map[target]time.Time{},
	}
	go s.loop(ctx)
	return s, nil
}

// Stop ends every provisioning controller and the watch loop.
func (s *StandIn) Stop() {
	s.cancel()
	<-s.done
}

// NotServing maps each chart Deployment ("namespace/name") that is not
// served to the reason.
func (s *StandIn) NotServing() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.notServing))
	for k, v := range s.notServing {
		out[k] = v
	}
	return out
}

// Serving returns the provisioner names served right now.
func (s *StandIn) Serving() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for name, sv := range s.controllers {
		if _, active := sv.p.current(); active {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

func (s *StandIn) loop(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(s.opts.PollInterval)
	defer t.Stop()
	for {
		s.reconcile(ctx)
		select {
		case <-ctx.Done():
			s.mu.Lock()
			for name, sv := range s.controllers {
				sv.cancel()
				<-sv.done
				delete(s.controllers, name)
			}
			s.mu.Unlock()
			return
		case <-t.C:
		}
	}
}

// reconcile serves what Available chart Deployments ask for and stops
// serving everything else.
func (s *StandIn) reconcile(ctx context.Context) {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	deps, err := s.opts.Client.AppsV1().Deployments(metav1.NamespaceAll).List(lctx, metav1.ListOptions{LabelSelector: ChartSelector})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Debug().Err(err).Msg("listing the provisioner Deployments")
		}
		return
	}
	want := map[string]target{}
	for i := range deps.Items {
		d := &deps.Items[i]
		key := d.Namespace + "/" + d.Name
		tg, why := targetOf(d)
		if why == "" {
			why = s.checkMount(ctx, tg)
		}
		if why != "" {
			s.noteNotServing(key, why)
			continue
		}
		s.noteNotServing(key, "")
		if _, dup := want[tg.provisioner]; !dup {
			want[tg.provisioner] = tg
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	for name, sv := range s.controllers {
		tg, ok := want[name]
		if prev, active := sv.p.current(); active && (!ok || prev != tg) {
			s.log.Info().Str("provisioner", name).Str("deployment", prev.deployment).Msg("stopped serving")
		}
		if !ok {
			sv.p.deactivate()
		}
	}
	for name, tg := range want {
		sv, ok := s.controllers[name]
		if !ok {
			sv = s.newController(ctx, name)
			s.controllers[name] = sv
		}
		if prev, active := sv.p.current(); !active || prev != tg {
			sv.p.activate(tg)
			s.log.Info().Str("provisioner", name).Str("deployment", tg.deployment).Str("nfs", tg.server+":"+tg.path).Msg("serving")
		}
	}
}

func (s *StandIn) noteNotServing(key, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.notServing[key] == why {
		return
	}
	if why == "" {
		delete(s.notServing, key)
		return
	}
	s.notServing[key] = why
	s.log.Info().Str("deployment", key).Str("reason", why).Msg("provisioner not running")
}

// targetOf reads what a chart Deployment's pod would do from its
// environment, and whether the pod would be running.
func targetOf(d *appsv1.Deployment) (target, string) {
	tg := target{deployment: d.Namespace + "/" + d.Name}
	if len(d.Spec.Template.Spec.Containers) == 0 {
		return tg, "no container"
	}
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		switch e.Name {
		case "PROVISIONER_NAME":
			tg.provisioner = e.Value
		case "NFS_SERVER":
			tg.server = e.Value
		case "NFS_PATH":
			tg.path = e.Value
		}
	}
	if tg.provisioner == "" || tg.server == "" || tg.path == "" {
		return tg, "PROVISIONER_NAME, NFS_SERVER or NFS_PATH not set"
	}
	if d.Status.ObservedGeneration < d.Generation {
		return tg, "rollout not observed yet"
	}
	available := false
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentAvailable && c.Status == corev1.ConditionTrue {
			available = true
		}
	}
	if !available || d.Status.AvailableReplicas < 1 {
		return tg, fmt.Sprintf("Deployment not Available (%d/%d replicas available)", d.Status.AvailableReplicas, d.Status.Replicas)
	}
	return tg, ""
}

// checkMount mounts the export the way the pod's volume would; a pod whose
// NFS volume cannot be mounted never runs. Failures are retried every 5s.
func (s *StandIn) checkMount(ctx context.Context, tg target) string {
	s.mu.Lock()
	if sv, ok := s.controllers[tg.provisioner]; ok {
		if cur, active := sv.p.current(); active && cur == tg {
			s.mu.Unlock()
			return ""
		}
	}
	if next, ok := s.mountRetry[tg]; ok && time.Now().Before(next) {
		s.mu.Unlock()
		return "NFS export not mountable (retrying)"
	}
	s.mu.Unlock()
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m, err := nfs.Dial(mctx, tg.server, s.opts.NFSPort, tg.path)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.mountRetry[tg] = time.Now().Add(5 * time.Second)
		return fmt.Sprintf("NFS export not mountable: %v", err)
	}
	m.Close()
	delete(s.mountRetry, tg)
	return ""
}

func (s *StandIn) newController(ctx context.Context, name string) *served {
	ctx, cancel := context.WithCancel(ctx)
	log := s.log.With().Str("provisioner", name).Logger()
	sv := &served{p: &provisioner{name: name, port: s.opts.NFSPort, client: s.opts.Client, log: log}, cancel: cancel, done: make(chan struct{})}
	logger := logr.New(zerologSink{log: log})
	pc := controller.NewProvisionController(logger, s.opts.Client, name, sv.p,
		controller.LeaderElection(false),
		controller.ExponentialBackOffOnError(false),
		// Claims skipped while the provisioner was not running are looked
		// at again on every resync.
		controller.ResyncPeriod(2*time.Second),
	)
	go func() {
		defer close(sv.done)
		pc.Run(klog.NewContext(ctx, logger))
	}()
	return sv
}
