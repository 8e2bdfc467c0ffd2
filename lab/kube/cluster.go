// Package kube runs a real Kubernetes control plane for the lab and for
// tests: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
// kwok (which plays the kubelets: registered nodes stay Ready, scheduled pods
// become Running), optionally with the Flux source-controller and
// kustomize-controller, all as child processes on loopback. The API server
// trusts the Kubernetes CA of a Talos secrets bundle, so a kubeconfig issued
// the way Talos issues it works against it.
package kube

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/homelab/bootstrap/internal/fsutil"
	"github.com/homelab/bootstrap/internal/wait"
)

// Defaults for Options.
const (
	DefaultClusterName            = "lab"
	DefaultServiceCIDR            = "10.96.0.0/12"
	DefaultReadyTimeout           = 90 * time.Second
	DefaultNodeLeaseDuration      = 8 * time.Second
	DefaultNodeMonitorGracePeriod = 16 * time.Second
	stopGrace                     = 5 * time.Second
)

// Options configures a lab control plane.
type Options struct {
	// Log receives the lab's own progress lines (the servers log to files).
	Log zerolog.Logger
	// BinDir holds the lab binaries; empty means DefaultBinDir().
	BinDir string
	// DataDir holds etcd data, certificates, kubeconfigs and logs. Empty
	// means a fresh temporary directory that Stop removes.
	DataDir string
	// ClusterName names the cluster and the kubeconfig's cluster, user and
	// context (default "lab").
	ClusterName string
	// Endpoint is the cluster endpoint, "https://host:port". When host is a
	// loopback address the API server listens exactly there, as on a real
	// control plane; otherwise it listens on a free 127.0.0.1 port and host
	// only goes into the serving certificate. Empty: a free 127.0.0.1 port.
	Endpoint string
	// CertSANs are extra names or IPs for the serving certificate.
	CertSANs []string
	// PKI is the Kubernetes CA and service-account key (required).
	PKI PKI
	// ServiceCIDR is the service IP range (default 10.96.0.0/12).
	ServiceCIDR string
	// ScheduleOnControlPlanes leaves control-plane nodes untainted, as
	// Talos' cluster.allowSchedulingOnControlPlanes does.
	ScheduleOnControlPlanes bool
	// Flux also starts the Flux source-controller and kustomize-controller
	// (after applying their CRDs).
	Flux bool
	// ReadyTimeout bounds each readiness wait (default 90s).
	ReadyTimeout time.Duration
	// NodeLeaseDuration is the node lease kwok keeps per node (renewed every
	// quarter of it; default 8s).
	NodeLeaseDuration time.Duration
	// NodeMonitorGracePeriod is how long a node may go without a heartbeat
	// before the controller manager marks it NotReady (default 16s).
	NodeMonitorGracePeriod time.Duration
	// AuditPolicyFile and AuditLogPath, both set, make the API server write
	// an audit log (--audit-policy-file, --audit-log-path): one JSON event
	// per line, read back with ReadAuditLog. WritesAuditPolicy is a policy
	// that records who wrote what.
	AuditPolicyFile string
	AuditLogPath    string
	// RestoreSnapshot is an etcd snapshot file (as `etcdctl snapshot save`
	// writes it) the control plane starts from instead of an empty etcd:
	// etcd's own `etcdutl snapshot restore` builds the data directory,
	// verifying the snapshot's sha256 unless RestoreSkipHashCheck.
	RestoreSnapshot      string
	RestoreSkipHashCheck bool
	// Encryption, when it has a key, makes the API server encrypt Secrets
	// in etcd as Talos configures it (EncryptionConfig).
	Encryption Encryption
	// KubernetesVersions picks, per server (kube-apiserver,
	// kube-controller-manager, kube-scheduler), the Kubernetes version it
	// starts at ("1.35.4" or "v1.35.4"): the lab builds the pinned version
	// and a few other minors, and runs the build of the same minor (see
	// Binaries.ServerBinary). A server not named runs the pinned version.
	KubernetesVersions map[string]string
	// FluxStoragePort is the port source-controller serves artifacts on
	// (0: a free one). A control plane started again on restored etcd
	// passes the old one: the artifact URLs in the restored GitRepository
	// statuses then stay valid, as a real cluster's source-controller
	// Service address does.
	FluxStoragePort int
	// NetworkGate keeps a registered node NotReady until a CNI agent pod
	// runs on it, as on hardware (see network.go); without it kwok marks
	// every node Ready at once.
	NetworkGate bool
	// ControllersStarted, when set, runs once the controller manager,
	// scheduler and kwok run and before Flux starts: a caller registers its
	// nodes there, so kwok makes them Ready while the Flux controllers start
	// (a real node's kubelet registers as soon as the API server answers,
	// long before anything is installed on the cluster). An error fails the
	// start.
	ControllersStarted func(context.Context, *Cluster) error
}

// Cluster is a running lab control plane.
type Cluster struct {
	opts     Options
	bins     *Binaries
	dataDir  string
	ownsData bool
	log      zerolog.Logger

	server      string // https://host:port the API server listens on
	etcdURL     string
	adminConfig *rest.Config
	client      kubernetes.Interface

	sp    *spawner
	mu    sync.Mutex
	procs []*process
	ports map[string]int
	// versions are the Kubernetes versions the servers run, by name.
	versions map[string]string
	// apiHost and apiPort are where the API server listens (a restart binds
	// the same).
	apiHost string
	apiPort int
	stopped bool
	stopErr error
	// stopMarker ends the pod Ready reconcile and the network-ready marker.
	stopMarker context.CancelFunc
	startedAt  time.Time
	readyIn    time.Duration
	// nodeSeen is when each Node (by UID) was first seen, and Ready.
	nodeSeen map[types.UID]nodeTimes
}

// Start runs the control plane and returns once the API server is ready, the
// controller manager, scheduler and kwok are healthy and the default
// ServiceAccount exists (pods can be created). On error everything started
// so far is stopped again.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if !supported {
		return nil, errors.New("the lab control plane runs on Linux only")
	}
	if len(opts.PKI.CACertPEM) == 0 || len(opts.PKI.CAKeyPEM) == 0 || len(opts.PKI.ServiceAccountKeyPEM) == 0 {
		return nil, errors.New("starting the lab control plane: Options.PKI needs the Kubernetes CA certificate and key and the service-account key")
	}
	opts = withDefaults(opts)
	bins, err := LoadBinaries(opts.BinDir)
	if err != nil {
		return nil, fmt.Errorf("starting the lab control plane: %w", err)
	}
	log := opts.Log.With().Str("component", "lab-kube").Logger()
	// Free ports are picked, then bound by the children: in between, another
	// process (or an outgoing connection) may take one. That costs a retry.
	for attempt := 1; ; attempt++ {
		c, err := startAttempt(ctx, opts, bins, log)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == 3 || ctx.Err() != nil {
			return nil, err
		}
		log.Warn().Err(err).Int("attempt", attempt).Msg("a lab port was taken before its server bound it; starting again")
	}
}

// errPortTaken marks a start that failed because a server could not bind.
var errPortTaken = errors.New("a port picked for the lab was taken")

func startAttempt(ctx context.Context, opts Options, bins *Binaries, log zerolog.Logger) (*Cluster, error) {
	c := &Cluster{opts: opts, bins: bins, log: log, ports: map[string]int{}, versions: map[string]string{}, startedAt: time.Now()}
	if opts.DataDir == "" {
		removeStaleDataDirs(c.log)
		d, err := os.MkdirTemp("", tempDirPrefix+"*")
		if err != nil {
			return nil, fmt.Errorf("starting the lab control plane: %w", err)
		}
		c.dataDir, c.ownsData = d, true
		if err := os.WriteFile(filepath.Join(d, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
			return nil, fmt.Errorf("starting the lab control plane: %w", err)
		}
	} else {
		c.dataDir = opts.DataDir
		// A retry, or an earlier lab in the same dir: etcd starts empty.
		if err := os.RemoveAll(filepath.Join(c.dataDir, "etcd")); err != nil {
			return nil, fmt.Errorf("starting the lab control plane: %w", err)
		}
	}
	for _, d := range []string{"etcd", "pki", "logs", "flux/storage"} {
		if err := os.MkdirAll(filepath.Join(c.dataDir, d), 0o700); err != nil {
			return nil, fmt.Errorf("starting the lab control plane: %w", err)
		}
	}
	c.sp = newSpawner()
	if err := c.start(ctx); err != nil {
		tails := c.LogTail(25)
		_ = c.Stop()
		if strings.Contains(tails, "address already in use") {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return nil, fmt.Errorf("starting the lab control plane: %w\n%s", err, tails)
	}
	c.readyIn = time.Since(c.startedAt)
	c.log.Info().Str("server", c.server).Dur("took", c.readyIn).Msgf("lab control plane ready in %s", wait.Round(c.readyIn))
	return c, nil
}

func withDefaults(o Options) Options {
	if o.ClusterName == "" {
		o.ClusterName = DefaultClusterName
	}
	if o.ServiceCIDR == "" {
		o.ServiceCIDR = DefaultServiceCIDR
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = DefaultReadyTimeout
	}
	if o.NodeLeaseDuration <= 0 {
		o.NodeLeaseDuration = DefaultNodeLeaseDuration
	}
	if o.NodeMonitorGracePeriod <= 0 {
		o.NodeMonitorGracePeriod = DefaultNodeMonitorGracePeriod
	}
	return o
}

func (c *Cluster) start(ctx context.Context) error {
	bindHost, bindPort, sanIPs, sanDNS, err := c.listenAddress()
	if err != nil {
		return err
	}
	c.server = "https://" + net.JoinHostPort(bindHost, strconv.Itoa(bindPort))
	c.apiHost, c.apiPort = bindHost, bindPort
	if err := c.writePKI(sanIPs, sanDNS); err != nil {
		return err
	}

	if err := c.startEtcd(ctx); err != nil {
		return err
	}
	if err := c.startAPIServer(ctx); err != nil {
		return err
	}
	if err := c.startControllers(ctx); err != nil {
		return err
	}
	mctx, cancel := context.WithCancel(context.Background())
	c.mu.Lock()
	c.stopMarker = cancel
	c.mu.Unlock()
	go c.resyncPodReady(mctx)
	go c.recordNodesReady(mctx)
	if c.opts.NetworkGate {
		go c.markNetworkReady(mctx)
	}
	if c.opts.ControllersStarted != nil {
		if err := c.opts.ControllersStarted(ctx, c); err != nil {
			return err
		}
	}
	if c.opts.Flux {
		if err := c.StartFlux(ctx); err != nil {
			return err
		}
	}
	return nil
}

// listenAddress decides where the API server listens and what its serving
// certificate names.
func (c *Cluster) listenAddress() (host string, port int, ips []net.IP, dns []string, err error) {
	ips = []net.IP{net.IPv4(127, 0, 0, 1), firstServiceIP(c.opts.ServiceCIDR)}
	dns = []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
	host = "127.0.0.1"
	if c.opts.Endpoint != "" {
		u, err := url.Parse(c.opts.Endpoint)
		if err != nil || u.Scheme != "https" || u.Hostname() == "" {
			return "", 0, nil, nil, fmt.Errorf("endpoint %q is not https://host:port", c.opts.Endpoint)
		}
		h := u.Hostname()
		ip := net.ParseIP(h)
		if ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, h)
		}
		if ip != nil && ip.IsLoopback() {
			host = h
			if u.Port() == "" {
				port = 443
			} else if port, err = strconv.Atoi(u.Port()); err != nil {
				return "", 0, nil, nil, fmt.Errorf("endpoint %q: bad port", c.opts.Endpoint)
			}
		}
	}
	for _, s := range c.opts.CertSANs {
		if ip := net.ParseIP(s); ip != nil {
			ips = append(ips, ip)
		} else if s != "" {
			dns = append(dns, s)
		}
	}
	if port == 0 {
		if port, err = c.freePort("kube-apiserver", host); err != nil {
			return "", 0, nil, nil, err
		}
	} else if err := portFree(host, port); err != nil {
		return "", 0, nil, nil, fmt.Errorf("endpoint %s: %w", c.opts.Endpoint, err)
	}
	c.ports["kube-apiserver"] = port
	return host, port, ips, dns, nil
}

func (c *Cluster) path(parts ...string) string {
	return filepath.Join(append([]string{c.dataDir}, parts...)...)
}

func (c *Cluster) writePKI(ips []net.IP, dns []string) error {
	crt, key, err := issueServingCert(c.opts.PKI, ips, dns)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"ca.crt":         c.opts.PKI.CACertPEM,
		"ca.key":         c.opts.PKI.CAKeyPEM,
		"sa.key":         c.opts.PKI.ServiceAccountKeyPEM,
		"apiserver.crt":  crt,
		"apiserver.key":  key,
		"admin.conf":     nil,
		"kcm.conf":       nil,
		"scheduler.conf": nil,
		"kwok.conf":      nil,
	}
	// Each component gets its own identity. The controller manager runs all
	// its controllers under it (not one service account each, as Talos does):
	// fetching ~40 tokens one by one costs about 4s of every lab start. So it,
	// and kwok, which stands in for every kubelet, get cluster-admin. The
	// lab's own clients and the Flux controllers are "lab-admin", so that
	// "admin" (what Kubeconfig issues, as Talos does) is only ever a user
	// of the cluster: an audit log tells their writes apart.
	identities := map[string][2]string{
		"admin.conf":     {LabAdminUser, adminOrganization},
		"kcm.conf":       {"system:kube-controller-manager", adminOrganization},
		"scheduler.conf": {"system:kube-scheduler", ""},
		"kwok.conf":      {"kwok", adminOrganization},
	}
	for name, id := range identities {
		var orgs []string
		if id[1] != "" {
			orgs = []string{id[1]}
		}
		kc, err := issueKubeconfig(c.opts.ClusterName, c.server, c.opts.PKI.CACertPEM, c.opts.PKI.CAKeyPEM, id[0], orgs, AdminCertLifetime)
		if err != nil {
			return err
		}
		files[name] = kc
	}
	for name, data := range files {
		if err := fsutil.WriteAtomic(c.path("pki", name), data, 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(files["admin.conf"])
	if err != nil {
		return fmt.Errorf("loading the admin kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	c.adminConfig = cfg
	if c.client, err = kubernetes.NewForConfig(cfg); err != nil {
		return fmt.Errorf("building the admin client: %w", err)
	}
	return nil
}

func (c *Cluster) run(name, bin string, args []string, env ...string) (*process, error) {
	return c.runPath(name, c.bins.Path(bin), args, env...)
}

func (c *Cluster) runPath(name, path string, args []string, env ...string) (*process, error) {
	p, err := startProcess(c.sp, name, path, args, env, c.path("logs", name+".log"))
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	c.log.Debug().Str("process", name).Int("pid", p.cmd.Process.Pid).Msg("started")
	return p, nil
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	client, err := c.freePort("etcd", "127.0.0.1")
	if err != nil {
		return err
	}
	peer, err := c.freePort("etcd-peer", "127.0.0.1")
	if err != nil {
		return err
	}
	c.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	if c.opts.RestoreSnapshot != "" {
		if err := c.restoreEtcd(ctx, peerURL); err != nil {
			return err
		}
	}
	p, err := c.run("etcd", "etcd", []string{
		"--name=lab",
		"--data-dir=" + c.path("etcd"),
		"--listen-client-urls=" + c.etcdURL,
		"--advertise-client-urls=" + c.etcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=lab=" + peerURL,
		// Throwaway data: durability only costs time here.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	})
	if err != nil {
		return err
	}
	return c.waitHTTP(ctx, p, "etcd health", c.etcdURL+"/health", func(body string) bool {
		return strings.Contains(body, `"health":"true"`)
	})
}

// restoreEtcd builds etcd's data directory from RestoreSnapshot with the
// real `etcdutl snapshot restore`, as Talos' etcd service does before a
// recover_etcd bootstrap (snapshot.Restore with the member's name and peer
// URL as a one-member initial cluster: services/etcd.go recoverFromSnapshot
// at v1.13.3). etcdutl refuses an existing data directory, so the empty
// one start made is removed first.
func (c *Cluster) restoreEtcd(ctx context.Context, peerURL string) error {
	dataDir := c.path("etcd")
	if err := os.RemoveAll(dataDir); err != nil {
		return err
	}
	args := []string{"snapshot", "restore", c.opts.RestoreSnapshot,
		"--data-dir=" + dataDir, "--name=lab",
		"--initial-cluster=lab=" + peerURL, "--initial-advertise-peer-urls=" + peerURL,
	}
	if c.opts.RestoreSkipHashCheck {
		args = append(args, "--skip-hash-check=true")
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.ReadyTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, c.bins.Path("etcdutl"), args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("etcdutl snapshot restore %s: %w\n%s", c.opts.RestoreSnapshot, err, strings.TrimSpace(string(out)))
	}
	c.log.Info().Str("snapshot", c.opts.RestoreSnapshot).Msg("etcd data restored from the snapshot")
	return nil
}

// startAPIServer runs kube-apiserver at its version (Options.KubernetesVersions)
// and waits for /readyz.
func (c *Cluster) startAPIServer(ctx context.Context) error {
	host, port := c.apiHost, c.apiPort
	var audit []string
	switch o := c.opts; {
	case o.AuditPolicyFile != "" && o.AuditLogPath != "":
		audit = []string{"--audit-policy-file=" + o.AuditPolicyFile, "--audit-log-path=" + o.AuditLogPath,
			"--audit-log-format=json", "--audit-log-mode=blocking"}
	case o.AuditPolicyFile != "" || o.AuditLogPath != "":
		return errors.New("audit logging needs both Options.AuditPolicyFile and Options.AuditLogPath")
	}
	if cfg, err := EncryptionConfig(c.opts.Encryption); err != nil {
		return fmt.Errorf("rendering the API server's encryption config: %w", err)
	} else if cfg != nil {
		path := c.path("pki", "encryptionconfig.yaml")
		if err := fsutil.WriteAtomic(path, cfg, 0o600); err != nil {
			return fmt.Errorf("writing the API server's encryption config: %w", err)
		}
		audit = append(audit, "--encryption-provider-config="+path)
	}
	p, err := c.runServer("kube-apiserver", append([]string{
		"--etcd-servers=" + c.etcdURL,
		"--bind-address=" + host,
		"--advertise-address=" + host,
		// The reconciler refuses loopback addresses, and no pod here needs
		// the kubernetes Service's endpoints.
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + c.path("pki"),
		"--tls-cert-file=" + c.path("pki", "apiserver.crt"),
		"--tls-private-key-file=" + c.path("pki", "apiserver.key"),
		"--client-ca-file=" + c.path("pki", "ca.crt"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + c.path("pki", "sa.key"),
		"--service-account-signing-key-file=" + c.path("pki", "sa.key"),
		"--authorization-mode=Node,RBAC",
		"--service-cluster-ip-range=" + c.opts.ServiceCIDR,
		"--allow-privileged=true",
		"--profiling=false",
		"--v=1",
	}, audit...))
	if err != nil {
		return err
	}
	return wait.Until(ctx, wait.Spec{What: "kube-apiserver /readyz", Timeout: c.opts.ReadyTimeout, Interval: 200 * time.Millisecond, Log: c.log},
		func(ctx context.Context) (bool, string, error) {
			if done, err := p.exited(); done {
				return false, "", err
			}
			body, err := c.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
			if err != nil {
				return false, firstLine(err.Error()), nil
			}
			return strings.TrimSpace(string(body)) == "ok", "", nil
		})
}

func (c *Cluster) startControllers(ctx context.Context) error {
	kcmPort, err := c.freePort("kube-controller-manager", "127.0.0.1")
	if err != nil {
		return err
	}
	schedPort, err := c.freePort("kube-scheduler", "127.0.0.1")
	if err != nil {
		return err
	}
	kwokPort, err := c.freePort("kwok", "127.0.0.1")
	if err != nil {
		return err
	}
	stages, err := c.kwokStages(ctx)
	if err != nil {
		return err
	}
	if err := fsutil.WriteAtomic(c.path("kwok-stages.yaml"), stages, 0o600); err != nil {
		return fmt.Errorf("writing the kwok stages: %w", err)
	}

	kcm, err := c.runServer("kube-controller-manager", c.controllerManagerArgs())
	if err != nil {
		return err
	}
	sched, err := c.runServer("kube-scheduler", c.schedulerArgs())
	if err != nil {
		return err
	}
	kwok, err := c.run("kwok", "kwok", []string{
		"--kubeconfig=" + c.path("pki", "kwok.conf"),
		"--manage-all-nodes=false",
		"--manage-nodes-with-label-selector=" + HeartbeatLabel + "!=" + heartbeatStopped,
		"--disregard-status-with-annotation-selector=" + AnnotationMirror,
		"--node-lease-duration-seconds=" + strconv.Itoa(int(c.opts.NodeLeaseDuration/time.Second)),
		"--server-address=127.0.0.1:" + strconv.Itoa(kwokPort),
		"--config=" + c.path("kwok-stages.yaml"),
	})
	if err != nil {
		return err
	}

	// KCM and the scheduler serve /healthz with a certificate they made up
	// themselves in their cert dir; nothing to verify it against.
	for _, h := range []struct {
		p   *process
		url string
	}{
		{kcm, fmt.Sprintf("https://127.0.0.1:%d/healthz", kcmPort)},
		{sched, fmt.Sprintf("https://127.0.0.1:%d/healthz", schedPort)},
		{kwok, fmt.Sprintf("http://127.0.0.1:%d/healthz", kwokPort)},
	} {
		if err := c.waitHTTP(ctx, h.p, h.p.name+" /healthz", h.url, func(body string) bool { return strings.TrimSpace(body) == "ok" }); err != nil {
			return err
		}
	}
	return wait.Until(ctx, wait.Spec{What: "the default ServiceAccount (controller manager running)", Timeout: c.opts.ReadyTimeout, Interval: 200 * time.Millisecond, Log: c.log},
		func(ctx context.Context) (bool, string, error) {
			if done, err := kcm.exited(); done {
				return false, "", err
			}
			_, err := c.client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
			if err != nil {
				return false, firstLine(err.Error()), nil
			}
			return true, "", nil
		})
}

// serverFlags are the flags kube-controller-manager and kube-scheduler
// share: one kubeconfig for everything, no front proxy (looking up its CA
// only logs errors), no leader election, /healthz on a loopback port
// picked once and kept across restarts, self-made serving certificates.
func (c *Cluster) serverFlags(name, conf, certDir string) []string {
	return []string{
		"--kubeconfig=" + conf,
		"--authentication-kubeconfig=" + conf,
		"--authorization-kubeconfig=" + conf,
		"--authentication-skip-lookup=true",
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(c.ports[name]),
		"--cert-dir=" + c.path("pki", certDir),
		"--profiling=false",
		"--v=1",
	}
}

// controllerManagerArgs are kube-controller-manager's flags.
func (c *Cluster) controllerManagerArgs() []string {
	return append(c.serverFlags("kube-controller-manager", c.path("pki", "kcm.conf"), "kcm"),
		"--cluster-name="+c.opts.ClusterName,
		"--service-account-private-key-file="+c.path("pki", "sa.key"),
		"--root-ca-file="+c.path("pki", "ca.crt"),
		"--cluster-signing-cert-file="+c.path("pki", "ca.crt"),
		"--cluster-signing-key-file="+c.path("pki", "ca.key"),
		"--use-service-account-credentials=false",
		"--service-cluster-ip-range="+c.opts.ServiceCIDR,
		"--controllers=*",
		"--node-monitor-period=1s",
		"--node-monitor-grace-period="+c.opts.NodeMonitorGracePeriod.String(),
	)
}

// schedulerArgs are kube-scheduler's flags.
func (c *Cluster) schedulerArgs() []string {
	return c.serverFlags("kube-scheduler", c.path("pki", "scheduler.conf"), "scheduler")
}

// waitHTTP polls url until ok accepts the body, failing early if p exits.
func (c *Cluster) waitHTTP(ctx context.Context, p *process, what, url string, ok func(body string) bool) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // loopback probe of our own child
	defer hc.CloseIdleConnections()
	return wait.Until(ctx, wait.Spec{What: what, Timeout: c.opts.ReadyTimeout, Interval: 200 * time.Millisecond, Log: c.log},
		func(ctx context.Context) (bool, string, error) {
			if done, err := p.exited(); done {
				return false, "", err
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return false, "", err
			}
			resp, err := hc.Do(req)
			if err != nil {
				return false, firstLine(err.Error()), nil
			}
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !ok(string(body)) {
				return false, fmt.Sprintf("HTTP %d: %s", resp.StatusCode, firstLine(string(body))), nil
			}
			return true, "", nil
		})
}

// Stop ends every lab process (SIGTERM to its process group, SIGKILL after a
// grace period), waits until each has been reaped and removes the data
// directory if Start created it. It is safe to call more than once.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return c.stopErr
	}
	c.stopped = true
	procs := append([]*process(nil), c.procs...)
	if c.stopMarker != nil {
		c.stopMarker()
	}
	c.mu.Unlock()

	var errs []error
	// Clients first, then the API server, then etcd, so nothing logs a storm
	// of connection errors while the others go down.
	tiers := [][]*process{nil, nil, nil}
	for _, p := range procs {
		switch p.name {
		case "etcd":
			tiers[2] = append(tiers[2], p)
		case "kube-apiserver":
			tiers[1] = append(tiers[1], p)
		default:
			tiers[0] = append(tiers[0], p)
		}
	}
	for _, tier := range tiers {
		var wg sync.WaitGroup
		var emu sync.Mutex
		for _, p := range tier {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := p.stop(stopGrace); err != nil {
					emu.Lock()
					errs = append(errs, err)
					emu.Unlock()
				}
			}()
		}
		wg.Wait()
	}
	if c.sp != nil {
		c.sp.close()
	}
	if c.ownsData && len(errs) == 0 {
		if err := os.RemoveAll(c.dataDir); err != nil {
			errs = append(errs, fmt.Errorf("removing the lab data dir: %w", err))
		}
	}
	c.mu.Lock()
	c.stopErr = errors.Join(errs...)
	c.mu.Unlock()
	if c.stopErr != nil {
		return fmt.Errorf("stopping the lab control plane: %w", c.stopErr)
	}
	c.log.Info().Msg("lab control plane stopped")
	return nil
}

// FluxStoragePort is the port source-controller serves artifacts on (0
// without Flux).
func (c *Cluster) FluxStoragePort() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ports["flux-storage"]
}

// Server returns the API server URL ("https://host:port"); it equals the
// configured endpoint when that is a loopback address.
func (c *Cluster) Server() string { return c.server }

// ClusterName returns the cluster's name.
func (c *Cluster) ClusterName() string { return c.opts.ClusterName }

// Kubeconfig issues a new admin kubeconfig for the lab API server exactly as
// Talos issues one (see IssueKubeconfig).
func (c *Cluster) Kubeconfig() ([]byte, error) {
	return IssueKubeconfig(c.opts.ClusterName, c.server, c.opts.PKI.CACertPEM, c.opts.PKI.CAKeyPEM, AdminCertLifetime)
}

// RESTConfig returns an admin client configuration for the lab API server.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.adminConfig) }

// Client returns an admin clientset for the lab API server.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// AdminKubeconfigPath is a kubeconfig file on disk (inside the data dir) for
// tools that need a path.
func (c *Cluster) AdminKubeconfigPath() string { return c.path("pki", "admin.conf") }

// DataDir returns the lab's data directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// StartupTime is how long Start took until everything was ready.
func (c *Cluster) StartupTime() time.Duration { return c.readyIn }

// NetworkStartTime is the longest a Node took, from when it registered
// (or the control plane was ready, if later), to turn Ready: its CNI agent
// started by the bootstrap manifests and its kubelet reporting the network
// ready (lab time, none of it the runner's); 0 when no node has been
// Ready.
func (c *Cluster) NetworkStartTime() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	cpReady := c.startedAt.Add(c.readyIn)
	var longest time.Duration
	for _, n := range c.nodeSeen {
		if n.ready.IsZero() {
			continue
		}
		from := n.seen
		if cpReady.After(from) {
			from = cpReady
		}
		longest = max(longest, n.ready.Sub(from))
	}
	return longest
}

// nodeTimes is when the lab first saw a Node and when it first saw it
// Ready.
type nodeTimes struct{ seen, ready time.Time }

// recordNodesReady notes, until ctx ends, when each Node is first seen and
// first seen Ready, from a watch (a re-registered Node has a new UID).
func (c *Cluster) recordNodesReady(ctx context.Context) {
	for ctx.Err() == nil {
		w, err := c.client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok {
				continue
			}
			now := time.Now()
			c.mu.Lock()
			if c.nodeSeen == nil {
				c.nodeSeen = map[types.UID]nodeTimes{}
			}
			t, seen := c.nodeSeen[n.UID]
			if !seen {
				t.seen = now
			}
			if t.ready.IsZero() && NodeReady(n) == corev1.ConditionTrue {
				t.ready = now
			}
			c.nodeSeen[n.UID] = t
			c.mu.Unlock()
		}
		w.Stop()
	}
}

// KubernetesVersion is the version the lab's servers report.
func (c *Cluster) KubernetesVersion() string { return c.ServerVersion("kube-apiserver") }

// Processes lists the lab's processes and where each one logs.
func (c *Cluster) Processes() []Process {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Process, 0, len(c.procs))
	for _, p := range c.procs {
		out = append(out, Process{Name: p.name, PID: p.cmd.Process.Pid, LogPath: p.logPath})
	}
	return out
}

// LogTail returns the last lines of every process log, each under a header,
// for printing when a test fails.
func (c *Cluster) LogTail(lines int) string {
	var b strings.Builder
	for _, p := range c.Processes() {
		fmt.Fprintf(&b, "===== %s (pid %d) last %d lines of %s =====\n%s\n", p.Name, p.PID, lines, p.LogPath, tailFile(p.LogPath, lines))
	}
	return b.String()
}

// Healthy reports nil when every lab process is running, etcd is healthy
// and the API server is ready.
func (c *Cluster) Healthy(ctx context.Context) error {
	c.mu.Lock()
	stopped, procs := c.stopped, append([]*process(nil), c.procs...)
	c.mu.Unlock()
	if stopped {
		return errors.New("lab control plane is stopped")
	}
	for _, p := range procs {
		if done, err := p.exited(); done {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.etcdURL+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("etcd health: %w", err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if !strings.Contains(string(body), `"health":"true"`) {
		return fmt.Errorf("etcd unhealthy: %s", firstLine(string(body)))
	}
	out, err := c.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("kube-apiserver /readyz: %w", err)
	}
	if strings.TrimSpace(string(out)) != "ok" {
		return fmt.Errorf("kube-apiserver not ready: %s", firstLine(string(out)))
	}
	return nil
}

// pickPort is FreePort; tests replace it to provoke a taken port.
var pickPort = FreePort

// freePort picks a free port on host for the named server and records it
// in c.ports. FreePort closes its listener before the server binds, so two
// picks in a row can return the same port (seen: source-controller's
// artifact server and its health probe both given one port, the artifact
// server then failing with "address already in use" and Flux never
// getting an artifact): a port this cluster handed out already is picked
// again.
func (c *Cluster) freePort(name, host string) (int, error) {
	for range 20 {
		p, err := pickPort(host)
		if err != nil {
			return 0, err
		}
		if !slices.Contains(slices.Collect(maps.Values(c.ports)), p) {
			c.ports[name] = p
			return p, nil
		}
	}
	return 0, fmt.Errorf("finding a free port on %s for %s: every pick was one the lab uses already", host, name)
}

// FreePort returns a port on host that nothing listens on right now.
func FreePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("finding a free port on %s: %w", host, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func portFree(host string, port int) error {
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("%s:%d is not free: %w", host, port, err)
	}
	return l.Close()
}

// firstServiceIP is the service CIDR's first address, the one the
// "kubernetes" Service gets.
func firstServiceIP(cidr string) net.IP {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return net.IPv4(10, 96, 0, 1)
	}
	ip := append(net.IP(nil), n.IP...)
	ip[len(ip)-1]++
	return ip
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

const (
	tempDirPrefix = "bootstrap-lab-kube-"
	ownerFile     = "owner.pid"
)

// removeStaleDataDirs deletes temporary data dirs left by labs whose program
// was killed before it could clean up (its children die with it, the
// directory does not).
func removeStaleDataDirs(log zerolog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempDirPrefix+"*"))
	for _, d := range dirs {
		data, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil || pid <= 0 {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue
		}
		if err := os.RemoveAll(d); err == nil {
			log.Debug().Str("dir", d).Int("owner", pid).Msg("removed a stale lab data dir")
		}
	}
}

// EtcdSnapshot streams a snapshot of the control plane's etcd through
// etcd's own Maintenance.Snapshot: the database followed by its sha256,
// as `etcdctl snapshot save` writes it.
func (c *Cluster) EtcdSnapshot(ctx context.Context) (io.ReadCloser, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.etcdURL}, DialTimeout: 5 * time.Second, Context: ctx,
		Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("connecting to etcd: %w", err)
	}
	rc, err := cli.Snapshot(ctx)
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("etcd snapshot: %w", err)
	}
	return &closeBoth{ReadCloser: rc, also: cli.Close}, nil
}

// closeBoth closes the stream, then the client it came from.
type closeBoth struct {
	io.ReadCloser
	also func() error
}

func (c *closeBoth) Close() error {
	err := c.ReadCloser.Close()
	if err2 := c.also(); err == nil {
		err = err2
	}
	return err
}

// runServer starts one of the Kubernetes servers at the version
// Options.KubernetesVersions names for it (the pinned one otherwise).
func (c *Cluster) runServer(name string, args []string) (*process, error) {
	want := c.opts.KubernetesVersions[name]
	c.mu.Lock()
	if v, ok := c.versions[name]; ok {
		want = v
	}
	c.mu.Unlock()
	bin, version, err := c.bins.ServerBinary(name, want)
	if err != nil {
		return nil, err
	}
	p, err := c.runPath(name, bin, args)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.versions[name] = version
	c.mu.Unlock()
	c.log.Info().Str("process", name).Str("version", version).Msg("Kubernetes server started")
	return p, nil
}

// ServerVersion is the Kubernetes version a server runs ("v1.36.1").
func (c *Cluster) ServerVersion(name string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.versions[name]
}

// RestartServer stops one of the Kubernetes servers (kube-apiserver,
// kube-controller-manager, kube-scheduler) and starts it again at version,
// on the same etcd data, ports and certificates, as kubelet does when a
// static pod's manifest names a new image; it returns once the server is
// healthy again. A server that already runs version is left alone.
func (c *Cluster) RestartServer(ctx context.Context, name, version string) error {
	_, want, err := c.bins.ServerBinary(name, version)
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return errors.New("the lab control plane is stopped")
	}
	running := c.versions[name]
	var old *process
	kept := c.procs[:0:0]
	for _, p := range c.procs {
		if p.name == name && old == nil {
			old = p
			continue
		}
		kept = append(kept, p)
	}
	if running == want && old != nil {
		c.mu.Unlock()
		return nil
	}
	c.procs = kept
	c.versions[name] = want
	c.mu.Unlock()
	if old != nil {
		if err := old.stop(stopGrace); err != nil {
			return err
		}
	}
	c.log.Info().Str("process", name).Str("from", running).Str("to", want).Msg("restarting a Kubernetes server at a new version")
	switch name {
	case "kube-apiserver":
		return c.startAPIServer(ctx)
	case "kube-controller-manager", "kube-scheduler":
		args, port := c.controllerManagerArgs(), c.ports[name]
		if name == "kube-scheduler" {
			args = c.schedulerArgs()
		}
		p, err := c.runServer(name, args)
		if err != nil {
			return err
		}
		return c.waitHTTP(ctx, p, name+" /healthz", fmt.Sprintf("https://127.0.0.1:%d/healthz", port), func(body string) bool { return strings.TrimSpace(body) == "ok" })
	}
	return fmt.Errorf("%s is not a Kubernetes server the lab runs", name)
}
