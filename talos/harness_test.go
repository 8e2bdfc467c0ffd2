package talos

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/homelab/bootstrap/lab/talossim"
	"github.com/homelab/bootstrap/talos/talostest"
)

// harness is a cluster directory with rendered configs, a talossim node per
// config node on a random 127.X.Y.0/24, a test API server whose CA and
// admin certificate come from the bundle, and Ops for the cluster.
type harness struct {
	t       *testing.T
	dir     string
	opts    GenerateOptions
	res     *Result
	sim     *talossim.Sim
	cluster *talossim.MemoryCluster
	api     *talostest.APIServer
	ops     *Ops
	prefix  netip.Prefix
}

type harnessOptions struct {
	controlPlanes, workers int
	profile                talossim.Profile
	timeScale              float64
	ops                    OpsOptions
	// faults per node name, set before the nodes boot.
	faults map[string]talossim.Faults
	// workerBus is the disk bus of workers (default virtio).
	workerBus string
	// noDiscovery makes the discovery service unreachable: workers find
	// trustd only through the cluster endpoint.
	noDiscovery bool
	// memory and diskSize per node name replace the VMs' defaults (2 GiB
	// of RAM, one 64 GiB disk).
	memory, diskSize map[string]uint64
	// image boots every node from a disk created from the factory's disk
	// image instead of the ISO.
	image *talossim.DiskImage
	// extraDisk per node name: a second, empty disk after the first.
	extraDisk map[string]talossim.Disk
	// talosVersion the VMs boot and the configs are rendered for
	// (default: the defaults), with the factory's installer for it.
	talosVersion string
	// patches are global patch files.
	patches []string
}

func testLogger(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger()
}

func newHarness(t *testing.T, ho harnessOptions) *harness {
	t.Helper()
	prefix, err := talossim.RandomLoopbackPrefix(50000)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, dir: clusterDir(t, "secrets.yaml"), prefix: prefix}
	if ho.workerBus == "" {
		ho.workerBus = "virtio"
	}
	if ho.profile.Name == "" {
		ho.profile = talossim.ProfileInstant
	}
	ip := func(i int) string { return talossim.HostAddr(prefix, byte(i)) }
	var nodes []Node
	for i := 1; i <= ho.controlPlanes; i++ {
		nodes = append(nodes, Node{Name: fmt.Sprintf("cp-%d", i), Role: RoleControlPlane, IP: ip(10 + i), DiskBus: "scsi"})
	}
	for i := 1; i <= ho.workers; i++ {
		nodes = append(nodes, Node{Name: fmt.Sprintf("wk-%d", i), Role: RoleWorker, IP: ip(20 + i), DiskBus: ho.workerBus})
	}
	h.opts = GenerateOptions{
		Dir: h.dir, ClusterName: "lab", Nodes: nodes,
		Network: Network{Gateway: ip(1), Nameservers: []string{ip(1)}},
		Now:     func() time.Time { return fixedNow },
		Log:     testLogger(t),
	}
	if ho.controlPlanes > 1 {
		h.opts.VIP = ip(10)
	}
	if ho.talosVersion != "" {
		h.opts = atVersion(func(string) GenerateOptions { return h.opts }, ho.talosVersion)(h.dir)
		if strings.HasPrefix(ho.talosVersion, "v1.12.") {
			// Talos 1.12 runs Kubernetes up to 1.35.
			h.opts.KubernetesVersion = "1.35.4"
		}
	}
	h.opts.Patches.Global = ho.patches
	h.res, err = Generate(h.opts)
	if err != nil {
		t.Fatal(err)
	}
	registered := make([]talostest.Node, 0, len(nodes))
	for _, n := range nodes {
		registered = append(registered, talostest.Node{Name: n.Name, IP: n.IP, ControlPlane: n.Role == RoleControlPlane})
	}
	k8sCA := h.res.Bundle.Certs.K8s
	h.api = talostest.NewAPIServer(t, k8sCA.Crt, k8sCA.Key, registered...)
	h.cluster = talossim.NewMemoryCluster(h.api.Kubeconfig("lab", k8sCA.Crt, k8sCA.Key))
	h.sim = talossim.New(talossim.Options{Profile: ho.profile, TimeScale: ho.timeScale, Cluster: h.cluster, DiscoveryUnreachable: ho.noDiscovery, TalosVersion: ho.talosVersion, Log: testLogger(t)})
	t.Cleanup(func() { h.sim.Close() })
	for _, n := range nodes {
		disk := talossim.Disk{Bus: n.DiskBus, Size: 64 << 30}
		if size, ok := ho.diskSize[n.Name]; ok {
			disk.Size = size
		}
		disks := []talossim.Disk{disk}
		if d, ok := ho.extraDisk[n.Name]; ok {
			disks = append(disks, d)
		}
		node, err := h.sim.BootNode(context.Background(), talossim.NodeSpec{IP: n.IP, Hostname: n.Name, Disks: disks, MemoryBytes: ho.memory[n.Name], Image: ho.image})
		if err != nil {
			t.Fatal(err)
		}
		if f, ok := ho.faults[n.Name]; ok {
			node.SetFaults(f)
		}
		// Provision hands over VMs that have booted the ISO.
		wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = node.WaitPhase(wctx, talossim.PhaseMaintenance)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	oo := ho.ops
	oo.Talosconfig = h.res.Talosconfig
	oo.SecretsPath = h.res.SecretsPath
	oo.Log = testLogger(t)
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&oo.PollInterval, 10*time.Millisecond)
	def(&oo.CallTimeout, 3*time.Second)
	def(&oo.ApplyTimeout, 3*time.Second)
	def(&oo.InstallTimeout, 15*time.Second)
	def(&oo.RebootTimeout, 15*time.Second)
	def(&oo.BootstrapTimeout, 15*time.Second)
	def(&oo.HealthTimeout, 15*time.Second)
	def(&oo.ProgressEvery, time.Second)
	h.ops, err = NewOps(oo)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) targets() []Target {
	var out []Target
	for _, n := range h.res.Nodes {
		out = append(out, Target{Name: n.Name, IP: n.IP, Role: n.Role, Config: n.Config, InstallDisk: n.InstallDisk})
	}
	return out
}

func (h *harness) converge(ctx context.Context, mutate Mutator) (*ConvergeResult, error) {
	return h.ops.Converge(ctx, ConvergeOptions{Nodes: h.targets(), KubeconfigPath: filepath.Join(h.dir, KubeconfigFile), Mutate: mutate})
}

func (h *harness) node(name string) *talossim.Node {
	n, ok := h.res.Node(name)
	if !ok {
		h.t.Fatalf("no node %s", name)
	}
	sn, ok := h.sim.Node(n.IP)
	if !ok {
		h.t.Fatalf("no sim node at %s", n.IP)
	}
	return sn
}

// counters sums every node's counters.
func (h *harness) counters() (total talossim.Counters, byNode map[string]talossim.Counters) {
	byNode = map[string]talossim.Counters{}
	for _, n := range h.res.Nodes {
		sn, ok := h.sim.Node(n.IP)
		if !ok {
			continue // powered off
		}
		c := sn.Counters()
		byNode[n.Name] = c
		total.Applies += c.Applies
		total.MaintenanceApplies += c.MaintenanceApplies
		total.Bootstraps += c.Bootstraps
		total.BootstrapCalls += c.BootstrapCalls
		total.DryRuns += c.DryRuns
		total.Installs += c.Installs
	}
	return total, byNode
}

// health is the HealthInput of the harness's nodes (Talos side only).
func (h *harness) health() HealthInput {
	var in HealthInput
	for _, n := range h.res.Nodes {
		in.Nodes = append(in.Nodes, HealthTarget{Name: n.Name, IP: n.IP, Role: n.Role})
	}
	return in
}
