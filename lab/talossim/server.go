package talossim

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"fmt"
	goruntime "runtime"
	"slices"
	"strings"
	"time"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/state"
	cosiserver "github.com/cosi-project/runtime/pkg/state/protobuf/server"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configdiff"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/container"
	"github.com/siderolabs/talos/pkg/machinery/config/validation"
	"github.com/siderolabs/talos/pkg/machinery/role"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// metalMode is the runtime mode a metal node validates configs in.
type metalMode struct{}

// String implements validation.RuntimeMode.
func (metalMode) String() string { return "metal" }

// RequiresInstall implements validation.RuntimeMode.
func (metalMode) RequiresInstall() bool { return true }

// InContainer implements validation.RuntimeMode.
func (metalMode) InContainer() bool { return false }

// apid serves one boot of one node in one mode; a reboot gets a new one.
type apid struct {
	machine.UnimplementedMachineServiceServer

	n    *Node
	mode serveMode
}

// adminOnly lists the methods that need os:admin; the rest are readable
// with os:reader. In maintenance mode a client without a certificate holds
// os:reader, and ApplyConfiguration is allowed to it there
// (v1alpha1_server.go ApplyConfiguration: "!inMaintenance &&
// !roles.Includes(role.Admin)").
// The roles of the other methods are the rules in
// internal/app/machined/pkg/system/services/machined.go at v1.13.3
// (EtcdRecover, Upgrade and Reset: os:admin; EtcdSnapshot: admin, operator or
// etcd:backup).
var adminOnly = map[string]bool{
	machine.MachineService_ApplyConfiguration_FullMethodName: true,
	machine.MachineService_Bootstrap_FullMethodName:          true,
	machine.MachineService_Kubeconfig_FullMethodName:         true,
	machine.MachineService_Reboot_FullMethodName:             true,
	machine.MachineService_EtcdRecover_FullMethodName:        true,
	machine.MachineService_Upgrade_FullMethodName:            true,
	machine.MachineService_Reset_FullMethodName:              true,
	// machined.go at v1.14.0-rc.1: "/machine.LifecycleService/Upgrade":
	// os:admin.
	machine.LifecycleService_Upgrade_FullMethodName: true,
}

// needRoles lists the methods whose roles are neither admin only nor
// every reader.
var needRoles = map[string]role.Set{
	machine.MachineService_EtcdSnapshot_FullMethodName: role.MakeSet(role.Admin, role.Operator, role.EtcdBackup),
	machine.MachineService_ImagePull_FullMethodName:    role.MakeSet(role.Admin, role.Operator),
	machine.ImageService_Pull_FullMethodName:           role.MakeSet(role.Admin, role.Operator),
}

func newGRPCServer(n *Node, tlsCfg *tls.Config, mode serveMode) *grpc.Server {
	a := &apid{n: n, mode: mode}
	srv := grpc.NewServer(
		grpc.Creds(credentials.NewTLS(tlsCfg)),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := a.admit(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := a.admit(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	)
	machine.RegisterMachineServiceServer(srv, a)
	machine.RegisterImageServiceServer(srv, imageService{a: a})
	machine.RegisterLifecycleServiceServer(srv, lifecycleService{a: a})
	cosiv1alpha1.RegisterStateServer(srv, cosiserver.NewState(state.Filter(n.cosi, readOnly)))
	return srv
}

func readOnly(_ context.Context, access state.Access) error {
	if !access.Verb.Readonly() {
		return status.Error(codes.PermissionDenied, "resources are read-only")
	}
	return nil
}

// admit counts the call, adds the profile's latency, refuses proxying to
// other nodes (not simulated) and, in configured mode, checks the role the
// client certificate carries.
func (a *apid) admit(ctx context.Context, method string) error {
	n := a.n
	n.mu.Lock()
	n.counters.Calls++
	n.mu.Unlock()
	if d := n.sim.scaled(n.sim.opts.Profile.CallLatency); d > 0 {
		time.Sleep(d)
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		for _, target := range append(md.Get("node"), md.Get("nodes")...) {
			if target != n.ip {
				return status.Errorf(codes.Unimplemented, "talossim: proxying to node %s is not simulated; connect to it directly", target)
			}
		}
	}
	// A service the node's Talos does not register is refused by gRPC
	// itself, before any interceptor: Unimplemented "unknown service".
	if svc, ok := lifecycleServiceOf(method); ok {
		n.mu.Lock()
		has := hasLifecycle(n.version)
		n.mu.Unlock()
		if !has {
			return status.Errorf(codes.Unimplemented, "unknown service %s", svc)
		}
	}
	roles := peerRoles(ctx)
	if a.mode == serveMaintenance {
		roles = role.MakeSet(role.Reader)
		if method == machine.MachineService_ApplyConfiguration_FullMethodName {
			return nil
		}
	}
	need := role.MakeSet(role.Admin, role.Operator, role.Reader)
	if adminOnly[method] {
		need = role.MakeSet(role.Admin)
	}
	if r, ok := needRoles[method]; ok {
		need = r
	}
	if !roles.IncludesAny(need) {
		return status.Errorf(codes.PermissionDenied, "not authorized: %s needs one of %v", method, need.Strings())
	}
	return nil
}

func peerRoles(ctx context.Context) role.Set {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return role.MakeSet()
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return role.MakeSet()
	}
	set, _ := role.Parse(info.State.VerifiedChains[0][0].Subject.Organization)
	return set
}

// Version implements machine.MachineServiceServer. A Proxmox VM booted
// from the nocloud image runs the nocloud platform, whose mode is cloud
// (the platform's Mode(), reported as a string by Version).
func (a *apid) Version(context.Context, *emptypb.Empty) (*machine.VersionResponse, error) {
	return &machine.VersionResponse{Messages: []*machine.Version{{
		Version: &machine.VersionInfo{
			Tag: a.n.Version(), Sha: "talossim", Built: "talossim",
			GoVersion: goruntime.Version(), Os: "linux", Arch: "amd64",
		},
		Platform: &machine.PlatformInfo{Name: "nocloud", Mode: "cloud"},
	}}}, nil
}

// SystemStat implements machine.MachineServiceServer as
// v1alpha1_monitoring.go does at v1.13.9 (and v1.14.0-rc.1) for what the
// product reads: BootTime, /proc/stat's btime in unix seconds, the time
// the running kernel booted; it changes with every reboot and only then.
// The CPU, IRQ and process counters are not simulated (zero). os:reader
// is enough (services/machined.go rules).
func (a *apid) SystemStat(context.Context, *emptypb.Empty) (*machine.SystemStatResponse, error) {
	return &machine.SystemStatResponse{Messages: []*machine.SystemStat{{BootTime: a.n.BootTime()}}}, nil
}

// parseAndValidate loads and validates a config as ApplyConfiguration
// does: the loader, Validate in the platform's mode, then the runtime
// validation that checks the Kubernetes images against the Talos version
// the node runs (v1alpha1_validation.go ValidateKubernetesImageTag).
func parseAndValidate(data []byte, talosVersion string) (config.Provider, []string, error) {
	cfg, err := configloader.NewFromBytes(data)
	if err != nil {
		return nil, nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := unregisteredKind(cfg, talosVersion); err != nil {
		return nil, nil, status.Error(codes.InvalidArgument, err.Error())
	}
	// Local: machinery checks the Kubernetes images against the Talos it
	// was built as (compatibility.ValidateKubernetesImageTag reads
	// version.NewVersion(): v1.14.1 here), which a real node does against
	// its own build. The simulated node runs many versions, so that check
	// is validateKubernetesImages against the version it runs; Local skips
	// nothing else (config/validation/validation.go WithLocal, read by
	// v1alpha1_validation.go and config/types/k8s at machinery v1.14.1).
	warnings, err := cfg.ValidateAsClient(metalMode{}, validation.WithLocal())
	if err != nil {
		return nil, nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := validateKubernetesImages(cfg, talosVersion); err != nil {
		return nil, nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return cfg, warnings, nil
}

func (a *apid) applyDelay() {
	n := a.n
	n.mu.Lock()
	d := n.sim.scaled(n.sim.opts.Profile.ApplyLatency) + n.faults.ApplyDelay
	n.mu.Unlock()
	// The node works on the request whether or not the caller still waits
	// (a caller that timed out does not undo an apply).
	if d > 0 {
		time.Sleep(d)
	}
}

// ApplyConfiguration implements machine.MachineServiceServer, in the order
// of v1alpha1_server.go: one apply at a time, none after a reboot was
// accepted, then parsing and validation, then the mode.
func (a *apid) ApplyConfiguration(_ context.Context, in *machine.ApplyConfigurationRequest) (*machine.ApplyConfigurationResponse, error) {
	n := a.n
	n.mu.Lock()
	if n.applying {
		n.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "another apply configuration is already in progress")
	}
	if n.rebootPending {
		n.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "configuration was already applied and node is rebooting, cannot apply more configuration changes until next reboot")
	}
	n.applying = true
	version := n.version
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		n.applying = false
		n.mu.Unlock()
	}()
	a.applyDelay()
	cfg, warnings, err := parseAndValidate(in.GetData(), version)
	if err != nil {
		return nil, err
	}
	if a.mode == serveMaintenance {
		return a.applyMaintenance(in, cfg, warnings)
	}
	return a.applyConfigured(in, cfg, warnings)
}

// applyMaintenance accepts every mode (REBOOT becomes NO_REBOOT: there is
// nothing to reboot from yet) and answers a dry run with the diff against
// the empty configuration, as generateDiff does.
func (a *apid) applyMaintenance(in *machine.ApplyConfigurationRequest, cfg config.Provider, warnings []string) (*machine.ApplyConfigurationResponse, error) {
	mode := in.GetMode()
	details := "Applied configuration without a reboot"
	switch mode {
	case machine.ApplyConfigurationRequest_REBOOT, machine.ApplyConfigurationRequest_AUTO:
		mode = machine.ApplyConfigurationRequest_NO_REBOOT
	case machine.ApplyConfigurationRequest_STAGED:
		// What a staged apply does before any config exists is unverified;
		// it is taken like the others.
		details = "Staged configuration to be applied after the next reboot"
	}
	n := a.n
	if in.GetDryRun() {
		empty, err := container.New()
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		diff, err := configdiff.DiffConfigs(empty, cfg)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "failed to generate diff: %v", err)
		}
		if diff == "" {
			diff = "No changes."
		}
		n.mu.Lock()
		n.counters.DryRuns++
		n.mu.Unlock()
		return &machine.ApplyConfigurationResponse{Messages: []*machine.ApplyConfiguration{{
			Mode: mode, Warnings: warnings,
			ModeDetails: fmt.Sprintf("Dry run summary:\n%s (skipped in dry-run).\nConfig diff:\n\n%s", details, diff),
		}}}, nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.phase != PhaseMaintenance {
		// The maintenance API of this boot is about to close.
		return nil, status.Error(codes.FailedPrecondition, "another apply configuration is already in progress")
	}
	n.counters.Applies++
	n.counters.MaintenanceApplies++
	n.installLocked(slices.Clone(in.GetData()), cfg)
	return &machine.ApplyConfigurationResponse{Messages: []*machine.ApplyConfiguration{{
		Mode: mode, Warnings: warnings, ModeDetails: details,
	}}}, nil
}

func (a *apid) applyConfigured(in *machine.ApplyConfigurationRequest, cfg config.Provider, warnings []string) (*machine.ApplyConfigurationResponse, error) {
	if cfg.RawV1Alpha1() == nil {
		return nil, status.Error(codes.InvalidArgument, "the applied machine configuration doesn't contain v1alpha1 config, did you mean to patch the machine config instead?")
	}
	n := a.n
	n.mu.Lock()
	defer n.mu.Unlock()
	immediateErr := canApplyImmediate(n.parsed, cfg)
	mode := in.GetMode()
	details := "Applied configuration with a reboot"
	if atLeast114(n.version) {
		// v1.14: nothing is compared, nothing reboots.
		immediateErr = nil
		switch mode {
		case machine.ApplyConfigurationRequest_REBOOT:
			return nil, status.Error(codes.Unimplemented, "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes instead")
		case machine.ApplyConfigurationRequest_AUTO:
			mode = machine.ApplyConfigurationRequest_NO_REBOOT
		}
	}
	switch mode {
	case machine.ApplyConfigurationRequest_TRY, machine.ApplyConfigurationRequest_NO_REBOOT:
		if immediateErr != nil {
			return nil, status.Error(codes.InvalidArgument, immediateErr.Error())
		}
		details = "Applied configuration without a reboot"
	case machine.ApplyConfigurationRequest_STAGED:
		details = "Staged configuration to be applied after the next reboot"
	case machine.ApplyConfigurationRequest_AUTO:
		if immediateErr != nil {
			mode = machine.ApplyConfigurationRequest_REBOOT
		} else {
			mode, details = machine.ApplyConfigurationRequest_NO_REBOOT, "Applied configuration without a reboot"
		}
	case machine.ApplyConfigurationRequest_REBOOT:
	default:
		return nil, status.Errorf(codes.InvalidArgument, "incorrect mode '%s' specified for the apply config call", mode)
	}
	if in.GetDryRun() {
		n.counters.DryRuns++
		diff, err := configdiff.DiffConfigs(n.parsed, cfg)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "failed to generate diff: %v", err)
		}
		if diff == "" {
			diff = "No changes."
		}
		return &machine.ApplyConfigurationResponse{Messages: []*machine.ApplyConfiguration{{
			Mode:        mode,
			ModeDetails: fmt.Sprintf("Dry run summary:\n%s (skipped in dry-run).\nConfig diff:\n\n%s", details, diff),
		}}}, nil
	}
	if n.phase != PhaseRunning {
		// An apply while the installer runs is not modelled (unverified).
		return nil, status.Error(codes.FailedPrecondition, "talossim: applying a config while the node installs is not simulated")
	}
	n.counters.Applies++
	data := slices.Clone(in.GetData())
	switch mode {
	case machine.ApplyConfigurationRequest_TRY, machine.ApplyConfigurationRequest_NO_REBOOT:
		n.sim.persistConfig(n.ip, data)
		before := imagesOf(n.parsed)
		n.config, n.parsed = data, cfg
		n.kubernetesImagesChangedLocked(before, imagesOf(cfg))
		publishManifests(n.cosi, cfg)
		// Talos' volume manager takes a new user volume without a
		// reboot (unverified which apply modes Talos picks for it).
		publishUserVolumes(n.cosi, cfg)
	case machine.ApplyConfigurationRequest_STAGED:
		n.sim.persistConfig(n.ip, data)
	case machine.ApplyConfigurationRequest_REBOOT:
		n.sim.persistConfig(n.ip, data)
		n.scheduleRebootLocked()
	}
	return &machine.ApplyConfigurationResponse{Messages: []*machine.ApplyConfiguration{{
		Mode: mode, Warnings: warnings, ModeDetails: details,
	}}}, nil
}

// Bootstrap implements machine.MachineServiceServer, in the order of
// v1alpha1_server.go: bootstrap allowed (cri up on the installed system),
// a control plane, time in sync, an empty etcd data directory.
//
// With recover_etcd the new etcd starts from the snapshot EtcdRecover
// uploaded (see recover.go).
func (a *apid) Bootstrap(_ context.Context, req *machine.BootstrapRequest) (*machine.BootstrapResponse, error) {
	n := a.n
	n.mu.Lock()
	n.counters.BootstrapCalls++
	if !n.criUpLocked(time.Now()) {
		n.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "bootstrap is not available yet")
	}
	if n.roleLocked() != "controlplane" {
		n.mu.Unlock()
		return nil, status.Error(codes.Unimplemented, "bootstrap is only available on control plane nodes")
	}
	if n.faults.BootstrapNotReady > 0 {
		n.faults.BootstrapNotReady--
		n.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "time is not in sync yet")
	}
	clusterID, hostname, cfg := n.clusterIDLocked(), n.hostnameLocked(), slices.Clone(n.config)

	s := n.sim
	s.mu.Lock()
	c, member := s.etcdView(clusterID, n.ip)
	if member.started(time.Now()) {
		s.mu.Unlock()
		n.mu.Unlock()
		return nil, status.Error(codes.AlreadyExists, "etcd data directory is not empty")
	}
	if c != nil {
		// This control plane has not joined yet (its etcd waits to
		// discover the cluster), so its data directory is empty and real
		// Talos would start a second, separate etcd cluster here: record
		// the split brain and keep the node out of the first cluster.
		s.splitBrains = append(s.splitBrains, n.ip)
		delete(c.members, n.ip)
		s.mu.Unlock()
		n.counters.Bootstraps++
		n.mu.Unlock()
		n.log.Error().Msg("talossim: bootstrap on a second control plane: a second etcd cluster was started")
		return &machine.BootstrapResponse{Messages: []*machine.Bootstrap{{}}}, nil
	}
	s.bootstrapEtcd(clusterID, n, hostname, time.Now())
	s.mu.Unlock()
	n.counters.Bootstraps++
	var recovery *etcdRecovery
	if req.GetRecoverEtcd() {
		recovery = n.takeRecoverySnapshotLocked(req.GetRecoverSkipHashCheck())
	}
	n.mu.Unlock()

	// Other control planes already up join the new cluster.
	for _, other := range s.Nodes() {
		if other == n {
			continue
		}
		other.mu.Lock()
		// A control plane whose etcd gave up joining (EtcdJoinTimeout)
		// stays Failed until it reboots.
		if other.phase == PhaseRunning && other.roleLocked() == "controlplane" && other.clusterIDLocked() == clusterID &&
			time.Now().Before(other.etcdJoinDeadline) {
			host := other.hostnameLocked()
			s.mu.Lock()
			s.joinEtcd(clusterID, other, host, time.Now())
			s.mu.Unlock()
		}
		other.mu.Unlock()
	}

	go func() {
		start := s.opts.Cluster.Bootstrap
		if recovery != nil {
			start = func(ctx context.Context, cfg []byte) error { return s.recoverCluster(ctx, cfg, recovery) }
		}
		if err := start(context.Background(), cfg); err != nil {
			n.log.Error().Err(err).Msg("talossim: the control plane failed to start")
			s.mu.Lock()
			if c := s.etcd[clusterID]; c != nil {
				c.failed = err
			}
			s.mu.Unlock()
		}
	}()
	return &machine.BootstrapResponse{Messages: []*machine.Bootstrap{{}}}, nil
}

// EtcdMemberList implements machine.MachineServiceServer. It asks etcd
// through the control planes' endpoints, not only the local member
// (etcd.NewClientFromControlPlaneIPs), so any configured control plane of a
// running cluster answers with the cluster's members.
func (a *apid) EtcdMemberList(ctx context.Context, _ *machine.EtcdMemberListRequest) (*machine.EtcdMemberListResponse, error) {
	if a.mode == serveMaintenance {
		return nil, status.Error(codes.Unimplemented, "machine type is not set, cannot use member list API")
	}
	n := a.n
	n.mu.Lock()
	role, clusterID := n.roleLocked(), n.clusterIDLocked()
	n.mu.Unlock()
	if role != "controlplane" {
		return nil, status.Error(codes.Unimplemented, "member list is only available on control plane nodes")
	}
	s := n.sim
	s.mu.Lock()
	now := time.Now()
	if c := s.etcd[clusterID]; c != nil && c.quorumLost {
		s.mu.Unlock()
		// WithRequireLeader (v1alpha1_server.go EtcdMemberList at
		// v1.13.3): without a leader etcd answers ErrGRPCNoLeader
		// (Unavailable "etcdserver: no leader", etcd api/v3rpc/rpctypes),
		// which etcd's client retries (100 times, 25 ms apart:
		// client/v3 options.go) before apid relays it. The code apid
		// relays is unverified.
		t := time.NewTimer(s.scaled(100 * 25 * time.Millisecond))
		defer t.Stop()
		select {
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-t.C:
		}
		return nil, status.Error(codes.Unavailable, "etcdserver: no leader")
	}
	defer s.mu.Unlock()
	c := s.etcd[clusterID]
	if c == nil || len(c.readyMembers(now)) == 0 {
		// No etcd answers at the control planes' endpoints; the exact
		// error apid relays then is unverified.
		return nil, status.Error(codes.Unavailable, "etcd: no member of the cluster answers yet")
	}
	var members []*machine.EtcdMember
	for _, m := range c.members {
		learner := false
		if m.readyAt.After(now) {
			// A joining member is a learner from the moment its etcd starts.
			if m.ip == c.bootstrapNode || !m.started(now) {
				continue
			}
			learner = true
		}
		members = append(members, &machine.EtcdMember{
			Id: m.id, Hostname: m.hostname, IsLearner: learner,
			PeerUrls:   []string{fmt.Sprintf("https://%s:2380", m.ip)},
			ClientUrls: []string{fmt.Sprintf("https://%s:2379", m.ip)},
		})
	}
	slices.SortFunc(members, func(x, y *machine.EtcdMember) int {
		switch {
		case x.Hostname < y.Hostname:
			return -1
		case x.Hostname > y.Hostname:
			return 1
		}
		return 0
	})
	return &machine.EtcdMemberListResponse{Messages: []*machine.EtcdMembers{{Members: members}}}, nil
}

// ServiceList implements machine.MachineServiceServer. A node waiting in
// maintenance mode runs only the base services; the install runs without
// cri, which only the installed system's boot sequence starts
// (StartAllServices), and the Bootstrap RPC waits for it
// (IsBootstrapAllowed). A control plane's etcd waits for cri, then tries to
// join until EtcdJoinTimeout (services/etcd.go buildInitialCluster) and
// fails for good if no cluster was bootstrapped by then.
func (a *apid) ServiceList(context.Context, *emptypb.Empty) (*machine.ServiceListResponse, error) {
	n := a.n
	n.mu.Lock()
	defer n.mu.Unlock()
	return &machine.ServiceListResponse{Messages: []*machine.ServiceList{{Services: n.servicesLocked(a.mode == serveMaintenance, time.Now())}}}, nil
}

// servicesLocked is what ServiceList reports at now, in maintenance mode
// or out of it; n.mu is held (and s.mu is taken, in that order).
func (n *Node) servicesLocked(maintenance bool, now time.Time) []*machine.ServiceInfo {
	role, clusterID, booted, phase := n.roleLocked(), n.clusterIDLocked(), n.bootedAt, n.phase
	joinDeadline, left := n.etcdJoinDeadline, n.etcdLeft
	criUp := n.criUpLocked(now)
	s := n.sim

	var services []*machine.ServiceInfo
	running := func(id string, at time.Time) *machine.ServiceInfo {
		return svc(id, []event{{"Starting", "Starting service", at}, {"Running", "Service started as goroutine", at}}, &machine.ServiceHealth{Healthy: true, LastChange: timestamppb.New(at)})
	}
	for _, id := range []string{"apid", "syslogd", "udevd"} {
		services = append(services, running(id, booted))
	}
	if maintenance || phase != PhaseRunning {
		return sortServices(services)
	}
	criAt := booted.Add(s.scaled(s.opts.Profile.BootstrapReady))
	if criUp {
		services = append(services, running("containerd", booted), running("cri", criAt))
	} else {
		services = append(services, running("containerd", booted),
			svc("cri", []event{{"Waiting", `Waiting for service "containerd" to be "up"`, booted}}, &machine.ServiceHealth{Unknown: true}))
	}
	if role == "controlplane" {
		services = append(services, running("trustd", booted))
		s.mu.Lock()
		c, m := s.etcdView(clusterID, n.ip)
		var failed error
		if c != nil && c.bootstrapNode == n.ip {
			failed = c.failed
		}
		noLeader := c != nil && c.quorumLost
		evicted := c != nil && c.evicted[n.ip]
		if noLeader && m != nil && m.dataLost {
			// A node that lost its data waits to join a cluster that
			// can admit no one.
			m = nil
		}
		s.mu.Unlock()
		evs := []event{{"Waiting", `Waiting for service "cri" to be "up"`, booted}}
		switch {
		case !criUp:
			services = append(services, svc("etcd", evs, &machine.ServiceHealth{Unknown: true}))
		case left:
			// LeaveCluster stops the service (system.Services(nil).Stop):
			// state Finished; the event's message is unverified.
			evs = append(evs, event{"Preparing", "Running pre state", criAt}, event{"Finished", "Service finished successfully", now})
			services = append(services, svc("etcd", evs, &machine.ServiceHealth{Unknown: true}))
		case evicted:
			// The removed member's etcd exits with etcd's ErrMemberRemoved;
			// how Talos' service reports it is unverified.
			evs = append(evs, event{"Preparing", "Running pre state", criAt}, event{"Failed", "Failed running service: " + etcdMemberRemoved, now})
			services = append(services, svc("etcd", evs, &machine.ServiceHealth{Unknown: true}))
		case m == nil && !now.Before(joinDeadline):
			evs = append(evs, event{"Preparing", "Running pre state", criAt},
				event{"Failed", "Failed to run pre stage: failed to build initial etcd cluster: context deadline exceeded", joinDeadline})
			services = append(services, svc("etcd", evs, &machine.ServiceHealth{Unknown: true}))
		case !m.started(now):
			evs = append(evs, event{"Preparing", "Running pre state", criAt})
			services = append(services, svc("etcd", evs, &machine.ServiceHealth{Unknown: true}))
		case m.readyAt.After(now):
			evs = append(evs, event{"Preparing", "Running pre state", criAt}, event{"Running", "Started task etcd (PID 2001) for container etcd", m.startedAt})
			services = append(services, svc("etcd", evs, &machine.ServiceHealth{Healthy: false, LastMessage: "etcd is starting", LastChange: timestamppb.New(m.startedAt)}))
		case noLeader:
			// The survivor's etcd process runs; what its health check
			// reports without a leader is unverified (talossim: unhealthy).
			evs = append(evs, event{"Preparing", "Running pre state", criAt}, event{"Running", "Started task etcd (PID 2001) for container etcd", m.startedAt})
			services = append(services, svc("etcd", evs, &machine.ServiceHealth{Healthy: false, LastMessage: "etcdserver: no leader", LastChange: timestamppb.New(now)}))
		case failed != nil:
			evs = append(evs, event{"Running", "Started task etcd (PID 2001) for container etcd", m.startedAt})
			services = append(services, svc("etcd", evs, &machine.ServiceHealth{Healthy: false, LastMessage: "control plane failed to start: " + failed.Error(), LastChange: timestamppb.New(m.readyAt)}))
		default:
			evs = append(evs, event{"Preparing", "Running pre state", criAt}, event{"Running", "Health check successful", m.readyAt})
			services = append(services, svc("etcd", evs, &machine.ServiceHealth{Healthy: true, LastChange: timestamppb.New(m.readyAt)}))
		}
	}
	kubeletReady := booted.Add(s.scaled(s.opts.Profile.KubeletReady))
	kevs := []event{{"Preparing", "Running pre state", booted}, {"Running", "Started task kubelet (PID 2101) for container kubelet", booted}}
	if now.Before(kubeletReady) {
		services = append(services, svc("kubelet", kevs, &machine.ServiceHealth{
			Healthy: false, LastChange: timestamppb.New(booted),
			LastMessage: `Get "http://127.0.0.1:10248/healthz": dial tcp 127.0.0.1:10248: connect: connection refused`,
		}))
	} else {
		kevs = append(kevs, event{"Running", "Health check successful", kubeletReady})
		services = append(services, svc("kubelet", kevs, &machine.ServiceHealth{Healthy: true, LastChange: timestamppb.New(kubeletReady)}))
	}
	if n.sequenceStopped {
		stopSequenceServices(services, n.sequenceStoppedAt)
	}
	return sortServices(services)
}

// stopSequenceServices marks what a failed upgrade sequence stopped:
// StopServicesEphemeral stops cri with what depends on it (etcd, kubelet)
// and trustd (v1alpha1_sequencer_tasks.go at v1.13.3); a service whose run
// ended reads Finished, "Service finished successfully" (system.go
// StartAll's runner goroutine), and is not health-checked any more (the
// health it then reports is unverified: talossim reports unknown).
func stopSequenceServices(services []*machine.ServiceInfo, at time.Time) {
	for _, si := range services {
		switch si.GetId() {
		case "cri", "etcd", "kubelet", "trustd":
			si.Events.Events = append(si.Events.Events, &machine.ServiceEvent{Msg: "Service finished successfully", State: "Finished", Ts: timestamppb.New(at)})
			si.State = "Finished"
			si.Health = &machine.ServiceHealth{Unknown: true}
		}
	}
}

func sortServices(services []*machine.ServiceInfo) []*machine.ServiceInfo {
	slices.SortFunc(services, func(x, y *machine.ServiceInfo) int { return strings.Compare(x.Id, y.Id) })
	return services
}

// Reboot implements machine.MachineServiceServer: the reboot sequence runs
// in the background of the answer.
func (a *apid) Reboot(context.Context, *machine.RebootRequest) (*machine.RebootResponse, error) {
	n := a.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.phase != PhaseRunning {
		return nil, status.Error(codes.FailedPrecondition, "talossim: a reboot outside the installed system is not simulated")
	}
	n.counters.RebootCalls++
	if !n.rebootPending {
		n.scheduleRebootLocked()
	}
	return &machine.RebootResponse{Messages: []*machine.Reboot{{}}}, nil
}

type event struct {
	state, msg string
	at         time.Time
}

func svc(id string, evs []event, h *machine.ServiceHealth) *machine.ServiceInfo {
	out := &machine.ServiceInfo{Id: id, Health: h, Events: &machine.ServiceEvents{}}
	for _, e := range evs {
		out.Events.Events = append(out.Events.Events, &machine.ServiceEvent{Msg: e.msg, State: e.state, Ts: timestamppb.New(e.at)})
		out.State = e.state
	}
	return out
}

// Kubeconfig implements machine.MachineServiceServer: a gzip'd tar with one
// entry "kubeconfig", as apid streams it.
func (a *apid) Kubeconfig(_ *emptypb.Empty, stream grpc.ServerStreamingServer[common.Data]) error {
	n := a.n
	n.mu.Lock()
	n.counters.KubeconfigCalls++
	role := n.roleLocked()
	n.mu.Unlock()
	if role != "controlplane" {
		return status.Error(codes.Unimplemented, "kubeconfig is only available on control plane nodes")
	}
	// Real Talos mints the kubeconfig from the machine config
	// (kubeconfig.GenerateAdmin), so it always answers, whether or not the
	// API server runs yet. The simulated control plane may point it
	// elsewhere (a test's stand-in API server).
	n.mu.Lock()
	cfg := n.parsed
	n.mu.Unlock()
	data, err := n.sim.opts.Cluster.Kubeconfig(stream.Context())
	if err == nil {
		// Its certificate as this node's config mints it (lifetime
		// included: cluster.adminKubeconfig.certLifetime).
		data, err = withConfiguredAdminCert(data, cfg)
	} else {
		data, err = generateAdminKubeconfig(cfg)
	}
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	if err := tw.WriteHeader(&tar.Header{Name: "kubeconfig", Mode: 0o600, Size: int64(len(data)), ModTime: time.Now(), Typeflag: tar.TypeReg}); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if _, err := tw.Write(data); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if err := tw.Close(); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if err := gz.Close(); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return stream.Send(&common.Data{Bytes: buf.Bytes()})
}
