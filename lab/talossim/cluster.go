package talossim

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
)

// NodeInfo identifies a simulated node to the control plane.
type NodeInfo struct {
	Hostname string
	IP       string
	// Role is "controlplane" or "worker" (machine.type of the node's config).
	Role string
	// KubeletImage is machine.kubelet.image of the node's config: the
	// kubelet version the node registers with.
	KubeletImage string
}

// Cluster is the Kubernetes control plane behind simulated Talos nodes.
// Talos itself only starts etcd and the static pods; what a real cluster
// then does (an API server that answers, nodes that register) is this
// interface's job. The simulator calls it; tests use MemoryCluster, and the
// lab plugs in a real kube-apiserver whose CAs come from the secrets bundle.
//
// Calls happen from simulator goroutines, possibly concurrently, so
// implementations must be safe for concurrent use. None is called while the
// simulator holds a lock, so an implementation may call back into the Sim.
type Cluster interface {
	// Bootstrap is called once per Talos cluster (cluster.id), right after
	// a Bootstrap RPC was accepted on its first control plane, with that
	// node's complete machine config (YAML, multi-document). The config
	// carries what a control plane needs: cluster name and endpoint, the
	// Kubernetes, aggregator and etcd CAs with keys, the service-account
	// key, the bootstrap token, pod/service subnets. Bootstrap runs in the
	// background of the RPC (which has already answered, as real Talos
	// does); it should start the control plane and return once it is up or
	// has failed. A returned error is logged and surfaces as an unhealthy
	// etcd service on the bootstrap node; it is not retried.
	Bootstrap(ctx context.Context, bootstrapNodeConfig []byte) error

	// NodeConfigured is called every time a node boots into configured mode
	// (after its install, and after every later reboot), so the control
	// plane can register it (the lab creates a Node object kept Ready by
	// kwok). It may be called before Bootstrap, for nodes that come up
	// before etcd is bootstrapped; an implementation must remember them.
	// An error is logged and otherwise ignored: a kubelet that cannot
	// register keeps trying.
	NodeConfigured(ctx context.Context, node NodeInfo) error

	// Kubeconfig returns the admin kubeconfig served by the Kubeconfig RPC
	// of configured control-plane nodes. Real Talos mints it from the
	// cluster CA; the lab returns one that reaches its API server with an
	// admin certificate issued by the bundle's Kubernetes CA. An error
	// makes the RPC fail with Unavailable (callers retry).
	Kubeconfig(ctx context.Context) ([]byte, error)

	// Healthy reports whether the control plane serves requests. Talos'
	// API has no such call (the API server is a static pod, not a Talos
	// service); the simulator exposes it as Sim.ControlPlaneHealthy for the
	// lab's status and for tests.
	Healthy(ctx context.Context) bool
}

// MemoryCluster is a Cluster kept in memory: it records what the simulator
// told it and serves a kubeconfig supplied by the test. It is healthy once
// bootstrapped.
type MemoryCluster struct {
	mu              sync.Mutex
	kubeconfig      []byte
	bootstraps      int
	bootstrapConfig []byte
	nodes           map[string]NodeInfo
	bootstrapErr    error
	snapshot        []byte
	recovered       [][]byte
	imageUpdates    []string
	staticPodErr    error
}

var _ KubernetesUpdater = (*MemoryCluster)(nil)

// StaticPodImage implements KubernetesUpdater: it records
// "node/name=image" and fails with what FailStaticPods set.
func (m *MemoryCluster) StaticPodImage(_ context.Context, node NodeInfo, name, image string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.imageUpdates = append(m.imageUpdates, node.Hostname+"/"+name+"="+image)
	return m.staticPodErr
}

// KubeletImage implements KubernetesUpdater: it records "node/kubelet=image".
func (m *MemoryCluster) KubeletImage(_ context.Context, node NodeInfo, image string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.imageUpdates = append(m.imageUpdates, node.Hostname+"/kubelet="+image)
	return nil
}

// FailStaticPods makes later StaticPodImage calls fail with err (nil to
// undo), as a new image that does not start.
func (m *MemoryCluster) FailStaticPods(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.staticPodErr = err
}

// ImageUpdates lists the StaticPodImage and KubeletImage calls in order.
func (m *MemoryCluster) ImageUpdates() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.imageUpdates)
}

// Recover implements EtcdRecoverer: it records the snapshot and counts as
// a bootstrap (the in-memory cluster has no etcd to restore it into).
func (m *MemoryCluster) Recover(ctx context.Context, cfg, snapshot []byte, _ bool) error {
	if err := m.Bootstrap(ctx, cfg); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recovered = append(m.recovered, bytes.Clone(snapshot))
	return nil
}

// Recovered lists the snapshots Recover was called with.
func (m *MemoryCluster) Recovered() [][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.recovered)
}

// SetSnapshot gives the cluster an etcd snapshot to serve through
// EtcdSnapshot (it has no etcd of its own: tests pass one built by
// backup/backuptest); without one EtcdSnapshot fails.
func (m *MemoryCluster) SetSnapshot(snapshot []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.snapshot = bytes.Clone(snapshot)
}

// EtcdSnapshot implements EtcdSnapshotter with the snapshot SetSnapshot gave.
func (m *MemoryCluster) EtcdSnapshot(context.Context) (io.ReadCloser, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.snapshot == nil {
		return nil, errors.New("the in-memory cluster has no etcd to snapshot")
	}
	return io.NopCloser(bytes.NewReader(m.snapshot)), nil
}

// NewMemoryCluster returns a MemoryCluster serving kubeconfig (may be nil
// until SetKubeconfig).
func NewMemoryCluster(kubeconfig []byte) *MemoryCluster {
	return &MemoryCluster{kubeconfig: kubeconfig, nodes: map[string]NodeInfo{}}
}

// SetKubeconfig replaces the kubeconfig served to Kubeconfig calls.
func (m *MemoryCluster) SetKubeconfig(kubeconfig []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.kubeconfig = slices.Clone(kubeconfig)
}

// FailBootstrap makes later Bootstrap calls fail with err (nil to undo).
func (m *MemoryCluster) FailBootstrap(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.bootstrapErr = err
}

// Bootstrap implements Cluster.
func (m *MemoryCluster) Bootstrap(_ context.Context, cfg []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.bootstrapErr != nil {
		return m.bootstrapErr
	}
	m.bootstraps++
	m.bootstrapConfig = slices.Clone(cfg)
	return nil
}

// NodeConfigured implements Cluster.
func (m *MemoryCluster) NodeConfigured(_ context.Context, n NodeInfo) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nodes[n.Hostname] = n
	return nil
}

// Kubeconfig implements Cluster.
func (m *MemoryCluster) Kubeconfig(context.Context) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.kubeconfig) == 0 {
		return nil, errors.New("no kubeconfig supplied to the simulated cluster")
	}
	return slices.Clone(m.kubeconfig), nil
}

// Healthy implements Cluster.
func (m *MemoryCluster) Healthy(context.Context) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bootstraps > 0
}

// Bootstraps counts Bootstrap calls that succeeded.
func (m *MemoryCluster) Bootstraps() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bootstraps
}

// BootstrapConfig is the machine config the cluster was bootstrapped with.
func (m *MemoryCluster) BootstrapConfig() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.bootstrapConfig)
}

// Nodes lists the nodes reported configured, sorted by hostname.
func (m *MemoryCluster) Nodes() []NodeInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]NodeInfo, 0, len(m.nodes))
	for _, n := range m.nodes {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b NodeInfo) int { return strings.Compare(a.Hostname, b.Hostname) })
	return out
}
