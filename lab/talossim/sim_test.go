package talossim_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	stdx509 "crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/rs/zerolog"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/client"
	clientconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/homelab/bootstrap/lab/talossim"
	"github.com/homelab/bootstrap/talos"
)

// fixture is a simulator with one control plane and one worker in
// maintenance mode and the configs rendered for them.
type fixture struct {
	t       *testing.T
	sim     *talossim.Sim
	cluster *talossim.MemoryCluster
	gen     *talos.Result
	cp, wk  string // IPs
	cfg     *clientconfig.Config
}

func newFixture(t *testing.T, bundle string) *fixture {
	t.Helper()
	return newFixtureWith(t, bundle, talossim.Profile{})
}

// newFixtureWith is newFixture on a latency profile (zero: the default).
func newFixtureWith(t *testing.T, bundle string, profile talossim.Profile) *fixture {
	t.Helper()
	return newFixtureOn(t, bundle, profile, "")
}

// newFixtureOn is newFixtureWith whose VMs boot Talos talosVersion and
// whose configs are generated for it (empty: the defaults).
func newFixtureOn(t *testing.T, bundle string, profile talossim.Profile, talosVersion string) *fixture {
	t.Helper()
	prefix, err := talossim.RandomLoopbackPrefix(50000)
	if err != nil {
		t.Fatal(err)
	}
	ip := func(last byte) string { return talossim.HostAddr(prefix, last) }
	dir := filepath.Join(t.TempDir(), "lab")
	os.MkdirAll(dir, 0o700)
	data, err := os.ReadFile(filepath.Join("..", "..", "talos", "testdata", bundle))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, talos.SecretsFile), data, 0o600)
	f := &fixture{t: t, cp: ip(11), wk: ip(21)}
	f.gen, err = talos.Generate(talos.GenerateOptions{
		Dir: dir, ClusterName: "lab", TalosVersion: talosVersion,
		Nodes: []talos.Node{
			{Name: "cp-1", Role: talos.RoleControlPlane, IP: f.cp, DiskBus: "scsi"},
			{Name: "wk-1", Role: talos.RoleWorker, IP: f.wk, DiskBus: "virtio"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if f.cfg, err = clientconfig.FromBytes(f.gen.Talosconfig); err != nil {
		t.Fatal(err)
	}
	f.cluster = talossim.NewMemoryCluster([]byte("apiVersion: v1\nkind: Config\n"))
	f.sim = talossim.New(talossim.Options{Cluster: f.cluster, Profile: profile, TalosVersion: talosVersion, Log: zerolog.New(zerolog.NewTestWriter(t))})
	t.Cleanup(func() { f.sim.Close() })
	for _, n := range []talossim.NodeSpec{
		{IP: f.cp, Hostname: "vm-701", Disks: []talossim.Disk{{Bus: "scsi", Size: 32 << 30}, {Bus: "virtio", Size: 100 << 30}}},
		{IP: f.wk, Hostname: "vm-702", Disks: []talossim.Disk{{Bus: "virtio", Size: 32 << 30}}},
	} {
		node, err := f.sim.BootNode(context.Background(), n)
		if err != nil {
			t.Fatal(err)
		}
		f.waitPhase(node, talossim.PhaseMaintenance)
	}
	return f
}

func (f *fixture) node(ip string) *talossim.Node {
	n, ok := f.sim.Node(ip)
	if !ok {
		f.t.Fatalf("no node %s", ip)
	}
	return n
}

func (f *fixture) waitPhase(n *talossim.Node, p talossim.Phase) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.WaitPhase(ctx, p); err != nil {
		f.t.Fatal(err)
	}
}

// waitRebooted waits until n rebooted since it counted before reboots and
// runs again.
func (f *fixture) waitRebooted(n *talossim.Node, before int) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for n.Counters().Reboots <= before || n.Phase() != talossim.PhaseRunning {
		if time.Now().After(deadline) {
			f.t.Fatalf("node %s did not reboot and run again (phase %s, %+v)", n.Hostname(), n.Phase(), n.Counters())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// bootTime reads the node's boot time as SystemStat answers it.
func bootTime(t *testing.T, c *client.Client) uint64 {
	t.Helper()
	resp, err := c.MachineClient.SystemStat(callCtx(t), &emptypb.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetMessages()[0].GetBootTime()
}

func (f *fixture) config(name string) []byte {
	n, ok := f.gen.Node(name)
	if !ok {
		f.t.Fatalf("no config %s", name)
	}
	return n.Config
}

// insecure is `talosctl --insecure -e ip -n ip`.
func insecure(t *testing.T, ip string) *client.Client {
	t.Helper()
	c, err := client.New(context.Background(), client.WithEndpoints(ip),
		client.WithTLSConfig(&tls.Config{InsecureSkipVerify: true}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// secure is `talosctl --talosconfig ... -e ip -n ip`.
func secure(t *testing.T, cfg *clientconfig.Config, ip string) *client.Client {
	t.Helper()
	c, err := client.New(context.Background(), client.WithConfig(cfg), client.WithEndpoints(ip))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, err error, code codes.Code, contains string) {
	t.Helper()
	if client.StatusCode(err) != code || !strings.Contains(fmt.Sprint(err), contains) {
		t.Errorf("err = %v, want %s containing %q", err, code, contains)
	}
}

func TestMaintenanceMode(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "secrets.yaml")
	c := insecure(t, f.cp)
	ctx := callCtx(t)

	v, err := c.Version(ctx)
	if err != nil || v.GetMessages()[0].GetVersion().GetTag() != "v1.13.3" {
		t.Fatalf("version: %v %v", v, err)
	}
	// The self-signed certificate is not our CA's.
	_, err = secure(t, f.cfg, f.cp).Version(ctx)
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("talosconfig client against maintenance mode: %v", err)
	}
	// Without a client certificate a maintenance client holds os:reader:
	// admin calls are refused, reads work (ServiceList), etcd and
	// kubeconfig need a machine type first.
	if p := v.GetMessages()[0].GetPlatform(); p.GetName() != "nocloud" || p.GetMode() != "cloud" {
		t.Errorf("platform %v, want nocloud in cloud mode", p)
	}
	_, err = c.MachineClient.Bootstrap(ctx, &machine.BootstrapRequest{})
	wantCode(t, err, codes.PermissionDenied, "os:admin")
	_, err = c.Kubeconfig(ctx)
	wantCode(t, err, codes.PermissionDenied, "os:admin")
	if svcs, err := c.ServiceList(ctx); err != nil || len(svcs.GetMessages()[0].GetServices()) == 0 {
		t.Errorf("service list in maintenance mode: %v %v", svcs, err)
	}
	_, err = c.EtcdMemberList(ctx, &machine.EtcdMemberListRequest{})
	wantCode(t, err, codes.Unimplemented, "machine type is not set")
	_, err = c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: []byte("machine: [garbage"), Mode: machine.ApplyConfigurationRequest_AUTO})
	wantCode(t, err, codes.InvalidArgument, "yaml")
	// Valid YAML that fails metal validation (no install disk).
	noDisk := strings.Replace(string(f.config("cp-1")), "        disk: /dev/sda\n", "", 1)
	_, err = c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: []byte(noDisk), Mode: machine.ApplyConfigurationRequest_AUTO})
	wantCode(t, err, codes.InvalidArgument, "install disk")
	// A Kubernetes version this Talos does not support fails the runtime
	// validation.
	tooNew := strings.ReplaceAll(string(f.config("cp-1")), ":v1.36.1", ":v1.99.0")
	_, err = c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: []byte(tooNew), Mode: machine.ApplyConfigurationRequest_AUTO})
	wantCode(t, err, codes.InvalidArgument, "kubelet image is not valid")
	// Every mode is accepted in maintenance mode; a dry run shows the
	// whole config as the diff.
	dry, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: f.config("cp-1"), Mode: machine.ApplyConfigurationRequest_REBOOT, DryRun: true})
	if err != nil || dry.GetMessages()[0].GetMode() != machine.ApplyConfigurationRequest_NO_REBOOT ||
		!strings.Contains(dry.GetMessages()[0].GetModeDetails(), "Config diff:") || !strings.Contains(dry.GetMessages()[0].GetModeDetails(), "+    type: controlplane") {
		t.Errorf("dry run: %v %v", dry, err)
	}
	if got := f.node(f.cp).Counters(); got.Applies != 0 || got.DryRuns != 1 || f.node(f.cp).Phase() != talossim.PhaseMaintenance {
		t.Errorf("rejected applies changed the node: %+v, %s", got, f.node(f.cp).Phase())
	}

	// Disks over COSI, named as Linux names them on a Proxmox VM.
	disks, err := safe.StateListAll[*block.Disk](ctx, c.COSI)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for d := range disks.All() {
		s := d.TypedSpec()
		got = append(got, fmt.Sprintf("%s:%d:%v", s.DevPath, s.Size>>30, s.CDROM))
	}
	if strings.Join(got, " ") != "/dev/sda:32:false /dev/sr0:0:true /dev/vda:100:false" {
		t.Errorf("disks %v", got)
	}
}

func TestInstallRebootConfiguredMTLS(t *testing.T) {
	t.Parallel()
	// An install of 2 s: the instant profile's 20 ms ended before a
	// loaded machine finished the mutual TLS handshake, so the test
	// never saw the installing stage (seen under make test).
	p := talossim.ProfileInstant
	p.Install = 2 * time.Second
	f := newFixtureWith(t, "secrets.yaml", p)
	ctx := callCtx(t)
	node := f.node(f.cp)
	if _, err := insecure(t, f.cp).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: f.config("cp-1"), Mode: machine.ApplyConfigurationRequest_AUTO}); err != nil {
		t.Fatal(err)
	}
	// apid restarts with mutual TLS before the installer runs: the node
	// answers in configured mode with the cluster's CA while it installs,
	// and its MachineStatus says so.
	f.waitPhase(node, talossim.PhaseInstalling)
	var st *runtime.MachineStatus
	deadline := time.Now().Add(5 * time.Second)
	for {
		var err error
		st, err = safe.StateGetByID[*runtime.MachineStatus](ctx, secure(t, f.cfg, f.cp).COSI, runtime.MachineStatusID)
		if err == nil && st.TypedSpec().Stage == runtime.MachineStageInstalling {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no configured answer during install: %v %v", st, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	f.waitPhase(node, talossim.PhaseRunning)

	// Configured mode: mutual TLS with the CA from the applied config.
	if _, err := secure(t, f.cfg, f.cp).Version(ctx); err != nil {
		t.Fatalf("talosconfig client: %v", err)
	}
	// The server may close before its alert is read (broken pipe, more
	// often on a loaded machine); the alert must show up within a few tries.
	var err error
	for range 20 {
		if _, err = insecure(t, f.cp).Version(ctx); err != nil && strings.Contains(err.Error(), "certificate required") {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err == nil || !strings.Contains(err.Error(), "certificate required") {
		t.Errorf("insecure client against configured mode: %v", err)
	}
	// Another cluster's talosconfig: our server certificate is not theirs
	// to trust, and their client certificate is not ours.
	other := newFixture(t, "other-secrets.yaml")
	_, err = secure(t, other.cfg, f.cp).Version(ctx)
	if err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("other cluster's client: %v", err)
	}
	// The serving certificate chains to the OS CA of the config and names the IP.
	conn, err := tls.Dial("tcp", node.Addr(), &tls.Config{InsecureSkipVerify: true}) //nolint:gosec
	if err == nil {
		leaf := conn.ConnectionState().PeerCertificates[0]
		conn.Close()
		pool := stdx509.NewCertPool()
		pool.AppendCertsFromPEM(f.gen.Bundle.Certs.OS.Crt)
		if _, err := leaf.Verify(stdx509.VerifyOptions{Roots: pool, DNSName: f.cp, KeyUsages: []stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("serving certificate: %v", err)
		}
		if conn.ConnectionState().Version != tls.VersionTLS13 {
			t.Error("not TLS 1.3")
		}
	} else if !strings.Contains(err.Error(), "certificate required") {
		t.Errorf("tls dial: %v", err)
	}
	if c := node.Counters(); c.Applies != 1 || c.MaintenanceApplies != 1 || c.Installs != 1 || c.Reboots != 1 {
		t.Errorf("counters %+v", c)
	}
	if string(node.Config()) != string(f.config("cp-1")) || string(f.sim.Installed(f.cp)) != string(f.config("cp-1")) {
		t.Error("node does not run (or did not install) the applied config")
	}
}

func TestBootstrapOnceEtcdServicesKubeconfig(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "secrets.yaml")
	ctx := callCtx(t)
	for _, n := range []struct{ ip, name string }{{f.cp, "cp-1"}, {f.wk, "wk-1"}} {
		if _, err := insecure(t, n.ip).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: f.config(n.name), Mode: machine.ApplyConfigurationRequest_AUTO}); err != nil {
			t.Fatal(err)
		}
	}
	f.waitPhase(f.node(f.cp), talossim.PhaseRunning)
	cp := secure(t, f.cfg, f.cp)

	// Before bootstrap: etcd waits, members unavailable.
	svc := services(t, cp)
	if svc["etcd"] != "Preparing/unknown" {
		t.Errorf("etcd before bootstrap: %s", svc["etcd"])
	}
	_, err := cp.EtcdMemberList(ctx, &machine.EtcdMemberListRequest{})
	wantCode(t, err, codes.Unavailable, "etcd")

	if err := cp.Bootstrap(ctx, &machine.BootstrapRequest{}); err != nil {
		t.Fatal(err)
	}
	err = cp.Bootstrap(ctx, &machine.BootstrapRequest{})
	wantCode(t, err, codes.AlreadyExists, "etcd data directory is not empty")

	// Health transitions to healthy; one member.
	deadline := time.Now().Add(5 * time.Second)
	for services(t, cp)["etcd"] != "Running/healthy" || services(t, cp)["kubelet"] != "Running/healthy" {
		if time.Now().After(deadline) {
			t.Fatalf("services never healthy: %v", services(t, cp))
		}
		time.Sleep(10 * time.Millisecond)
	}
	members, err := cp.EtcdMemberList(ctx, &machine.EtcdMemberListRequest{})
	if err != nil || len(members.GetMessages()[0].GetMembers()) != 1 || members.GetMessages()[0].GetMembers()[0].GetHostname() != "cp-1" {
		t.Fatalf("members %v %v", members, err)
	}
	if f.cluster.Bootstraps() != 1 {
		t.Errorf("control plane bootstrapped %d times", f.cluster.Bootstraps())
	}

	// The worker gets its certificate from the control plane and refuses
	// Bootstrap and Kubeconfig.
	f.waitPhase(f.node(f.wk), talossim.PhaseRunning)
	wk := secure(t, f.cfg, f.wk)
	deadline = time.Now().Add(5 * time.Second)
	for {
		_, err := wk.Version(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker API never came up: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	err = wk.Bootstrap(ctx, &machine.BootstrapRequest{})
	wantCode(t, err, codes.Unimplemented, "bootstrap is only available on control plane nodes")
	_, err = wk.Kubeconfig(ctx)
	wantCode(t, err, codes.Unimplemented, "control plane")

	// Kubeconfig: gzip'd tar with one 0600 entry "kubeconfig".
	stream, err := cp.MachineClient.Kubeconfig(ctx, &emptypb.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	gz, err := gzip.NewReader(bytes.NewReader(msg.GetBytes()))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	hdr, err := tr.Next()
	if err != nil || hdr.Name != "kubeconfig" || hdr.Mode != 0o600 {
		t.Fatalf("tar entry %+v %v", hdr, err)
	}
	body, _ := io.ReadAll(tr)
	if string(body) != "apiVersion: v1\nkind: Config\n" {
		t.Errorf("kubeconfig %q", body)
	}
	if _, err := tr.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("more than one entry: %v", err)
	}
	if names := f.cluster.Nodes(); len(names) != 2 || names[0].Hostname != "cp-1" || names[0].Role != "controlplane" {
		t.Errorf("registered nodes %+v", names)
	}
}

func services(t *testing.T, c *client.Client) map[string]string {
	t.Helper()
	resp, err := c.ServiceList(callCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range resp.GetMessages()[0].GetServices() {
		h := "unhealthy"
		switch {
		case s.GetHealth().GetUnknown():
			h = "unknown"
		case s.GetHealth().GetHealthy():
			h = "healthy"
		}
		if len(s.GetEvents().GetEvents()) == 0 {
			t.Errorf("%s has no events", s.GetId())
		}
		out[s.GetId()] = s.GetState() + "/" + h
	}
	return out
}

func TestFaultsAndRestart(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "secrets.yaml")
	ctx := callCtx(t)
	node := f.node(f.cp)

	node.SetFaults(talossim.Faults{RefuseConnections: true})
	_, err := insecure(t, f.cp).Version(ctx)
	if !strings.Contains(fmt.Sprint(err), "connection refused") {
		t.Errorf("refused: %v", err)
	}
	node.SetFaults(talossim.Faults{CrashDuringInstall: 1})
	if _, err := insecure(t, f.cp).Version(ctx); err != nil {
		t.Fatalf("after clearing the refusal: %v", err)
	}
	if _, err := insecure(t, f.cp).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: f.config("cp-1"), Mode: machine.ApplyConfigurationRequest_AUTO}); err != nil {
		t.Fatal(err)
	}
	f.waitPhase(node, talossim.PhaseRebooting)
	f.waitPhase(node, talossim.PhaseMaintenance)
	if c := node.Counters(); c.InstallCrashes != 1 || c.Installs != 0 || f.sim.Installed(f.cp) != nil {
		t.Errorf("after the crash: %+v", c)
	}

	// A second apply installs; stopping and booting the VM again resumes
	// from its disk in configured mode.
	if _, err := insecure(t, f.cp).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: f.config("cp-1"), Mode: machine.ApplyConfigurationRequest_AUTO}); err != nil {
		t.Fatal(err)
	}
	f.waitPhase(node, talossim.PhaseRunning)
	if err := f.sim.StopNode(f.cp); err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTimeout("tcp", node.Addr(), time.Second); err == nil {
		t.Error("stopped node still listens")
	}
	again, err := f.sim.BootNode(ctx, talossim.NodeSpec{IP: f.cp})
	if err != nil {
		t.Fatal(err)
	}
	f.waitPhase(again, talossim.PhaseRunning)
	if _, err := secure(t, f.cfg, f.cp).Version(ctx); err != nil {
		t.Errorf("restarted node: %v", err)
	}
	// A reinstalled VM (wiped disk) is back in maintenance mode.
	f.sim.StopNode(f.cp)
	wiped, err := f.sim.BootNode(ctx, talossim.NodeSpec{IP: f.cp, Wipe: true})
	if err != nil {
		t.Fatal(err)
	}
	f.waitPhase(wiped, talossim.PhaseMaintenance)
}

func TestConfiguredApplyModesAndDryRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "secrets.yaml")
	ctx := callCtx(t)
	node := f.node(f.cp)
	if _, err := insecure(t, f.cp).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: f.config("cp-1"), Mode: machine.ApplyConfigurationRequest_AUTO}); err != nil {
		t.Fatal(err)
	}
	f.waitPhase(node, talossim.PhaseRunning)
	c := secure(t, f.cfg, f.cp)
	same, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: f.config("cp-1"), Mode: machine.ApplyConfigurationRequest_AUTO, DryRun: true})
	if err != nil || !strings.HasSuffix(same.GetMessages()[0].GetModeDetails(), "Config diff:\n\nNo changes.") {
		t.Fatalf("dry run of the same config: %v %v", same, err)
	}
	changed := []byte(strings.Replace(string(f.config("cp-1")), "hostname: cp-1", "hostname: cp-one", 1))
	dry, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: changed, Mode: machine.ApplyConfigurationRequest_AUTO, DryRun: true})
	if err != nil || !strings.Contains(dry.GetMessages()[0].GetModeDetails(), "+hostname: cp-one") || dry.GetMessages()[0].GetMode() != machine.ApplyConfigurationRequest_NO_REBOOT {
		t.Fatalf("dry run diff: %v %v", dry, err)
	}
	if node.Counters().Applies != 1 {
		t.Error("dry run applied")
	}
	if _, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: changed, Mode: machine.ApplyConfigurationRequest_AUTO}); err != nil {
		t.Fatal(err)
	}
	if node.Hostname() != "cp-one" || node.Phase() != talossim.PhaseRunning {
		t.Errorf("no-reboot apply: hostname %s, phase %s", node.Hostname(), node.Phase())
	}
	// .machine.install applies at once (CanApplyImmediate): a new install
	// disk and image are taken without a reboot, and the node keeps the
	// Talos it runs.
	before := node.Version()
	image := []byte(strings.Replace(string(changed), "disk: /dev/sda", "disk: /dev/vda\n        image: ghcr.io/siderolabs/installer:v1.13.9", 1))
	resp, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: image, Mode: machine.ApplyConfigurationRequest_NO_REBOOT})
	if err != nil || resp.GetMessages()[0].GetMode() != machine.ApplyConfigurationRequest_NO_REBOOT || node.Phase() != talossim.PhaseRunning {
		t.Fatalf("install image change: %v %v, phase %s", resp, err, node.Phase())
	}
	if node.Version() != before {
		t.Errorf("version %s after an apply, want %s: only an upgrade installs a new Talos", node.Version(), before)
	}
	// Outside those parts a change needs a reboot: NO_REBOOT refuses, AUTO reboots.
	rbac := []byte(strings.Replace(string(image), "diskQuotaSupport: true", "diskQuotaSupport: false", 1))
	_, err = c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: rbac, Mode: machine.ApplyConfigurationRequest_NO_REBOOT})
	wantCode(t, err, codes.InvalidArgument, "can't be applied in immediate mode")
	resp, err = c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: rbac, Mode: machine.ApplyConfigurationRequest_AUTO})
	if err != nil || resp.GetMessages()[0].GetMode() != machine.ApplyConfigurationRequest_REBOOT {
		t.Fatalf("auto apply: %v %v", resp, err)
	}
	// Until the node goes down, further applies are refused.
	_, err = c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: rbac, Mode: machine.ApplyConfigurationRequest_AUTO, DryRun: true})
	wantCode(t, err, codes.FailedPrecondition, "node is rebooting")
	f.waitPhase(node, talossim.PhaseRebooting)
	f.waitPhase(node, talossim.PhaseRunning)
	if string(node.Config()) != string(rbac) {
		t.Error("node did not reboot into the new config")
	}
}

func TestProfileTimeScale(t *testing.T) {
	t.Parallel()
	p, err := talossim.ProfileByName("n100")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := talossim.ProfileByName("n200"); err == nil {
		t.Error("unknown profile accepted")
	}
	prefix, err := talossim.RandomLoopbackPrefix(50000)
	if err != nil {
		t.Fatal(err)
	}
	ip := prefix.Addr().Next().String()
	const scale = 0.002 // n100's 25 s boot → 50 ms, 70 s install → 140 ms, 45 s reboot → 90 ms
	sim := talossim.New(talossim.Options{Profile: p, TimeScale: scale, Log: zerolog.New(zerolog.NewTestWriter(t))})
	defer sim.Close()
	start := time.Now()
	node, err := sim.BootNode(context.Background(), talossim.NodeSpec{IP: ip})
	if err != nil {
		t.Fatal(err)
	}
	ctx := callCtx(t)
	if err := node.WaitPhase(ctx, talossim.PhaseMaintenance); err != nil {
		t.Fatal(err)
	}
	scaled := func(d time.Duration) time.Duration { return time.Duration(float64(d) * scale) }
	if el := time.Since(start); el < scaled(p.Boot) || el > scaled(p.Boot)+time.Second {
		t.Errorf("boot took %s, profile says %s", el, scaled(p.Boot))
	}

	f := newFixture(t, "secrets.yaml") // for a config only
	cfg := []byte(strings.ReplaceAll(string(f.config("cp-1")), f.cp, ip))
	start = time.Now()
	if _, err := insecure(t, ip).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: cfg, Mode: machine.ApplyConfigurationRequest_AUTO}); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < scaled(p.ApplyLatency) {
		t.Errorf("apply answered in %s, profile latency %s", el, scaled(p.ApplyLatency))
	}
	if err := node.WaitPhase(ctx, talossim.PhaseRunning); err != nil {
		t.Fatal(err)
	}
	if el, want := time.Since(start), scaled(p.ApplyLatency+p.Install+p.Reboot); el < want {
		t.Errorf("apply → configured took %s, profile says at least %s", el, want)
	}
}

// TestUpgradeRPC: the Upgrade RPC as machined answers it
// (v1alpha1_server.go at v1.13.3): refused to a client that is not an
// admin (in maintenance mode every client is a reader), an installer that cannot be pulled is the call's error with
// the node unchanged, a control plane checks etcd first, and an accepted
// upgrade reboots the node into the installer's version.
func TestUpgradeRPC(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "secrets.yaml")
	ctx := callCtx(t)
	// Upgrade needs os:admin (services/machined.go rules at v1.13.3); a
	// client without a certificate holds os:reader in maintenance mode.
	_, err := insecure(t, f.cp).MachineClient.Upgrade(ctx, &machine.UpgradeRequest{Image: "ghcr.io/siderolabs/installer:v1.13.4"})
	wantCode(t, err, codes.PermissionDenied, "needs one of [os:admin]")

	for _, n := range []struct{ ip, name string }{{f.cp, "cp-1"}, {f.wk, "wk-1"}} {
		if _, err := insecure(t, n.ip).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: f.config(n.name), Mode: machine.ApplyConfigurationRequest_AUTO}); err != nil {
			t.Fatal(err)
		}
	}
	f.waitPhase(f.node(f.cp), talossim.PhaseRunning)
	f.waitPhase(f.node(f.wk), talossim.PhaseRunning)
	cp := secure(t, f.cfg, f.cp)
	if err := cp.Bootstrap(ctx, &machine.BootstrapRequest{}); err != nil {
		t.Fatal(err)
	}
	before := f.node(f.wk).Version()

	f.node(f.wk).SetFaults(talossim.Faults{UpgradePullFails: 1})
	_, err = secure(t, f.cfg, f.wk).MachineClient.Upgrade(ctx, &machine.UpgradeRequest{Image: "ghcr.io/siderolabs/installer:v1.13.4"})
	if err == nil || !strings.Contains(err.Error(), `error validating installer image "ghcr.io/siderolabs/installer:v1.13.4"`) {
		t.Fatalf("pull failure: %v", err)
	}
	if f.node(f.wk).Version() != before || f.node(f.wk).Phase() != talossim.PhaseRunning {
		t.Fatalf("a failed pull changed the node: %s %s", f.node(f.wk).Version(), f.node(f.wk).Phase())
	}
	_, err = secure(t, f.cfg, f.wk).MachineClient.Upgrade(ctx, &machine.UpgradeRequest{Image: "not a reference"})
	if err == nil || !strings.Contains(err.Error(), "error validating installer image") {
		t.Fatalf("bad reference: %v", err)
	}

	// Before etcd runs on the control plane, its own member is not started:
	// ValidateForUpgrade refuses.
	deadline := time.Now().Add(5 * time.Second)
	for services(t, cp)["etcd"] != "Running/healthy" {
		if time.Now().After(deadline) {
			t.Fatalf("etcd never healthy: %v", services(t, cp))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := secure(t, f.cfg, f.wk).MachineClient.Upgrade(ctx, &machine.UpgradeRequest{Image: "ghcr.io/siderolabs/installer:v1.13.4"}); err != nil {
		t.Fatal(err)
	}
	f.waitPhase(f.node(f.wk), talossim.PhaseRebooting)
	f.waitPhase(f.node(f.wk), talossim.PhaseRunning)
	if v := f.node(f.wk).Version(); v != "v1.13.4" {
		t.Fatalf("after the upgrade the worker runs %s", v)
	}
	if c := f.node(f.wk).Counters(); c.UpgradeCalls != 3 || c.Upgrades != 1 {
		t.Fatalf("worker counters %+v", c)
	}

	// The installer's pre-flight check runs after the answer: the 1.11
	// installer refuses a 1.13 host (talos111.MaximumHostDowngradeVersion),
	// the sequence fails, the stage reads rebooting, and machined reboots
	// the node into the version it ran after its countdown.
	waitStage := func(want runtime.MachineStage) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			st, err := safe.StateGetByID[*runtime.MachineStatus](ctx, secure(t, f.cfg, f.wk).COSI, runtime.MachineStatusID)
			if err == nil && st.TypedSpec().Stage == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("machine stage never %s: %v %v", want, st, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitStage(runtime.MachineStageRunning)
	wkc := secure(t, f.cfg, f.wk)
	wkBoot, wkReboots := bootTime(t, wkc), f.node(f.wk).Counters().Reboots
	if wkBoot == 0 || wkBoot != f.node(f.wk).BootTime() {
		t.Fatalf("SystemStat's boot time %d, the node's %d", wkBoot, f.node(f.wk).BootTime())
	}
	resp, err := wkc.MachineClient.Upgrade(ctx, &machine.UpgradeRequest{Image: "ghcr.io/siderolabs/installer:v1.11.5"})
	if err != nil {
		t.Fatalf("the answer comes before the pre-flight check: %v", err)
	}
	// The sequence's events carry the actor ID of the answer; its failure
	// is its STOP, then a NOOP sequence event with a FATAL error.
	actor := resp.GetMessages()[0].GetActorId()
	events := make(chan client.EventResult)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := wkc.EventsWatchV2(wctx, events, client.WithTailEvents(-1), client.WithActorID(actor)); err != nil {
		t.Fatal(err)
	}
	var seq []string
	for len(seq) < 3 {
		r := <-events
		if r.Error != nil {
			t.Fatalf("events of %s: %v (so far %v)", actor, r.Error, seq)
		}
		se := r.Event.Payload.(*machine.SequenceEvent)
		seq = append(seq, se.GetAction().String()+" "+se.GetError().GetCode().String()+" "+se.GetError().GetMessage())
	}
	if !strings.HasPrefix(seq[0], "START") || !strings.HasPrefix(seq[1], "STOP") || !strings.HasPrefix(seq[2], "NOOP FATAL sequence failed:") || !strings.Contains(seq[2], "host version 1.13.4 is too new to downgrade to Talos 1.11.5") {
		t.Fatalf("events of the failed upgrade: %q", seq)
	}
	deadline = time.Now().Add(5 * time.Second)
	for f.node(f.wk).Counters().FailedUpgrades == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the pre-flight check never failed the sequence")
		}
		time.Sleep(10 * time.Millisecond)
	}
	failedAt := time.Now()
	// The phases before the installer's stopped cri and kubelet with it
	// (StopServicesEphemeral); machined's shutdown takes the rest down,
	// apid with it, and the node waits out its countdown
	// (Profile.FailedSequenceReboot) before it reboots.
	if s := f.node(f.wk).ServiceStates(); s["cri"] != "Finished" || s["kubelet"] != "Finished" {
		t.Fatalf("the worker's services after its failed upgrade: %v", s)
	}
	if v, st := f.node(f.wk).Version(), f.node(f.wk).Stage(); v != "v1.13.4" || st != runtime.MachineStageRebooting {
		t.Fatalf("after a failed pre-flight check: %s, stage %s", v, st)
	}
	time.Sleep(talossim.ProfileInstant.FailedSequenceReboot / 2)
	if c := f.node(f.wk).Counters(); c.Reboots != wkReboots {
		t.Fatalf("the worker rebooted before machined's countdown ended: %+v", c)
	}
	if _, err := wkc.Version(callCtx(t)); err == nil {
		t.Fatal("the worker's API still answers after machined shut its services down")
	}
	// Then it boots the version it ran, with its services, on a new boot,
	// without anyone asking.
	f.waitRebooted(f.node(f.wk), wkReboots)
	if d := time.Since(failedAt); d < talossim.ProfileInstant.FailedSequenceReboot {
		t.Fatalf("the worker rebooted %s after its failed upgrade, before machined's countdown", d)
	}
	if v, c := f.node(f.wk).Version(), f.node(f.wk).Counters(); v != "v1.13.4" || c.Reboots != wkReboots+1 || c.RebootCalls != 0 {
		t.Fatalf("after a failed pre-flight check: %s %+v", v, c)
	}
	if b := bootTime(t, secure(t, f.cfg, f.wk)); b <= wkBoot || b != f.node(f.wk).BootTime() {
		t.Fatalf("boot time after machined's reboot %d, before %d", b, wkBoot)
	}
	deadline = time.Now().Add(5 * time.Second)
	for s := f.node(f.wk).ServiceStates(); s["cri"] != "Running" || s["kubelet"] != "Running" || f.node(f.wk).Stage() != runtime.MachineStageRunning; s = f.node(f.wk).ServiceStates() {
		if time.Now().After(deadline) {
			t.Fatalf("the worker's services after its failed upgrade's reboot: %v, stage %s", s, f.node(f.wk).Stage())
		}
		time.Sleep(10 * time.Millisecond)
	}

	// A control plane's etcd and trustd stop too, and come back with
	// machined's reboot, on the old version.
	f.node(f.cp).SetFaults(talossim.Faults{UpgradeSequenceFails: 1})
	was, cpReboots, cpBoot := f.node(f.cp).Version(), f.node(f.cp).Counters().Reboots, f.node(f.cp).BootTime()
	if _, err := cp.MachineClient.Upgrade(ctx, &machine.UpgradeRequest{Image: "ghcr.io/siderolabs/installer:v1.13.4"}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for f.node(f.cp).Counters().FailedUpgrades == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the control plane's upgrade sequence never failed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if s := f.node(f.cp).ServiceStates(); s["etcd"] != "Finished" || s["trustd"] != "Finished" || s["cri"] != "Finished" {
		t.Fatalf("the control plane's services after its failed upgrade: %v", s)
	}
	f.waitRebooted(f.node(f.cp), cpReboots)
	if b := f.node(f.cp).BootTime(); b <= cpBoot {
		t.Fatalf("the control plane's boot time after machined's reboot %d, before %d", b, cpBoot)
	}
	deadline = time.Now().Add(5 * time.Second)
	for services(t, secure(t, f.cfg, f.cp))["etcd"] != "Running/healthy" {
		if time.Now().After(deadline) {
			t.Fatalf("etcd not back after the reboot: %v", services(t, secure(t, f.cfg, f.cp)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if v, c := f.node(f.cp).Version(), f.node(f.cp).Counters(); v != was || c.RebootCalls != 0 {
		t.Fatalf("the control plane rebooted by machined runs %s, was %s (%+v)", v, was, c)
	}
}

// TestControlPlaneBootEndsWhenEtcdRuns: a control plane's boot sequence
// waits for its services with service events (StartAllServices →
// system.WaitForService, notified by the service runner), so its stage
// reads running as soon as etcd is up, not a boot-sequence time later.
func TestControlPlaneBootEndsWhenEtcdRuns(t *testing.T) {
	t.Parallel()
	p := talossim.ProfileInstant
	p.BootSequence, p.EtcdStart = 3*time.Second, 200*time.Millisecond
	f := newFixtureWith(t, "secrets.yaml", p)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := insecure(t, f.cp).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: f.config("cp-1"), Mode: machine.ApplyConfigurationRequest_AUTO}); err != nil {
		t.Fatal(err)
	}
	f.waitPhase(f.node(f.cp), talossim.PhaseRunning)
	cp := secure(t, f.cfg, f.cp)
	// The boot sequence's own time passes before etcd can run.
	time.Sleep(p.BootSequence + 100*time.Millisecond)
	if err := cp.Bootstrap(ctx, &machine.BootstrapRequest{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		st, err := safe.StateGetByID[*runtime.MachineStatus](ctx, cp.COSI, runtime.MachineStatusID)
		if err == nil && st.TypedSpec().Stage == runtime.MachineStageRunning {
			break
		}
		if time.Since(start) > p.BootSequence+time.Second {
			t.Fatalf("stage never running after etcd started: %v %v", st, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if d := time.Since(start); d > p.EtcdStart+time.Second {
		t.Fatalf("the boot sequence ended %s after bootstrap, etcd took %s: it waited for another boot-sequence tick", d, p.EtcdStart)
	}
}

// A VM whose disk was imported from the factory's disk image boots its
// Talos with META found: a maintenance apply configures it where it runs
// (no install, no reboot; apid comes back with the config's CA), STATE
// and EPHEMERAL are made on that boot, EPHEMERAL taking the rest of the
// system disk; the SystemDisk names the disk. A disk left at the image's
// size has no room for EPHEMERAL: the boot never gets past its wait.
func TestBootFromDiskImage(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "secrets.yaml")
	ctx := callCtx(t)
	prefix, err := talossim.RandomLoopbackPrefix(50000)
	if err != nil {
		t.Fatal(err)
	}
	image := &talossim.DiskImage{Version: "v1.13.2"}
	boot := func(ip string, size uint64) *talossim.Node {
		n, err := f.sim.BootNode(ctx, talossim.NodeSpec{IP: ip, Disks: []talossim.Disk{{Bus: "scsi", Size: size}}, Image: image})
		if err != nil {
			t.Fatal(err)
		}
		f.waitPhase(n, talossim.PhaseMaintenance)
		return n
	}
	ip := talossim.HostAddr(prefix, 31)
	node := boot(ip, 32<<30)
	c := insecure(t, ip)
	sd, err := safe.StateGetByID[*block.SystemDisk](ctx, c.COSI, block.SystemDiskID)
	if err != nil || sd.TypedSpec().DevPath != "/dev/sda" {
		t.Fatalf("system disk in maintenance mode: %v %v", sd, err)
	}
	if v, err := c.Version(ctx); err != nil || v.Messages[0].Version.Tag != "v1.13.2" {
		t.Fatalf("the image's version: %v %v", v, err)
	}
	if _, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: f.config("cp-1"), Mode: machine.ApplyConfigurationRequest_AUTO}); err != nil {
		t.Fatal(err)
	}
	f.waitPhase(node, talossim.PhaseRunning)
	if got := node.Counters(); got.Installs != 0 || got.Reboots != 0 || got.ImageBoots != 1 || got.MaintenanceApplies != 1 {
		t.Errorf("counters %+v", got)
	}
	eph, err := safe.StateGetByID[*block.VolumeStatus](ctx, secure(t, f.cfg, ip).COSI, "EPHEMERAL")
	if err != nil || eph.TypedSpec().Size != 32<<30-4247<<20-100<<20 || eph.TypedSpec().Location != "/dev/sda" {
		t.Errorf("EPHEMERAL: %v %v", eph, err)
	}
	if node.Version() != "v1.13.2" || string(f.sim.Installed(ip)) != string(f.config("cp-1")) {
		t.Errorf("runs %s, disk holds the config: %v", node.Version(), string(f.sim.Installed(ip)) == string(f.config("cp-1")))
	}

	small := boot(talossim.HostAddr(prefix, 32), 4247<<20) // the v1.13 image's size, never grown
	if _, err := insecure(t, talossim.HostAddr(prefix, 32)).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: f.config("wk-1"), Mode: machine.ApplyConfigurationRequest_AUTO}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for small.BootBlocked() == "" && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if !strings.Contains(small.BootBlocked(), "diskSizeCheck") || small.Phase() == talossim.PhaseRunning {
		t.Errorf("a disk at the image's size: %q, phase %s", small.BootBlocked(), small.Phase())
	}
}

// From Talos v1.14 every configuration change applies without a reboot:
// AUTO answers NO_REBOOT for what v1.13 reboots for, NO_REBOOT takes it,
// and REBOOT is refused outside maintenance (v1alpha1_server.go
// ApplyConfiguration at v1.14.0-rc.1, where CanApplyImmediate is gone).
func TestTalos114AppliesEveryChangeLive(t *testing.T) {
	t.Parallel()
	f := newFixtureOn(t, "secrets.yaml", talossim.Profile{}, "v1.14.1")
	ctx := callCtx(t)
	node := f.node(f.cp)
	if _, err := insecure(t, f.cp).ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: f.config("cp-1"), Mode: machine.ApplyConfigurationRequest_REBOOT}); err != nil {
		t.Fatalf("REBOOT in maintenance: %v", err)
	}
	f.waitPhase(node, talossim.PhaseRunning)
	c := secure(t, f.cfg, f.cp)
	quota := []byte(strings.Replace(string(f.config("cp-1")), "diskQuotaSupport: true", "diskQuotaSupport: false", 1))
	if string(quota) == string(f.config("cp-1")) {
		t.Fatal("the v1.14 config has no diskQuotaSupport to change")
	}
	_, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: quota, Mode: machine.ApplyConfigurationRequest_REBOOT})
	wantCode(t, err, codes.Unimplemented, "the REBOOT mode is not supported")
	reboots := node.Counters().Reboots
	resp, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: quota, Mode: machine.ApplyConfigurationRequest_AUTO})
	if err != nil || resp.GetMessages()[0].GetMode() != machine.ApplyConfigurationRequest_NO_REBOOT {
		t.Fatalf("AUTO on v1.14: %v %v, want NO_REBOOT", resp, err)
	}
	if string(node.Config()) != string(quota) || node.Phase() != talossim.PhaseRunning || node.Counters().Reboots != reboots {
		t.Errorf("AUTO on v1.14: config taken %v, phase %s, reboots %d → %d", string(node.Config()) == string(quota), node.Phase(), reboots, node.Counters().Reboots)
	}
	if _, err := c.ApplyConfiguration(ctx, &machine.ApplyConfigurationRequest{Data: f.config("cp-1"), Mode: machine.ApplyConfigurationRequest_NO_REBOOT}); err != nil {
		t.Errorf("NO_REBOOT on v1.14: %v", err)
	}
}
