package postcheck

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/flux"
	"github.com/homelab/bootstrap/internal/sealed"
	"github.com/homelab/bootstrap/kube"
	"github.com/homelab/bootstrap/talos"
)

// Names of the checks, stable across releases (dashboards key on them).
const (
	CheckKubeconfig   = "kubeconfig"
	CheckNodesReady   = "nodes-ready"
	CheckDefaultClass = "default-storageclass"
	CheckFlux         = "flux-ready"
	CheckFluxObjects  = "flux-objects"
	CheckNFS          = "nfs-provisioning"
	CheckEtcd         = "talos-etcd"
	CheckTalosAPI     = "talos-api"
	CheckTalosHealth  = "talos-health"
	CheckTalosVersion = "talos-version"
	CheckKubeVersion  = "kubernetes-version"
	CheckCerts        = "cert-expiry"
	CheckVMs          = "proxmox-vms"
	CheckEtcdBackup   = "etcd-backup"
	CheckExtensions   = "talos-extensions"
	CheckGuestAgent   = "guest-agent"
)

// TestPVCLabel marks the PVCs postcheck creates, so leftovers of a killed
// run are recognised and removed.
const TestPVCLabel = "bootstrap.homelab/postcheck"

// TalosProbe is what the Talos checks need from the Talos API.
type TalosProbe interface {
	// Health judges the cluster as `talosctl health` does: the same
	// condition the talos stage waits on (talos.Ops.Health).
	Health(ctx context.Context) talos.HealthReport
	// Versions reports the Talos version each node runs, by node name.
	Versions(ctx context.Context) (map[string]string, error)
	// Extensions reports the system extensions each node runs, by node
	// name (ExtensionStatus).
	Extensions(ctx context.Context) (map[string][]talos.Extension, error)
}

// VMProbe asks Proxmox about the cluster's VMs.
type VMProbe interface {
	// VMs reports the cluster's VMs: those not running, and the Proxmox
	// member each node's VM runs on.
	VMs(ctx context.Context) (VMState, error)
	// GuestAgents pings each node's QEMU guest agent through Proxmox: a
	// nil error by node name is an answer.
	GuestAgents(ctx context.Context) (map[string]error, error)
}

// VMState is what VMProbe.VMs saw.
type VMState struct {
	// NotRunning describes each VM that is not running, or missing.
	NotRunning []string
	// Hosts is the member each node's VM runs on, by node name.
	Hosts map[string]string
	// Down is the state of each node's VM that is not running ("stopped",
	// "paused", "missing"), by node name.
	Down map[string]string
}

// Node is a node the config expects.
type Node struct {
	Name string
	Role string
}

// Observed is what the checks saw, beyond their verdicts.
type Observed struct {
	// TalosVersions is the version each node reported, by node name.
	TalosVersions map[string]string
	// KubeletVersions is the kubelet version each Node reports, by node
	// name, and APIServerVersion what the API server answers (both
	// without a leading "v").
	KubeletVersions  map[string]string
	APIServerVersion string
	// NewestBackup is when the newest kept etcd snapshot was taken.
	NewestBackup time.Time
	// FluxObjects is every Kustomization and HelmRelease and its readiness.
	FluxObjects []flux.Object
	// Extensions are the system extensions each node runs, by node name.
	Extensions map[string][]talos.Extension
	// Causes are what a check saw that names why it did not pass, by
	// check name: the row's next says it first (NextSeen).
	Causes map[string]Cause
}

// Cause is what a check that did not pass saw to be the reason, said as
// the first thing to do next.
type Cause struct {
	// Seen names the observed cause and what to do about it.
	Seen string
	// Instead: the check's usual next does not apply (a node's VM is
	// stopped: no upgrade helps), so Seen is the whole next.
	Instead bool
}

// Options configure the checks.
type Options struct {
	Cluster         string
	KubeconfigPath  string
	TalosconfigPath string
	// Files reads both as kept: age-encrypted beside an encrypted secrets
	// bundle (opened in memory), else plaintext; nil reads plaintext.
	Files         *sealed.Files
	Nodes         []Node
	StorageClass  string
	PVCNamespace  string
	PVCTimeout    time.Duration
	FluxNamespace string
	FluxName      string
	CertWarnDays  int
	// BackupDir holds the etcd snapshots (ai/state/<cluster>/etcd). The
	// check takes one with TakeBackup (not in a dry run; it verifies,
	// keeps, copies and prunes, and says what it did) and wants the newest
	// younger than BackupMaxAge.
	BackupDir    string
	BackupMaxAge time.Duration
	TakeBackup   func(ctx context.Context) (string, error)
	// NewestRemote, when backups are copied off the host (backup.s3),
	// returns the newest verified remote copy (URL "" when there is none):
	// the check reports the copy's age and warns when it is older than
	// BackupMaxAge or missing. What it logs as a warning (a copy named
	// after now) the row carries through WithWarnings.
	NewestRemote func(ctx context.Context) (RemoteCopies, error)
	// TalosVersion is the version the config names; nodes that run another
	// are reported (a warning: the talos stage upgrades them).
	TalosVersion string
	// KubernetesVersion is the version the config names; an API server or
	// kubelet at another is reported (a warning: the talos stage moves
	// them).
	KubernetesVersion string
	// Extensions are the manifest names of the system extensions every
	// node must run, and Schematic the Image Factory schematic ID it must
	// run them from ("" when the installer is not derived from one).
	Extensions []string
	Schematic  string
	// SameSchematic, when set, says whether a node's other schematic ID
	// carries the same image (the extensions in another order): such a
	// node is not asked to roll.
	SameSchematic func(ctx context.Context, id string) (bool, error)
	// GuestAgent: the VMs have agent: 1 and their image runs the agent,
	// so it must answer (a warning when not).
	GuestAgent bool
	// Observed, when set, receives what the checks saw beyond their
	// verdicts (the Talos versions), for the report and its metrics. It is
	// complete once the checks have run.
	Observed *Observed
	// Security is what the config asks of each node's boot and volumes,
	// by node name; CheckSecurity runs when one asks for anything.
	Security map[string]SecurityWant
	// Talos and Proxmox are optional; a nil probe makes its checks warn.
	Talos   TalosProbe
	Proxmox VMProbe
	// Hosts are the Proxmox members the VMs are spread over
	// (proxmox.hosts): with more than one, the VM row says where each runs
	// and warns when control planes share one.
	Hosts []string
	Now   func() time.Time
	Log   zerolog.Logger
	// DryRun skips the test PVC: a dry run changes nothing, not even that.
	DryRun bool
	// UserVolumes are the Talos user volumes of each node (by name) that
	// CheckUserVolumes waits for, up to UserVolumeWait (default 90s).
	UserVolumes    map[string][]talos.UserVolume
	UserVolumeWait time.Duration
}

func (o Options) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

// Checks returns the exit criteria as checks. They all run; none depends on
// another having passed.
func Checks(o Options) []check.Check {
	c := &checker{o: o}
	checks := []check.Check{
		{Name: CheckKubeconfig, Run: c.apiAnswers},
		{Name: CheckNodesReady, Run: c.nodesReady},
		{Name: CheckDefaultClass, Run: c.defaultClass},
		{Name: CheckFlux, Run: c.flux},
		{Name: CheckFluxObjects, Run: c.fluxObjects},
		{Name: CheckNFS, Run: c.nfsProvisioning},
		{Name: CheckEtcd, Run: c.etcd},
		{Name: CheckTalosAPI, Run: c.talosAPI},
		{Name: CheckTalosHealth, Run: c.talosHealth},
		{Name: CheckTalosVersion, Run: c.talosVersion},
		{Name: CheckKubeVersion, Run: c.kubernetesVersion},
		{Name: CheckCerts, Run: c.certs},
		{Name: CheckVMs, Run: c.vms},
		{Name: CheckEtcdBackup, Run: c.etcdBackup},
		{Name: CheckExtensions, Run: c.extensions},
		{Name: CheckGuestAgent, Run: c.guestAgents},
	}
	if len(o.UserVolumes) > 0 {
		checks = append(checks, check.Check{Name: CheckUserVolumes, Run: c.userVolumes})
	}
	return append(checks, securityCheck(o)...)
}

type checker struct {
	o Options

	healthOnce sync.Once
	health     talos.HealthReport

	kubeOnce sync.Once
	kube     []byte
	kubeErr  error

	// mu guards causes (checks run side by side).
	mu     sync.Mutex
	causes map[string]Cause

	// vmOnce reads the VMs once for the rows that look at them.
	vmOnce sync.Once
	vmSt   VMState
	vmErr  error

	// dyn, when set, is the dynamic client the Flux rows use instead of
	// one from the kubeconfig (tests).
	dyn dynamic.Interface
}

// log is the checks' logger, its lines tagged with the check ctx runs
// for (check.Name): a warning it logs lands on that check's row
// (WithWarnings).
func (c *checker) log(ctx context.Context) zerolog.Logger {
	if name := check.Name(ctx); name != "" {
		return c.o.Log.With().Str("check", name).Logger()
	}
	return c.o.Log
}

// saw records the cause a check observed (Observed.Causes).
func (c *checker) saw(name string, cause Cause) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.causes == nil {
		c.causes = map[string]Cause{}
	}
	c.causes[name] = cause
	if c.o.Observed != nil {
		c.o.Observed.Causes = maps.Clone(c.causes)
	}
}

// vmState is Proxmox's view of the VMs, asked once for every row that
// reads it (the VM row, and the rows a stopped VM explains).
func (c *checker) vmState(ctx context.Context) (VMState, error) {
	c.vmOnce.Do(func() { c.vmSt, c.vmErr = c.o.Proxmox.VMs(ctx) })
	return c.vmSt, c.vmErr
}

// dynamic is the client the Flux rows read objects with.
func (c *checker) dynamic() (dynamic.Interface, error) {
	if c.dyn != nil {
		return c.dyn, nil
	}
	_, dyn, err := c.client()
	return dyn, err
}

// kubeconfig reads the kubeconfig once for every check.
func (c *checker) kubeconfig() ([]byte, error) {
	c.kubeOnce.Do(func() {
		c.kube, c.kubeErr = c.o.Files.Read(c.o.KubeconfigPath)
		if errors.Is(c.kubeErr, fs.ErrNotExist) {
			c.kubeErr = fmt.Errorf("kubeconfig %s: %w", c.o.Files.Path(c.o.KubeconfigPath), fs.ErrNotExist)
		}
	})
	return c.kube, c.kubeErr
}

func (c *checker) client() (*kubernetes.Clientset, dynamic.Interface, error) {
	data, err := c.kubeconfig()
	if err != nil {
		return nil, nil, err
	}
	cs, cfg, err := kube.ClientsetFrom(data, c.o.KubeconfigPath)
	if err != nil {
		return nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	return cs, dyn, err
}

// RemoteCopies is what the etcd-backup row reads of the bucket.
type RemoteCopies struct {
	// URL and Taken name the newest verified copy ("" without one).
	URL   string
	Taken time.Time
}
