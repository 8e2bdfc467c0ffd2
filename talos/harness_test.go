package talos

import (
	"context"
	"crypto/tls"
	stdx509 "crypto/x509"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/siderolabs/crypto/x509"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"

	"github.com/homelab/bootstrap/talos/talossim"
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
	api     *testAPIServer
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
	h.res, err = Generate(h.opts)
	if err != nil {
		t.Fatal(err)
	}
	h.api = newTestAPIServer(t, h.res.Bundle)
	h.cluster = talossim.NewMemoryCluster(h.api.kubeconfig("lab", h.res.Bundle))
	h.sim = talossim.New(talossim.Options{Profile: ho.profile, TimeScale: ho.timeScale, Cluster: h.cluster, Log: testLogger(t)})
	t.Cleanup(func() { h.sim.Close() })
	for _, n := range nodes {
		disk := talossim.Disk{Bus: n.DiskBus, Size: 64 << 30}
		node, err := h.sim.BootNode(context.Background(), talossim.NodeSpec{IP: n.IP, Hostname: n.Name, Disks: []talossim.Disk{disk}})
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

// testAPIServer stands in for kube-apiserver: TLS with a serving
// certificate from the bundle's Kubernetes CA, and client certificates
// required and verified against that CA.
type testAPIServer struct {
	srv        *httptest.Server
	authorized atomic.Int64
}

func newTestAPIServer(t *testing.T, bundle *secrets.Bundle) *testAPIServer {
	t.Helper()
	ca, err := x509.NewCertificateAuthorityFromCertificateAndKey(bundle.Certs.K8s)
	if err != nil {
		t.Fatal(err)
	}
	serving, err := x509.NewKeyPair(ca, x509.IPAddresses([]net.IP{net.ParseIP("127.0.0.1")}), x509.CommonName("kube-apiserver"),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageServerAuth}))
	if err != nil {
		t.Fatal(err)
	}
	pool := stdx509.NewCertPool()
	pool.AppendCertsFromPEM(bundle.Certs.K8s.Crt)
	a := &testAPIServer{}
	a.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		a.authorized.Add(1)
		switch r.URL.Path {
		case "/version":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"major":"1","minor":"36","gitVersion":"v1.36.1","platform":"linux/amd64"}`)
		default:
			http.NotFound(w, r)
		}
	}))
	a.srv.TLS = &tls.Config{Certificates: []tls.Certificate{*serving.Certificate}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	a.srv.StartTLS()
	t.Cleanup(a.srv.Close)
	return a
}

// kubeconfig returns an admin kubeconfig for the server with a client
// certificate issued by the given bundle's Kubernetes CA, as Talos mints.
func (a *testAPIServer) kubeconfig(cluster string, bundle *secrets.Bundle) []byte {
	ca, err := x509.NewCertificateAuthorityFromCertificateAndKey(bundle.Certs.K8s)
	if err != nil {
		panic(err)
	}
	admin, err := x509.NewKeyPair(ca, x509.CommonName("admin"), x509.Organization("system:masters"),
		x509.ExtKeyUsage([]stdx509.ExtKeyUsage{stdx509.ExtKeyUsageClientAuth}))
	if err != nil {
		panic(err)
	}
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Appendf(nil, `apiVersion: v1
kind: Config
clusters:
- name: %[1]s
  cluster:
    server: %[2]s
    certificate-authority-data: %[3]s
users:
- name: admin@%[1]s
  user:
    client-certificate-data: %[4]s
    client-key-data: %[5]s
contexts:
- name: admin@%[1]s
  context:
    cluster: %[1]s
    namespace: default
    user: admin@%[1]s
current-context: admin@%[1]s
`, cluster, a.srv.URL, b64(bundle.Certs.K8s.Crt), b64(admin.CrtPEM), b64(admin.KeyPEM))
}
