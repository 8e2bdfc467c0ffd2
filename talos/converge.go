package talos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/homelab/bootstrap/internal/sealed"
	"github.com/homelab/bootstrap/internal/wait"
)

// ConvergeOptions is one run of the talos stage's cluster work.
type ConvergeOptions struct {
	// Nodes in configuration order, with their rendered configs.
	Nodes []Target
	// BootstrapNode names the control plane to bootstrap etcd on: the one
	// recorded by an earlier run, else empty for the first control plane.
	BootstrapNode string
	// KubeconfigPath is where the admin kubeconfig is kept (0600), by
	// Files: age-encrypted (KubeconfigPath + ".age") when they seal.
	KubeconfigPath string
	Files          *sealed.Files
	// Mutate wraps every change (apply, bootstrap, kubeconfig write); the
	// stage passes env.Wet. Nil executes.
	Mutate Mutator
	// DryRun reads what it can (probes, the nodes' own dry-run diffs, etcd)
	// and records the rest through Mutate without waiting on anything.
	DryRun bool
	// OnNodeConverged is called as each node reaches its config (to record
	// progress in state mid-stage). Optional.
	OnNodeConverged func(t Target, res EnsureResult)
	// OnBootstrapped is called once etcd is bootstrapped (or found so);
	// thisRun says this run bootstrapped (or restored) it.
	OnBootstrapped func(node string, thisRun bool)
	// Parallelism bounds how many nodes are taken to their config at once
	// (0: all).
	Parallelism int
	// CNIDisabled: Talos deploys no CNI (cluster.network.cni none); nodes
	// are not Ready until one is installed, and the health wait skips that.
	CNIDisabled bool
	// Recover, when set, starts etcd from this snapshot instead of an
	// empty data directory (bootstrap restore). It is only used when etcd
	// runs nowhere.
	Recover *Recovery
	// BootstrappedAt is when an earlier run bootstrapped etcd (zero if
	// never). When it is set, etcd runs nowhere and every control plane was
	// found without a config (the VMs were re-created: etcd's data is
	// gone), Converge stops with an EtcdLostError instead of bootstrapping
	// an empty etcd, unless NewEtcd or Recover.
	BootstrappedAt time.Time
	NewEtcd        bool
	// Now is the clock the kubeconfig's certificate is judged by (nil:
	// time.Now).
	Now func() time.Time
}

// EtcdLostError stops a run that would otherwise bootstrap an empty etcd
// in place of one whose data was lost.
type EtcdLostError struct {
	Node           string
	BootstrappedAt time.Time
}

func (e *EtcdLostError) Error() string {
	return fmt.Sprintf("etcd was bootstrapped on %s at %s, but every control plane came up without a config and etcd runs nowhere: its data is gone (were the VMs re-created?); "+
		"bootstrapping now would start an empty cluster. Restore a snapshot with `bootstrap restore --from FILE`, or start empty with `bootstrap run --stage talos --new-etcd`",
		e.Node, e.BootstrappedAt.UTC().Format(time.RFC3339))
}

// ConvergeResult reports a Converge run.
type ConvergeResult struct {
	Nodes map[string]EnsureResult
	// BootstrapNode is the control plane etcd runs from.
	BootstrapNode string
	// Bootstrapped is true when this run bootstrapped etcd (false when it
	// already ran).
	Bootstrapped bool
	// Recovered is true when this run started etcd from the Recover
	// snapshot.
	Recovered bool
	// Planned is true when changes were only recorded (a dry run).
	Planned          bool
	KubeconfigPath   string
	KubeconfigWrote  bool
	APIServerVersion string

	kubeconfig []byte
	// freshControlPlanes counts control planes found without a config.
	freshControlPlanes int
}

// Converge takes the nodes to a healthy cluster: every node to its config
// (control planes dispatched first), etcd bootstrapped once on the
// bootstrap control plane as soon as the control planes run their
// installed systems — workers are not waited for: their API certificate
// comes from a control plane's trustd, which a VIP endpoint only reaches
// once etcd runs —, control planes whose etcd gave up joining rebooted,
// then the workers, the cluster healthy as `talosctl health` judges it, and
// a kubeconfig that reaches the API server.
func (o *Ops) Converge(ctx context.Context, opts ConvergeOptions) (*ConvergeResult, error) {
	mutate := opts.Mutate
	if mutate == nil {
		mutate = Execute
	}
	boot, err := bootstrapTarget(opts.Nodes, opts.BootstrapNode)
	if err != nil {
		return nil, err
	}
	res := &ConvergeResult{Nodes: map[string]EnsureResult{}, BootstrapNode: boot.Name}
	opts.Nodes = controlPlanesFirst(opts.Nodes)

	if opts.DryRun {
		if err := o.convergeNodes(ctx, opts, mutate, res, nil); err != nil {
			return res, err
		}
		for _, r := range res.Nodes {
			res.Planned = res.Planned || r.Action == ActionPlanned
		}
		return res, o.planCluster(ctx, opts, boot, mutate, res)
	}

	cps := make(chan bool, 1)
	nodesDone := make(chan error, 1)
	nctx, cancelNodes := context.WithCancel(ctx)
	defer cancelNodes()
	go func() { nodesDone <- o.convergeNodes(nctx, opts, mutate, res, cps) }()
	select {
	case ok := <-cps:
		if !ok {
			// A control plane failed: no bootstrap; report once the others
			// are done too.
			return res, <-nodesDone
		}
	case err := <-nodesDone:
		if err != nil {
			return res, err
		}
	}

	// Bootstrap only when etcd runs nowhere: a cluster that runs is left
	// alone (even if the config's first control plane changed since), and
	// an interrupted earlier bootstrap answers AlreadyExists.
	started, err := o.etcdMemberOf(ctx, opts.Nodes, boot)
	if err != nil {
		return res, err
	}
	if started != nil && started.Name != boot.Name {
		o.opts.Log.Warn().Str("node", started.Name).Msgf("etcd already runs on %s; not bootstrapping %s", started, boot)
		boot, res.BootstrapNode = *started, started.Name
	}
	if started == nil {
		if err := o.startEtcd(ctx, opts, boot, mutate, res); err != nil {
			return res, err
		}
	}
	if opts.OnBootstrapped != nil {
		opts.OnBootstrapped(boot.Name, res.Bootstrapped)
	}
	if err := o.recoverFailedEtcd(ctx, opts.Nodes, mutate); err != nil {
		return res, err
	}
	if err := <-nodesDone; err != nil {
		return res, err
	}

	var health []HealthTarget
	for _, t := range opts.Nodes {
		health = append(health, HealthTarget{Name: t.Name, IP: t.IP, Role: t.Role})
	}
	in := HealthInput{Nodes: health, CNIDisabled: opts.CNIDisabled, TolerateUnexpected: true}
	// The kubeconfig is fetched, written and tried beside the Talos
	// side's wait: a control plane mints it from its machine config
	// whether or not the API server runs (machined's Kubeconfig,
	// internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go at
	// v1.13.3; talossim's answers the same way), and the API server
	// answers while etcd's other members still join.
	kubeconfig := make(chan error, 1)
	kctx, cancelKubeconfig := context.WithCancel(ctx)
	defer cancelKubeconfig()
	go func() { kubeconfig <- o.ensureKubeconfig(kctx, opts, boot, mutate, res) }()
	if err := o.WaitHealthy(ctx, fmt.Sprintf("the cluster's Talos side healthy (etcd on %d control plane(s), apid, kubelet, boot sequences)", len(opts.Nodes)-workers(opts.Nodes)), in); err != nil {
		cancelKubeconfig()
		<-kubeconfig
		return res, err
	}
	if err := <-kubeconfig; err != nil {
		return res, err
	}
	cs, err := kubeClient(res.kubeconfig)
	if err != nil {
		return res, err
	}
	in.Kube, in.KubeSideOnly = cs, true
	return res, o.WaitHealthy(ctx, "the cluster healthy as talosctl health judges it", in)
}

// startEtcd bootstraps etcd on boot, from the recovery snapshot when there
// is one, unless the etcd of an earlier bootstrap was lost with the VMs.
func (o *Ops) startEtcd(ctx context.Context, opts ConvergeOptions, boot Target, mutate Mutator, res *ConvergeResult) error {
	if opts.Recover != nil {
		return mutate(fmt.Sprintf("restore etcd on %s from %s (EtcdRecover, then bootstrap with recover_etcd)", boot, opts.Recover.Name), func() error {
			already, err := o.RecoverEtcd(ctx, boot.Name, boot.IP, *opts.Recover)
			res.Bootstrapped, res.Recovered = !already, !already
			return err
		})
	}
	if err := etcdLost(opts, res.freshControlPlanes); err != nil {
		return err
	}
	return mutate(fmt.Sprintf("bootstrap etcd on %s", boot), func() error {
		already, err := o.Bootstrap(ctx, boot.Name, boot.IP)
		res.Bootstrapped = !already
		return err
	})
}

// etcdLost returns an EtcdLostError when an earlier run bootstrapped etcd
// and every control plane was found without a config (fresh control
// planes: fresh counts them).
func etcdLost(opts ConvergeOptions, fresh int) error {
	cps := len(opts.Nodes) - workers(opts.Nodes)
	if opts.BootstrappedAt.IsZero() || opts.NewEtcd || opts.Recover != nil || cps == 0 || fresh < cps {
		return nil
	}
	return &EtcdLostError{Node: opts.BootstrapNode, BootstrappedAt: opts.BootstrappedAt}
}

func workers(nodes []Target) int {
	n := 0
	for _, t := range nodes {
		if t.Role != RoleControlPlane {
			n++
		}
	}
	return n
}

// controlPlanesFirst orders the nodes control planes first, each group in
// configuration order.
func controlPlanesFirst(nodes []Target) []Target {
	out := slices.Clone(nodes)
	slices.SortStableFunc(out, func(a, b Target) int {
		return boolRank(b.Role == RoleControlPlane) - boolRank(a.Role == RoleControlPlane)
	})
	return out
}

// etcdMemberOf returns a control plane (boot first) that is an etcd
// member, or nil when none is: then, and only then, bootstrapping is safe.
// A node is a member when its etcd lists members (EtcdMemberList asks etcd
// through the control planes' endpoints, so it answers for the cluster) or
// when its etcd service is Running: the service only runs once its pre
// stage has initialised (bootstrap) or joined the member, even before it is
// healthy. Any other state says nothing: a control plane never bootstrapped
// shows Waiting, then Preparing while it tries to join for EtcdJoinTimeout,
// then Failed (services/etcd.go buildInitialCluster at v1.13.3).
func (o *Ops) etcdMemberOf(ctx context.Context, nodes []Target, boot Target) (*Target, error) {
	order := []Target{boot}
	for _, t := range nodes {
		if t.Role == RoleControlPlane && t.Name != boot.Name {
			order = append(order, t)
		}
	}
	for _, t := range order {
		members, err := o.EtcdMembers(ctx, t.IP)
		if err == nil && len(members) > 0 {
			// Any control plane answers for the cluster: name a member.
			for _, c := range order {
				if slices.ContainsFunc(members, func(m EtcdMember) bool { return m.Hostname == c.Name && !m.Learner }) {
					return &c, nil
				}
			}
			return &t, nil
		}
		if err != nil && fatalWhileWaiting(err) != nil {
			return nil, err
		}
		svcs, err := o.Services(ctx, t.IP)
		if err != nil {
			if fatalWhileWaiting(err) != nil {
				return nil, err
			}
			continue
		}
		if s, ok := findService(svcs, "etcd"); ok && s.State == "Running" {
			return &t, nil
		}
	}
	return nil, nil
}

// recoverFailedEtcd reboots the control planes whose etcd service gave up
// joining (it tries for EtcdJoinTimeout, 30 min, and then stays Failed
// until the boot sequence times out and the node reboots): after a reboot
// it joins the cluster that now exists.
func (o *Ops) recoverFailedEtcd(ctx context.Context, nodes []Target, mutate Mutator) error {
	for _, t := range nodes {
		if t.Role != RoleControlPlane {
			continue
		}
		svcs, err := o.Services(ctx, t.IP)
		if err != nil {
			continue // the health wait reports it
		}
		s, ok := findService(svcs, "etcd")
		if !ok || s.State != "Failed" {
			continue
		}
		o.opts.Log.Warn().Str("node", t.Name).Str("event", s.LastEvent).Msgf("etcd on %s gave up joining before etcd was bootstrapped", t)
		if err := mutate(fmt.Sprintf("reboot %s: its etcd service failed waiting for a cluster to join (%s)", t, s.LastEvent), func() error {
			return o.Reboot(ctx, t)
		}); err != nil {
			return err
		}
	}
	return nil
}

// keepKubeconfig keeps a kubeconfig that works in the form Files gives
// (age-encrypted once secrets.age.recipients is set, plaintext once it is
// not) when it is kept in the other; one in the right form is left alone.
func keepKubeconfig(opts ConvergeOptions, data []byte, mutate Mutator, res *ConvergeResult) error {
	_, same, err := opts.Files.Compare(opts.KubeconfigPath, data)
	if err != nil || same {
		return err
	}
	what := "keep the kubeconfig as " + opts.Files.Path(opts.KubeconfigPath)
	if opts.Files.Sealing() {
		what += " (age-encrypted to secrets.age.recipients)"
	}
	return mutate(what, func() error {
		wrote, err := opts.Files.WriteIfChanged(opts.KubeconfigPath, data)
		res.KubeconfigWrote = wrote
		return err
	})
}

// planCluster records what a real run would still do after the nodes.
func (o *Ops) planCluster(ctx context.Context, opts ConvergeOptions, boot Target, mutate Mutator, res *ConvergeResult) error {
	etcdRuns := false
	if r := res.Nodes[boot.Name]; r.Found == ModeConfigured {
		members, err := o.EtcdMembers(ctx, boot.IP)
		etcdRuns = err == nil && len(members) > 0
	}
	if !etcdRuns || opts.Recover != nil && opts.Recover.Replaces {
		what := fmt.Sprintf("bootstrap etcd on %s and wait for etcd and kubelet health", boot)
		if opts.Recover != nil {
			what = fmt.Sprintf("restore etcd on %s from %s (EtcdRecover, then bootstrap with recover_etcd), let the other control planes join and wait for etcd and kubelet health", boot, opts.Recover.Name)
		} else if err := etcdLost(opts, res.freshControlPlanes); err != nil {
			what = "stop before bootstrapping: " + err.Error()
		}
		if err := mutate(what, noop); err != nil {
			return err
		}
		res.Planned = true
	}
	if existing, err := opts.Files.Read(opts.KubeconfigPath); err == nil {
		if v, err := CheckAPIServer(ctx, existing, o.opts.CallTimeout); err == nil {
			res.APIServerVersion = v
			return keepKubeconfig(opts, existing, mutate, res)
		}
	}
	res.Planned = true
	return mutate(fmt.Sprintf("fetch the kubeconfig from %s into %s", boot, opts.Files.Path(opts.KubeconfigPath)), noop)
}

func bootstrapTarget(nodes []Target, name string) (Target, error) {
	for _, t := range nodes {
		if t.Role != RoleControlPlane {
			continue
		}
		if name == "" || t.Name == name {
			return t, nil
		}
	}
	if name != "" {
		return Target{}, fmt.Errorf("etcd was bootstrapped on %s, which is no longer a control plane in the config; refusing to bootstrap another node", name)
	}
	return Target{}, errors.New("no control-plane node to bootstrap")
}

// convergeNodes takes every node to its config, at most Parallelism at a
// time in the order given. When cps is set it receives, once, whether every
// control plane converged, as soon as the last one is done (the workers may
// still be converging).
func (o *Ops) convergeNodes(ctx context.Context, opts ConvergeOptions, mutate Mutator, res *ConvergeResult, cps chan<- bool) error {
	names := make([]string, 0, len(opts.Nodes))
	byName := map[string]Target{}
	for _, t := range opts.Nodes {
		names = append(names, t.Name)
		byName[t.Name] = t
	}
	// At most Parallelism nodes at a time, started in configuration order
	// so that the first control plane (the bootstrap node) goes first.
	par := opts.Parallelism
	if par <= 0 || par > len(opts.Nodes) {
		par = len(opts.Nodes)
	}
	turn := map[string]chan struct{}{}
	for _, n := range names {
		turn[n] = make(chan struct{})
	}
	slots := make(chan struct{}, max(par, 1))
	dctx, stopDispatch := context.WithCancel(ctx)
	defer stopDispatch()
	go func() {
		for _, n := range names {
			select {
			case slots <- struct{}{}:
				close(turn[n])
			case <-dctx.Done():
				return
			}
		}
	}()
	var mu sync.Mutex
	cpsLeft, cpsOK := 0, true
	for _, t := range opts.Nodes {
		if t.Role == RoleControlPlane {
			cpsLeft++
		}
	}
	cpDone := func(ok bool) {
		mu.Lock()
		defer mu.Unlock()
		cpsOK = cpsOK && ok
		if cpsLeft--; cpsLeft == 0 && cps != nil {
			cps <- cpsOK
		}
	}
	failed := wait.Each(ctx, o.opts.Log, "nodes configured", o.opts.ProgressEvery, names, func(ctx context.Context, name string) (err error) {
		t := byName[name]
		if t.Role == RoleControlPlane {
			defer func() { cpDone(err == nil) }()
		}
		select {
		case <-turn[name]:
			defer func() { <-slots }()
		case <-ctx.Done():
			return ctx.Err()
		}
		r, err := o.EnsureConfig(ctx, t, EnsureOptions{Mutate: mutate, DryRun: opts.DryRun})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		res.Nodes[t.Name] = r
		if t.Role == RoleControlPlane && r.Found == ModeMaintenance {
			res.freshControlPlanes++
		}
		if opts.OnNodeConverged != nil {
			opts.OnNodeConverged(t, r)
		}
		return nil
	})
	if len(failed) == 0 {
		return nil
	}
	errs := wait.Errors(failed)
	// Another cluster's node is the most useful thing to say first.
	slices.SortStableFunc(errs, func(a, b error) int {
		var fa, fb *ForeignNodeError
		return boolRank(errors.As(b, &fb)) - boolRank(errors.As(a, &fa))
	})
	if len(errs) == 1 {
		return errs[0]
	}
	msgs := make([]string, 0, len(errs))
	for _, e := range errs {
		msgs = append(msgs, e.Error())
	}
	return fmt.Errorf("%d nodes failed:\n  %s: %w", len(errs), strings.Join(msgs[1:], "\n  "), errs[0])
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// ensureKubeconfig keeps a kubeconfig that already reaches the API server
// and whose client certificate stays valid for RenewBefore more (Talos
// mints a new client certificate on every fetch, so fetching each run
// would rewrite the file), else fetches one from the bootstrap node,
// writes it (0600) and checks that it reaches the API server. The
// certificate is renewed on the talosconfig's rule: a run in its last 30
// days replaces it while it still works, instead of after it expired,
// when the nightly postcheck can no longer reach the cluster.
func (o *Ops) ensureKubeconfig(ctx context.Context, opts ConvergeOptions, boot Target, mutate Mutator, res *ConvergeResult) error {
	path := opts.Files.Path(opts.KubeconfigPath)
	res.KubeconfigPath = path
	now := time.Now()
	if opts.Now != nil {
		now = opts.Now()
	}
	what := "write kubeconfig " + path
	if existing, err := opts.Files.Read(opts.KubeconfigPath); err == nil {
		exp, expErr := KubeconfigCertExpiry(existing)
		switch v, err := CheckAPIServer(ctx, existing, o.opts.CallTimeout); {
		case err != nil:
			o.opts.Log.Info().Err(err).Msg("existing kubeconfig does not reach the API server; fetching a new one")
		case expErr == nil && exp.Before(now.Add(RenewBefore)):
			o.opts.Log.Info().Time("expires", exp).Msg("the kubeconfig's client certificate expires within 30 days; fetching a new one")
			what = fmt.Sprintf("renew kubeconfig %s (its client certificate expires %s)", path, exp.UTC().Format(time.RFC3339))
		default:
			res.APIServerVersion, res.kubeconfig = v, existing
			return keepKubeconfig(opts, existing, mutate, res)
		}
	}
	data, err := o.Kubeconfig(ctx, boot.Name, boot.IP)
	if err != nil {
		return err
	}
	res.kubeconfig = data
	ran := false
	if err := mutate(what, func() error {
		ran = true
		wrote, err := opts.Files.WriteIfChanged(opts.KubeconfigPath, data)
		res.KubeconfigWrote = wrote
		if err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		return nil
	}); err != nil {
		return err
	}
	if !ran {
		return nil
	}
	spec := wait.Spec{
		What:          "the Kubernetes API server to answer with the fetched kubeconfig",
		Timeout:       o.opts.HealthTimeout,
		Interval:      o.opts.PollInterval,
		ProgressEvery: o.opts.ProgressEvery,
		Log:           o.opts.Log,
	}
	return wait.Until(ctx, spec, func(ctx context.Context) (bool, string, error) {
		v, err := CheckAPIServer(ctx, data, o.opts.CallTimeout)
		if err != nil {
			// Wrong credentials do not heal by waiting; an API server that
			// is still starting does.
			if apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err) || strings.Contains(err.Error(), "x509:") || strings.Contains(err.Error(), "remote error: tls:") {
				return false, "", fmt.Errorf("the kubeconfig from %s does not work: %w", boot, err)
			}
			return false, err.Error(), nil
		}
		res.APIServerVersion = v
		return true, "", nil
	})
}
