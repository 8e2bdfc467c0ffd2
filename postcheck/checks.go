package postcheck

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	talosconfig "github.com/siderolabs/talos/pkg/machinery/client/config"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/homelab/bootstrap/backup"
	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/flux"
	"github.com/homelab/bootstrap/internal/sealed"
	"github.com/homelab/bootstrap/internal/wait"
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
	// returns the newest verified remote copy (its URL and when its
	// snapshot was taken; "" when there is none): the check reports its
	// age and warns when it is older than BackupMaxAge or missing.
	NewestRemote func(ctx context.Context) (string, time.Time, error)
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
	return []check.Check{
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
}

// etcdBackup takes an etcd snapshot (not in a dry run), verifies and keeps
// it, prunes to BackupKeep, and judges the newest one's age. A snapshot
// that cannot be taken while a recent one exists is a warning; no recent
// one at all fails: the cluster has no way back.
func (c *checker) etcdBackup(ctx context.Context) (check.Status, string) {
	if c.o.BackupDir == "" {
		return check.Warnf("no backup directory configured")
	}
	var took string
	var takeErr error
	switch {
	case c.o.DryRun:
		took = "dry run: none taken"
	case c.o.TakeBackup == nil:
		takeErr = errors.New("no talosconfig to reach etcd through")
	default:
		took, takeErr = c.o.TakeBackup(ctx)
	}
	newest, at, err := backup.Newest(c.o.BackupDir)
	if err != nil {
		return check.Failf("reading %s: %v", c.o.BackupDir, err)
	}
	if c.o.Observed != nil && newest != "" {
		c.o.Observed.NewestBackup = at
	}
	age := c.o.now().Sub(at)
	switch {
	case newest == "" && takeErr != nil:
		return check.Failf("no etcd snapshot, and taking one failed: %v", takeErr)
	case newest == "":
		return check.Failf("no etcd snapshot in %s", c.o.BackupDir)
	case c.o.BackupMaxAge > 0 && age > c.o.BackupMaxAge:
		if takeErr != nil {
			return check.Failf("taking a snapshot failed (%v) and the newest, %s, is %s old (limit %s)", takeErr, filepath.Base(newest), age.Round(time.Minute), c.o.BackupMaxAge)
		}
		return check.Failf("the newest etcd snapshot, %s, is %s old (limit %s)", filepath.Base(newest), age.Round(time.Minute), c.o.BackupMaxAge)
	case takeErr != nil && took != "":
		// Taken and kept here; only a later step (the copy) failed.
		return check.Warnf("%s; %v", took, takeErr)
	case takeErr != nil:
		return check.Warnf("taking a snapshot failed: %v; the newest, %s, is %s old", takeErr, filepath.Base(newest), age.Round(time.Minute))
	}
	if c.o.NewestRemote != nil {
		remote, at, err := c.o.NewestRemote(ctx)
		rage := c.o.now().Sub(at)
		switch {
		case err != nil:
			return check.Warnf("%s; the remote copies cannot be listed: %v", took, err)
		case remote == "":
			return check.Warnf("%s; no verified remote copy yet", took)
		case c.o.BackupMaxAge > 0 && rage > c.o.BackupMaxAge:
			return check.Warnf("%s; the newest verified remote copy, %s, is %s old (limit %s)", took, remote, rage.Round(time.Minute), c.o.BackupMaxAge)
		}
		return check.Passf("%s; newest verified remote copy %s, %s old", took, remote, rage.Round(time.Minute))
	}
	return check.Passf("%s", took)
}

type checker struct {
	o Options

	healthOnce sync.Once
	health     talos.HealthReport

	kubeOnce sync.Once
	kube     []byte
	kubeErr  error
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

// talosReport runs the cluster health once for the checks that read it.
func (c *checker) talosReport(ctx context.Context) talos.HealthReport {
	c.healthOnce.Do(func() { c.health = c.o.Talos.Health(ctx) })
	return c.health
}

// healthVerdict passes when every named assertion passed (or was skipped).
func (c *checker) healthVerdict(ctx context.Context, ok string, names ...string) (check.Status, string) {
	if c.o.Talos == nil {
		return check.Warnf("no talosconfig to reach the Talos API with")
	}
	r := c.talosReport(ctx)
	var failing []string
	for _, name := range names {
		h, found := r.Get(name)
		switch {
		case !found:
			failing = append(failing, name+": not checked")
		case !h.OK:
			failing = append(failing, name+": "+h.Detail)
		}
	}
	if len(failing) > 0 {
		return check.Failf("%s", strings.Join(failing, "; "))
	}
	return check.Passf("%s", ok)
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

func (c *checker) apiAnswers(ctx context.Context) (check.Status, string) {
	cs, _, err := c.client()
	if err != nil {
		return check.Failf("%v", err)
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return check.Failf("API at %s does not answer: %v", c.apiHost(), err)
	}
	return check.Passf("API at %s answers; %d node(s) listed", c.apiHost(), len(nodes.Items))
}

func (c *checker) nodesReady(ctx context.Context) (check.Status, string) {
	cs, _, err := c.client()
	if err != nil {
		return check.Failf("%v", err)
	}
	names := make([]string, len(c.o.Nodes))
	for i, n := range c.o.Nodes {
		names[i] = n.Name
	}
	missing, notReady, err := kube.NodeStatus(ctx, cs, names)
	if err != nil {
		return check.Failf("listing nodes: %v", err)
	}
	var problems []string
	if len(missing) > 0 {
		problems = append(problems, "not registered: "+strings.Join(missing, ", "))
	}
	if len(notReady) > 0 {
		problems = append(problems, "NotReady: "+strings.Join(notReady, ", "))
	}
	if len(problems) > 0 {
		return check.Failf("%d/%d Ready; %s", len(names)-len(missing)-len(notReady), len(names), strings.Join(problems, "; "))
	}
	return check.Passf("all %d node(s) Ready", len(names))
}

// IsDefaultClass reports whether a StorageClass claims to be the default.
func IsDefaultClass(sc *storagev1.StorageClass) bool {
	return sc.Annotations["storageclass.kubernetes.io/is-default-class"] == "true" ||
		sc.Annotations["storageclass.beta.kubernetes.io/is-default-class"] == "true"
}

func (c *checker) defaultClass(ctx context.Context) (check.Status, string) {
	cs, _, err := c.client()
	if err != nil {
		return check.Failf("%v", err)
	}
	list, err := cs.StorageV1().StorageClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return check.Failf("listing StorageClasses: %v", err)
	}
	var defaults []string
	found := false
	for i := range list.Items {
		sc := &list.Items[i]
		if sc.Name == c.o.StorageClass {
			found = true
		}
		if IsDefaultClass(sc) {
			defaults = append(defaults, sc.Name)
		}
	}
	sort.Strings(defaults)
	switch {
	case !found:
		return check.Failf("StorageClass %s does not exist", c.o.StorageClass)
	case len(defaults) == 0:
		return check.Failf("no default StorageClass: %s lacks the is-default-class annotation", c.o.StorageClass)
	case len(defaults) > 1:
		return check.Failf("%d default StorageClasses (%s): only %s may be default", len(defaults), strings.Join(defaults, ", "), c.o.StorageClass)
	case defaults[0] != c.o.StorageClass:
		return check.Failf("the default StorageClass is %s, not %s", defaults[0], c.o.StorageClass)
	}
	return check.Passf("%s is the only default StorageClass", c.o.StorageClass)
}

func (c *checker) flux(ctx context.Context) (check.Status, string) {
	_, dyn, err := c.client()
	if err != nil {
		return check.Failf("%v", err)
	}
	var parts []string
	ok := true
	for _, k := range []struct {
		kind string
		gvr  schema.GroupVersionResource
	}{{"GitRepository", flux.GitRepositoryGVR}, {"Kustomization", flux.KustomizationGVR}} {
		u, err := dyn.Resource(k.gvr).Namespace(c.o.FluxNamespace).Get(ctx, c.o.FluxName, metav1.GetOptions{})
		if err != nil {
			ok = false
			if apierrors.IsNotFound(err) {
				parts = append(parts, fmt.Sprintf("%s %s/%s not found", k.kind, c.o.FluxNamespace, c.o.FluxName))
			} else {
				parts = append(parts, fmt.Sprintf("%s: %v", k.kind, err))
			}
			continue
		}
		r := flux.ReadinessOf(u)
		ok = ok && r.Ready
		if r.Ready {
			parts = append(parts, fmt.Sprintf("%s Ready (revision %s)", k.kind, r.Revision))
		} else {
			parts = append(parts, fmt.Sprintf("%s not Ready (%s)", k.kind, r.Detail))
		}
	}
	if !ok {
		return check.Failf("%s", strings.Join(parts, "; "))
	}
	return check.Passf("%s", strings.Join(parts, "; "))
}

// fluxObjects judges every Kustomization and HelmRelease in the cluster by
// the condition the flux stage waits on (flux.AllReady): what the user's
// repository declares is applied, not only the sync pair.
func (c *checker) fluxObjects(ctx context.Context) (check.Status, string) {
	_, dyn, err := c.client()
	if err != nil {
		return check.Failf("%v", err)
	}
	objs, err := flux.Objects(ctx, dyn)
	if err != nil {
		return check.Failf("%v", err)
	}
	if c.o.Observed != nil {
		c.o.Observed.FluxObjects = objs
	}
	ready, status := flux.AllReady(objs)
	switch {
	case len(objs) == 0:
		return check.Failf("no Kustomization or HelmRelease in the cluster (is Flux installed?)")
	case !ready:
		return check.Failf("%s", status)
	}
	for _, o := range objs {
		if o.Suspended {
			return check.Warnf("%s", status)
		}
	}
	return check.Passf("%s", status)
}

// nfsProvisioning creates a uniquely named PVC on the default class, waits
// for it to bind, and always deletes it and waits for its volume to go,
// also when the check fails or the run is interrupted.
func (c *checker) nfsProvisioning(ctx context.Context) (check.Status, string) {
	if c.o.DryRun {
		return check.Warnf("not run in a dry run: it would create a test PVC in %s on the default StorageClass", c.o.PVCNamespace)
	}
	cs, _, err := c.client()
	if err != nil {
		return check.Failf("%v", err)
	}
	pvcs := cs.CoreV1().PersistentVolumeClaims(c.o.PVCNamespace)
	// Leftovers of a killed postcheck go first.
	if old, err := pvcs.List(ctx, metav1.ListOptions{LabelSelector: TestPVCLabel + "=true"}); err == nil {
		for _, p := range old.Items {
			c.o.Log.Info().Str("pvc", p.Name).Msg("removing a test PVC left by an earlier postcheck")
			_ = pvcs.Delete(ctx, p.Name, metav1.DeleteOptions{})
		}
	}
	name := "postcheck-" + c.o.now().UTC().Format("20060102-150405") + "-" + randHex(3)
	class := c.o.StorageClass
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{TestPVCLabel: "true"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			// The class is named: whether it is the default is the
			// default-storageclass check's business, so each criterion
			// fails on its own.
			StorageClassName: &class,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}},
		},
	}
	if _, err := pvcs.Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		return check.Failf("creating test PVC %s/%s: %v", c.o.PVCNamespace, name, err)
	}
	var volume string
	defer func() {
		// Clean up even when ctx was cancelled (Ctrl-C, postcheck timeout).
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.o.PVCTimeout+30*time.Second)
		defer cancel()
		if err := c.deletePVC(cctx, cs, name, volume); err != nil {
			c.o.Log.Error().Err(err).Str("pvc", name).Msg("test PVC cleanup incomplete")
		}
	}()
	start := c.o.now()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wake := kube.Wake(wctx, func(ctx context.Context) (watch.Interface, error) {
		return pvcs.Watch(ctx, kube.Named(name))
	})
	err = wait.Until(ctx, wait.Spec{What: fmt.Sprintf("test PVC %s/%s Bound", c.o.PVCNamespace, name), Timeout: c.o.PVCTimeout, Interval: pvcPoll, MaxInterval: pvcPollMax, Log: c.o.Log, Wake: wake},
		func(ctx context.Context) (bool, string, error) {
			p, err := pvcs.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			volume = p.Spec.VolumeName
			return p.Status.Phase == corev1.ClaimBound, "phase " + string(p.Status.Phase) + c.pvcEvents(ctx, cs, name), nil
		})
	if err != nil {
		return check.Failf("%v", err)
	}
	return check.Passf("test PVC %s bound to %s via %s in %s", name, volume, class, wait.Round(c.o.now().Sub(start)))
}

// The test PVC's waits start polling quickly and back off: the nightly
// postcheck pays for the bind and the volume's removal, not for the
// spacing of the polls (a provisioner that takes seconds is asked a few
// times a second at first, then once a second).
const (
	pvcPoll    = 50 * time.Millisecond
	pvcPollMax = time.Second
)

// pvcEvents quotes the newest event about the PVC, which is usually why it
// is still Pending.
func (c *checker) pvcEvents(ctx context.Context, cs kubernetes.Interface, name string) string {
	ev, err := cs.CoreV1().Events(c.o.PVCNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil || len(ev.Items) == 0 {
		return ""
	}
	sort.Slice(ev.Items, func(i, j int) bool { return ev.Items[i].LastTimestamp.Before(&ev.Items[j].LastTimestamp) })
	last := ev.Items[len(ev.Items)-1]
	return fmt.Sprintf(" (%s: %s)", last.Reason, strings.TrimSpace(last.Message))
}

func (c *checker) deletePVC(ctx context.Context, cs kubernetes.Interface, name, volume string) error {
	err := cs.CoreV1().PersistentVolumeClaims(c.o.PVCNamespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wake <-chan struct{}
	if volume != "" {
		wake = kube.Wake(wctx, func(ctx context.Context) (watch.Interface, error) {
			return cs.CoreV1().PersistentVolumes().Watch(ctx, kube.Named(volume))
		})
	}
	return wait.Until(ctx, wait.Spec{What: fmt.Sprintf("test PVC %s and its volume deleted", name), Timeout: c.o.PVCTimeout, Interval: pvcPoll, MaxInterval: pvcPollMax, Log: c.o.Log, Wake: wake},
		func(ctx context.Context) (bool, string, error) {
			if _, err := cs.CoreV1().PersistentVolumeClaims(c.o.PVCNamespace).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, "PVC still present", nil
			}
			if volume == "" {
				return true, "", nil
			}
			if _, err := cs.CoreV1().PersistentVolumes().Get(ctx, volume, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, "PV " + volume + " still present", nil
			}
			return true, "", nil
		})
}

func (c *checker) etcd(ctx context.Context) (check.Status, string) {
	cps := 0
	for _, n := range c.o.Nodes {
		if n.Role == "controlplane" {
			cps++
		}
	}
	return c.healthVerdict(ctx, fmt.Sprintf("etcd healthy with %d member(s), one per control plane, the same on every control plane", cps),
		talos.HealthEtcdHealthy, talos.HealthEtcdConsistent, talos.HealthEtcdControlPlanes)
}

func (c *checker) talosAPI(ctx context.Context) (check.Status, string) {
	return c.healthVerdict(ctx, fmt.Sprintf("Talos API answers on all %d node(s)", len(c.o.Nodes)), talos.HealthApidReady)
}

// talosHealth is the rest of `talosctl health`: Talos' memory and disk
// minimums, no diagnostics, boot sequences, kubelets, static pods,
// registration, kube-proxy and CoreDNS where deployed.
func (c *checker) talosHealth(ctx context.Context) (check.Status, string) {
	return c.healthVerdict(ctx, "every node has Talos' minimum memory and disk, no diagnostics, finished its boot sequence and is the config's; kubelet, control-plane static pods and components, kube-proxy and CoreDNS (where deployed) ready",
		talos.HealthMemorySizes, talos.HealthDiskSizes, talos.HealthNoDiagnostics,
		talos.HealthKubeletHealthy, talos.HealthBootFinished, talos.HealthK8sNodesReported, talos.HealthStaticPods, talos.HealthControlPlaneReady,
		talos.HealthKubeProxyReady, talos.HealthCoreDNSReady, talos.HealthK8sNodesSchedulable)
}

// talosVersion warns when a node runs another Talos than the config names.
func (c *checker) talosVersion(ctx context.Context) (check.Status, string) {
	if c.o.Talos == nil {
		return check.Warnf("no talosconfig to reach the Talos API with")
	}
	versions, err := c.o.Talos.Versions(ctx)
	if err != nil {
		return check.Warnf("reading node versions: %v", err)
	}
	if c.o.Observed != nil {
		c.o.Observed.TalosVersions = versions
	}
	var drift []string
	for _, n := range c.o.Nodes {
		if v := versions[n.Name]; v != "" && v != c.o.TalosVersion {
			drift = append(drift, fmt.Sprintf("%s runs %s", n.Name, v))
		}
	}
	sort.Strings(drift)
	if len(drift) > 0 {
		return check.Warnf("the config says %s but %s: run the talos stage to upgrade them, or set cluster.talosVersion to what runs", c.o.TalosVersion, strings.Join(drift, ", "))
	}
	return check.Passf("every node runs Talos %s", c.o.TalosVersion)
}

// kubernetesVersion warns when the API server or a kubelet runs another
// Kubernetes than the config names: someone moved it outside the tool, or
// an upgrade stopped half way.
func (c *checker) kubernetesVersion(ctx context.Context) (check.Status, string) {
	cs, _, err := c.client()
	if err != nil {
		return check.Warnf("%v", err)
	}
	want := strings.TrimPrefix(c.o.KubernetesVersion, "v")
	sv, err := cs.Discovery().ServerVersion()
	if err != nil {
		return check.Warnf("reading the API server version: %v", kube.Classify(err))
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return check.Warnf("listing nodes: %v", kube.Classify(err))
	}
	api := strings.TrimPrefix(sv.GitVersion, "v")
	kubelets := map[string]string{}
	for _, n := range nodes.Items {
		kubelets[n.Name] = strings.TrimPrefix(n.Status.NodeInfo.KubeletVersion, "v")
	}
	if c.o.Observed != nil {
		c.o.Observed.KubeletVersions, c.o.Observed.APIServerVersion = kubelets, api
	}
	var drift []string
	if api != want {
		drift = append(drift, "the API server runs "+api)
	}
	for _, n := range c.o.Nodes {
		if v, ok := kubelets[n.Name]; ok && v != want {
			drift = append(drift, fmt.Sprintf("%s's kubelet runs %s", n.Name, v))
		}
	}
	if len(drift) > 0 {
		return check.Warnf("the config says %s but %s: run the talos stage to upgrade them, or set cluster.kubernetesVersion to what runs", want, strings.Join(drift, ", "))
	}
	return check.Passf("the API server and every kubelet run Kubernetes %s", want)
}

// certs warns when the client certificates in the talosconfig and the
// kubeconfig expire within CertWarnDays (Talos issues them for one year),
// and fails once one expired; either names the command that renews both:
// the talos stage replaces each within its last 30 days (talos.RenewBefore).
func (c *checker) certs(ctx context.Context) (check.Status, string) {
	type cert struct {
		what string
		exp  time.Time
	}
	var certs []cert
	var problems []string
	if exp, err := c.kubeconfigCertExpiry(); err != nil {
		problems = append(problems, "kubeconfig: "+err.Error())
	} else {
		certs = append(certs, cert{"kubeconfig admin cert", exp})
	}
	if c.o.TalosconfigPath != "" {
		if exp, err := c.talosconfigCertExpiry(); err != nil {
			problems = append(problems, "talosconfig: "+err.Error())
		} else {
			certs = append(certs, cert{"talosconfig client cert", exp})
		}
	}
	now := c.o.now()
	limit := now.Add(time.Duration(c.o.CertWarnDays) * 24 * time.Hour)
	var soon, expired, fine []string
	for _, ct := range certs {
		s := fmt.Sprintf("%s expires %s", ct.what, ct.exp.UTC().Format("2006-01-02"))
		switch {
		case ct.exp.Before(now):
			expired = append(expired, s)
		case ct.exp.Before(limit):
			soon = append(soon, fmt.Sprintf("%s (in %d days)", s, int(ct.exp.Sub(now).Hours()/24)))
		default:
			fine = append(fine, s)
		}
	}
	renew := ": run `bootstrap run --stage talos` to renew them (it renews a client certificate in its last 30 days)"
	switch {
	case len(expired) > 0:
		return check.Failf("expired: %s%s", strings.Join(expired, "; "), renew)
	case len(soon) > 0:
		return check.Warnf("%s%s", strings.Join(append(soon, problems...), "; "), renew)
	case len(problems) > 0:
		return check.Warnf("%s", strings.Join(problems, "; "))
	}
	return check.Passf("%s", strings.Join(fine, "; "))
}

func (c *checker) vms(ctx context.Context) (check.Status, string) {
	if c.o.Proxmox == nil {
		return check.Warnf("Proxmox not checked (no API token available to this run)")
	}
	st, err := c.o.Proxmox.VMs(ctx)
	if err != nil {
		return check.Warnf("could not list the cluster's VMs: %v", err)
	}
	if len(st.NotRunning) > 0 {
		return check.Warnf("VMs not running: %s", strings.Join(st.NotRunning, ", "))
	}
	if len(c.o.Hosts) <= 1 {
		return check.Passf("all of the cluster's VMs are running")
	}
	// Several members: where each VM runs, and control planes that would
	// go down together with one host.
	var where []string
	cps := map[string][]string{}
	for _, n := range c.o.Nodes {
		h := st.Hosts[n.Name]
		where = append(where, n.Name+" on "+h)
		if n.Role == "controlplane" && h != "" {
			cps[h] = append(cps[h], n.Name)
		}
	}
	var shared []string
	together := 0 // the control planes on the first host that has several
	for _, h := range c.o.Hosts {
		if len(cps[h]) > 1 {
			shared = append(shared, fmt.Sprintf("%s share %s", strings.Join(cps[h], " and "), h))
			if together == 0 {
				together = len(cps[h])
			}
		}
	}
	if len(shared) > 0 {
		return check.Warnf("all running (%s), but control planes %s: that host going down takes %d etcd members with it (migrate one to another member)", strings.Join(where, ", "), strings.Join(shared, "; "), together)
	}
	return check.Passf("all of the cluster's VMs are running: %s", strings.Join(where, ", "))
}

// extensions fails when a node does not run every extension of the
// schematic, or runs another schematic: what the ISO and the installer
// were built with is what must be loaded (a node left on an old image
// after an interrupted rollout shows here; the talos stage upgrades it).
func (c *checker) extensions(ctx context.Context) (check.Status, string) {
	if c.o.Talos == nil {
		return check.Warnf("no talosconfig to reach the Talos API with")
	}
	got, err := c.o.Talos.Extensions(ctx)
	if c.o.Observed != nil {
		c.o.Observed.Extensions = got
	}
	if err != nil {
		return check.Failf("reading the nodes' extensions: %v", err)
	}
	var bad []string
	for _, n := range c.o.Nodes {
		have := map[string]string{}
		for _, e := range got[n.Name] {
			have[e.Name] = e.Version
		}
		var missing []string
		for _, want := range c.o.Extensions {
			if _, ok := have[want]; !ok {
				missing = append(missing, want)
			}
		}
		if len(missing) > 0 {
			bad = append(bad, fmt.Sprintf("%s lacks %s", n.Name, strings.Join(missing, ", ")))
		}
		if have := talos.SchematicOf(got[n.Name]); c.o.Schematic != "" && have != c.o.Schematic {
			same, err := false, error(nil)
			if c.o.SameSchematic != nil && have != "" {
				same, err = c.o.SameSchematic(ctx, have)
			}
			switch {
			case err != nil:
				bad = append(bad, fmt.Sprintf("%s runs schematic %.12s, not %.12s (%v)", n.Name, have, c.o.Schematic, err))
			case !same:
				bad = append(bad, fmt.Sprintf("%s runs schematic %q, not %.12s", n.Name, have, c.o.Schematic))
			}
		}
	}
	if len(bad) > 0 {
		return check.Failf("%s: run the talos stage (it upgrades nodes to the schematic's installer)", strings.Join(bad, "; "))
	}
	if len(c.o.Extensions) == 0 {
		return check.Passf("no system extensions wanted")
	}
	return check.Passf("every node runs %s", strings.Join(c.o.Extensions, ", "))
}

// guestAgents warns when a VM's QEMU guest agent does not answer though
// the VM has agent: 1 and its image runs the agent: Proxmox then shows no
// addresses and a shutdown waits for a timeout before it falls back to ACPI.
func (c *checker) guestAgents(ctx context.Context) (check.Status, string) {
	if !c.o.GuestAgent {
		return check.Passf("not expected: the installed image has no siderolabs/qemu-guest-agent (VMs run with agent: 0)")
	}
	if c.o.Proxmox == nil {
		return check.Warnf("Proxmox not checked (no API token available to this run)")
	}
	res, err := c.o.Proxmox.GuestAgents(ctx)
	if err != nil {
		return check.Warnf("could not ask Proxmox: %v", err)
	}
	var silent []string
	for _, n := range c.o.Nodes {
		if err, ok := res[n.Name]; ok && err != nil {
			silent = append(silent, fmt.Sprintf("%s (%v)", n.Name, err))
		}
	}
	if len(silent) > 0 {
		return check.Warnf("guest agent not answering: %s", strings.Join(silent, ", "))
	}
	return check.Passf("the guest agent answers in all %d VMs", len(c.o.Nodes))
}

func (c *checker) kubeconfigCertExpiry() (time.Time, error) {
	data, err := c.kubeconfig()
	if err != nil {
		return time.Time{}, err
	}
	return talos.KubeconfigCertExpiry(data)
}

func (c *checker) talosconfigCertExpiry() (time.Time, error) {
	data, err := c.o.Files.Read(c.o.TalosconfigPath)
	if err != nil {
		return time.Time{}, err
	}
	cfg, err := talosconfig.FromBytes(data)
	if err != nil {
		return time.Time{}, err
	}
	ctx, ok := cfg.Contexts[cfg.Context]
	if !ok {
		return time.Time{}, fmt.Errorf("no current context")
	}
	pemBytes, err := base64.StdEncoding.DecodeString(ctx.Crt)
	if err != nil {
		return time.Time{}, fmt.Errorf("client cert: %w", err)
	}
	return talos.CertExpiry(pemBytes)
}

func (c *checker) apiHost() string {
	data, err := c.kubeconfig()
	if err != nil {
		return "?"
	}
	cfg, err := clientcmd.Load(data)
	if err != nil {
		return "?"
	}
	if ctx, ok := cfg.Contexts[cfg.CurrentContext]; ok {
		if cl, ok := cfg.Clusters[ctx.Cluster]; ok {
			return cl.Server
		}
	}
	return "?"
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
