package talossim

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"fmt"
	"runtime"
	"slices"
	"time"

	cosiv1alpha1 "github.com/cosi-project/runtime/api/v1alpha1"
	"github.com/cosi-project/runtime/pkg/state"
	cosiserver "github.com/cosi-project/runtime/pkg/state/protobuf/server"
	"github.com/siderolabs/talos/pkg/machinery/api/common"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configdiff"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
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

// adminOnly lists the methods that need os:admin in configured mode; the
// rest are readable with os:reader.
var adminOnly = map[string]bool{
	machine.MachineService_ApplyConfiguration_FullMethodName: true,
	machine.MachineService_Bootstrap_FullMethodName:          true,
	machine.MachineService_Kubeconfig_FullMethodName:         true,
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
	if a.mode == serveMaintenance {
		return nil
	}
	roles := peerRoles(ctx)
	need := role.MakeSet(role.Admin, role.Operator, role.Reader)
	if adminOnly[method] {
		need = role.MakeSet(role.Admin)
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

// Version implements machine.MachineServiceServer.
func (a *apid) Version(context.Context, *emptypb.Empty) (*machine.VersionResponse, error) {
	return &machine.VersionResponse{Messages: []*machine.Version{{
		Version: &machine.VersionInfo{
			Tag: a.n.sim.opts.TalosVersion, Sha: "talossim", Built: "talossim",
			GoVersion: runtime.Version(), Os: "linux", Arch: "amd64",
		},
		Platform: &machine.PlatformInfo{Name: "metal", Mode: "metal"},
	}}}, nil
}

func parseAndValidate(data []byte) (config.Provider, []string, error) {
	cfg, err := configloader.NewFromBytes(data)
	if err != nil {
		return nil, nil, status.Errorf(codes.InvalidArgument, "failed to parse config: %v", err)
	}
	warnings, err := cfg.Validate(metalMode{})
	if err != nil {
		return nil, nil, status.Errorf(codes.InvalidArgument, "configuration validation failed: %v", err)
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

// ApplyConfiguration implements machine.MachineServiceServer.
func (a *apid) ApplyConfiguration(_ context.Context, in *machine.ApplyConfigurationRequest) (*machine.ApplyConfigurationResponse, error) {
	if a.mode == serveMaintenance {
		return a.applyMaintenance(in)
	}
	return a.applyConfigured(in)
}

func (a *apid) applyMaintenance(in *machine.ApplyConfigurationRequest) (*machine.ApplyConfigurationResponse, error) {
	switch in.GetMode() {
	case machine.ApplyConfigurationRequest_TRY, machine.ApplyConfigurationRequest_REBOOT, machine.ApplyConfigurationRequest_AUTO:
	default:
		return nil, status.Errorf(codes.Unimplemented, "apply configuration --mode='%s' is not supported in maintenance mode", in.GetMode())
	}
	a.applyDelay()
	cfg, warnings, err := parseAndValidate(in.GetData())
	if err != nil {
		return nil, err
	}
	reply := &machine.ApplyConfigurationResponse{Messages: []*machine.ApplyConfiguration{{Warnings: warnings}}}
	n := a.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if in.GetDryRun() {
		n.counters.DryRuns++
		reply.Messages[0].ModeDetails = "Dry run summary:\nNode is running in maintenance mode and does not have a config yet."
		return reply, nil
	}
	if n.phase != PhaseMaintenance {
		return nil, status.Error(codes.FailedPrecondition, "another configuration is being applied")
	}
	n.counters.Applies++
	n.counters.MaintenanceApplies++
	n.installLocked(slices.Clone(in.GetData()), cfg.Machine().Install().Disk())
	return reply, nil
}

// needsReboot approximates Talos' CanApplyImmediate: install settings, the
// machine type and the machine CA cannot change on a running node.
func needsReboot(old, cfg config.Provider) bool {
	if old == nil {
		return true
	}
	om, nm := old.Machine(), cfg.Machine()
	if om.Type() != nm.Type() {
		return true
	}
	if om.Install().Disk() != nm.Install().Disk() || om.Install().Image() != nm.Install().Image() {
		return true
	}
	oca, nca := om.Security().IssuingCA(), nm.Security().IssuingCA()
	return oca == nil || nca == nil || !bytes.Equal(oca.Crt, nca.Crt)
}

func (a *apid) applyConfigured(in *machine.ApplyConfigurationRequest) (*machine.ApplyConfigurationResponse, error) {
	a.applyDelay()
	cfg, warnings, err := parseAndValidate(in.GetData())
	if err != nil {
		return nil, err
	}
	if cfg.RawV1Alpha1() == nil {
		return nil, status.Error(codes.InvalidArgument, "the applied machine configuration doesn't contain v1alpha1 config, did you mean to patch the machine config instead?")
	}
	n := a.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.phase != PhaseRunning {
		return nil, status.Error(codes.FailedPrecondition, "node is rebooting")
	}
	reboot := needsReboot(n.parsed, cfg)
	mode := in.GetMode()
	details := "Applied configuration with a reboot"
	switch mode {
	case machine.ApplyConfigurationRequest_TRY, machine.ApplyConfigurationRequest_NO_REBOOT:
		if reboot {
			return nil, status.Error(codes.InvalidArgument, "this configuration change can't be applied without a reboot")
		}
		details = "Applied configuration without a reboot"
	case machine.ApplyConfigurationRequest_STAGED:
		details = "Staged configuration to be applied after the next reboot"
	case machine.ApplyConfigurationRequest_AUTO:
		if reboot {
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
	n.counters.Applies++
	data := slices.Clone(in.GetData())
	switch mode {
	case machine.ApplyConfigurationRequest_TRY, machine.ApplyConfigurationRequest_NO_REBOOT:
		n.sim.persist(n.ip, data)
		n.config, n.parsed = data, cfg
	case machine.ApplyConfigurationRequest_STAGED:
		n.sim.persist(n.ip, data)
	case machine.ApplyConfigurationRequest_REBOOT:
		n.sim.persist(n.ip, data)
		n.rebootLocked()
	}
	return &machine.ApplyConfigurationResponse{Messages: []*machine.ApplyConfiguration{{
		Mode: mode, Warnings: warnings, ModeDetails: details,
	}}}, nil
}

// Bootstrap implements machine.MachineServiceServer.
func (a *apid) Bootstrap(context.Context, *machine.BootstrapRequest) (*machine.BootstrapResponse, error) {
	n := a.n
	n.mu.Lock()
	n.counters.BootstrapCalls++
	if a.mode == serveMaintenance {
		n.mu.Unlock()
		return nil, status.Error(codes.PermissionDenied, "bootstrap is not available in maintenance mode")
	}
	if time.Since(n.bootedAt) < n.sim.scaled(n.sim.opts.Profile.BootstrapReady) || n.phase != PhaseRunning {
		n.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "bootstrap is not available yet")
	}
	if n.roleLocked() != "controlplane" {
		n.mu.Unlock()
		return nil, status.Error(codes.FailedPrecondition, "bootstrap can only be performed on a control plane node")
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
	n.mu.Unlock()

	// Other control planes already up join the new cluster.
	for _, other := range s.Nodes() {
		if other == n {
			continue
		}
		other.mu.Lock()
		if other.phase == PhaseRunning && other.roleLocked() == "controlplane" && other.clusterIDLocked() == clusterID {
			host := other.hostnameLocked()
			s.mu.Lock()
			s.joinEtcd(clusterID, other.ip, host, time.Now())
			s.mu.Unlock()
		}
		other.mu.Unlock()
	}

	go func() {
		if err := s.opts.Cluster.Bootstrap(context.Background(), cfg); err != nil {
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

// EtcdMemberList implements machine.MachineServiceServer.
func (a *apid) EtcdMemberList(context.Context, *machine.EtcdMemberListRequest) (*machine.EtcdMemberListResponse, error) {
	if a.mode == serveMaintenance {
		return nil, status.Error(codes.Unimplemented, "API is not implemented in maintenance mode")
	}
	n := a.n
	n.mu.Lock()
	role, clusterID := n.roleLocked(), n.clusterIDLocked()
	n.mu.Unlock()
	if role != "controlplane" {
		return nil, status.Error(codes.FailedPrecondition, "etcd is not running on worker nodes")
	}
	s := n.sim
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	c, self := s.etcdView(clusterID, n.ip)
	if self == nil || self.readyAt.After(now) {
		return nil, status.Error(codes.Unavailable, "etcd is not running on this node yet")
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

// ServiceList implements machine.MachineServiceServer.
func (a *apid) ServiceList(context.Context, *emptypb.Empty) (*machine.ServiceListResponse, error) {
	if a.mode == serveMaintenance {
		return nil, status.Error(codes.Unimplemented, "API is not implemented in maintenance mode")
	}
	n := a.n
	n.mu.Lock()
	role, clusterID, booted := n.roleLocked(), n.clusterIDLocked(), n.bootedAt
	n.mu.Unlock()
	s := n.sim
	now := time.Now()

	var services []*machine.ServiceInfo
	running := func(id string) *machine.ServiceInfo {
		return svc(id, []event{{"Starting", "Starting service", booted}, {"Running", "Service started as goroutine", booted}}, &machine.ServiceHealth{Healthy: true, LastChange: timestamppb.New(booted)})
	}
	for _, id := range []string{"apid", "containerd", "cri", "machined", "syslogd", "udevd"} {
		services = append(services, running(id))
	}
	if role == "controlplane" {
		services = append(services, running("trustd"))
		s.mu.Lock()
		c, m := s.etcdView(clusterID, n.ip)
		var failed error
		if c != nil && c.bootstrapNode == n.ip {
			failed = c.failed
		}
		s.mu.Unlock()
		evs := []event{{"Preparing", "Running pre state", booted}}
		switch {
		case !m.started(now):
			evs = append(evs, event{"Preparing", "Waiting for etcd to be bootstrapped or to join an existing cluster", booted})
			services = append(services, svc("etcd", evs, &machine.ServiceHealth{Unknown: true}))
		case m.readyAt.After(now):
			evs = append(evs, event{"Running", "Started task etcd (PID 2001) for container etcd", booted})
			services = append(services, svc("etcd", evs, &machine.ServiceHealth{Healthy: false, LastMessage: "etcd is starting", LastChange: timestamppb.New(booted)}))
		case failed != nil:
			evs = append(evs, event{"Running", "Started task etcd (PID 2001) for container etcd", booted})
			services = append(services, svc("etcd", evs, &machine.ServiceHealth{Healthy: false, LastMessage: "control plane failed to start: " + failed.Error(), LastChange: timestamppb.New(m.readyAt)}))
		default:
			evs = append(evs, event{"Running", "Health check successful", m.readyAt})
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
	slices.SortFunc(services, func(x, y *machine.ServiceInfo) int {
		switch {
		case x.Id < y.Id:
			return -1
		case x.Id > y.Id:
			return 1
		}
		return 0
	})
	return &machine.ServiceListResponse{Messages: []*machine.ServiceList{{Services: services}}}, nil
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
	if a.mode == serveMaintenance {
		return status.Error(codes.PermissionDenied, "kubeconfig is not available in maintenance mode")
	}
	if role != "controlplane" {
		return status.Error(codes.Unimplemented, "kubeconfig is only available on control plane nodes")
	}
	data, err := n.sim.opts.Cluster.Kubeconfig(stream.Context())
	if err != nil {
		return status.Errorf(codes.Unavailable, "kubeconfig is not available yet: %v", err)
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
