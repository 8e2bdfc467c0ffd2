// Package lab is a homelab without hardware: it composes the Proxmox and
// Talos simulators, a real Kubernetes control plane and the local services
// (NFS, chart repository, Flux manifests, git) so that `bootstrap run` can
// be rehearsed, tested and benchmarked on one machine.
package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/fluxcd/cli-utils/pkg/object"
	"github.com/rs/zerolog"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/talossim"
)

// ControlPlane is the Kubernetes side of simulated Talos nodes: the
// simulator's Bootstrap on the first control plane starts a real control
// plane (lab/kube) whose CAs and endpoint come from that node's machine
// config, as Talos would; nodes that reach configured mode register as Node
// objects that kwok keeps Ready. It implements talossim.Cluster.
type ControlPlane struct {
	// Options are applied over what the machine config says (BinDir, Log,
	// Flux…); the identity fields come from the config.
	opts kube.Options
	log  zerolog.Logger

	mu      sync.Mutex
	cluster *kube.Cluster
	pending []talossim.NodeInfo
	failed  error
	// started is closed once Bootstrap (or Recover) succeeded or failed;
	// lost once that control plane lost its etcd data. EtcdLost replaces
	// both for the next one.
	started       chan struct{}
	startedClosed bool
	lost          chan struct{}
	// fluxStoragePort is kept from the first control plane for the next.
	fluxStoragePort int
	// mirrors is each control plane's latest static pod report, by
	// hostname: applied when it comes and again when the node registers
	// (kubelet creates mirror pods once its Node exists).
	mirrors   map[string]mirrorReport
	mirrorsMu sync.Mutex
	// mirrorSyncs serialises each node's syncs, so the API ends at its
	// latest report; nodes sync beside each other, as their kubelets do.
	mirrorSyncs map[string]*sync.Mutex
	// mirrorShown is how long the report that was shown last took from
	// its report to its mirror pods in the API (lab time: see
	// MirrorSyncTime); mirrorShownAt when that was.
	mirrorShown   time.Duration
	mirrorShownAt time.Time

	// snapshotFault, when set, is what etcd answers a snapshot with
	// (FailEtcdSnapshots).
	snapshotFault error
}

type mirrorReport struct {
	seq  uint64
	pods []talossim.StaticPod
}

var (
	_ talossim.Cluster           = (*ControlPlane)(nil)
	_ talossim.EtcdRecoverer     = (*ControlPlane)(nil)
	_ talossim.EtcdLoser         = (*ControlPlane)(nil)
	_ talossim.KubernetesUpdater = (*ControlPlane)(nil)
	_ talossim.MirrorPodSyncer   = (*ControlPlane)(nil)
)

// NewControlPlane returns a control plane that starts on Bootstrap. base
// carries the lab settings (binaries, logging, whether Flux runs).
func NewControlPlane(base kube.Options) *ControlPlane {
	// Talos nodes wait for their CNI as real ones do.
	base.NetworkGate = true
	return &ControlPlane{opts: base, log: base.Log, started: make(chan struct{}), lost: make(chan struct{})}
}

// Bootstrap starts the control plane from the bootstrap node's config.
func (c *ControlPlane) Bootstrap(ctx context.Context, machineConfig []byte) error {
	return c.start(ctx, machineConfig, func(*kube.Options) {})
}

// Recover starts the control plane from the bootstrap node's config on an
// etcd restored from snapshot by etcd's own restore.
func (c *ControlPlane) Recover(ctx context.Context, machineConfig, snapshot []byte, skipHashCheck bool) error {
	f, err := os.CreateTemp("", "lab-etcd-recovery-*.snapshot")
	if err != nil {
		return c.fail(err)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(snapshot)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return c.fail(fmt.Errorf("writing the recovery snapshot: %w", err))
	}
	return c.start(ctx, machineConfig, func(o *kube.Options) {
		o.RestoreSnapshot, o.RestoreSkipHashCheck = f.Name(), skipHashCheck
	})
}

func (c *ControlPlane) start(ctx context.Context, machineConfig []byte, with func(*kube.Options)) error {
	cfg, err := configloader.NewFromBytes(machineConfig)
	if err != nil {
		return c.fail(fmt.Errorf("reading the bootstrap node's machine config: %w", err))
	}
	id, err := kube.OptionsFromMachineConfig(cfg)
	if err != nil {
		return c.fail(err)
	}
	o := c.opts
	o.ClusterName, o.Endpoint, o.CertSANs, o.PKI, o.ScheduleOnControlPlanes = id.ClusterName, id.Endpoint, id.CertSANs, id.PKI, id.ScheduleOnControlPlanes
	o.Encryption = id.Encryption
	if id.ServiceCIDR != "" {
		o.ServiceCIDR = id.ServiceCIDR
	}
	// The servers start at the versions the bootstrap node's static pods
	// name, as its kubelet would run them.
	o.KubernetesVersions = map[string]string{}
	for name, image := range talossim.StaticPodImages(cfg) {
		if v := talossim.ImageTag(image); v != "" {
			o.KubernetesVersions[name] = v
		}
	}
	with(&o)
	c.mu.Lock()
	o.FluxStoragePort = c.fluxStoragePort
	c.mu.Unlock()
	// The nodes configured so far register before Flux starts (see
	// kube.Options.ControllersStarted); they stay pending until the start
	// succeeds, as a retried start begins on an empty etcd.
	var early map[string]bool
	o.ControllersStarted = func(ctx context.Context, kc *kube.Cluster) error {
		c.mu.Lock()
		pending := append([]talossim.NodeInfo(nil), c.pending...)
		c.mu.Unlock()
		early = map[string]bool{}
		for _, n := range pending {
			if err := c.register(ctx, kc, n); err != nil {
				c.log.Warn().Err(err).Str("node", n.Hostname).Msg("registering node")
				continue
			}
			early[n.Hostname] = true
		}
		return nil
	}
	kc, err := kube.Start(ctx, o)
	if err != nil {
		return c.fail(fmt.Errorf("starting the lab control plane: %w", err))
	}
	c.mu.Lock()
	c.cluster = kc
	c.fluxStoragePort = kc.FluxStoragePort()
	pending := c.pending
	c.pending = nil
	c.closeStartedLocked()
	c.mu.Unlock()
	// Once the API server serves, as ManifestApplyController applies them
	// then (a health check may run before they exist, as on Talos).
	if err := applyBootstrapManifests(ctx, kc, cfg); err != nil {
		c.log.Warn().Err(err).Msg("lab control plane: bootstrap manifests")
	}
	// Nodes configured while Flux started register now.
	for _, n := range pending {
		if early[n.Hostname] {
			// Its static pods reported while Flux started found no
			// cluster to show them in (c.cluster was still nil) and
			// were only kept: a kubelet keeps trying until its mirror
			// pods exist, so they are shown now.
			if n.Role == "controlplane" {
				if err := c.syncMirrors(ctx, kc, n.Hostname); err != nil {
					c.log.Warn().Err(err).Str("node", n.Hostname).Msg("mirror pods")
				}
			}
			continue
		}
		if err := c.register(ctx, kc, n); err != nil {
			c.log.Warn().Err(err).Str("node", n.Hostname).Msg("registering node")
		}
	}
	return nil
}

func (c *ControlPlane) closeStartedLocked() {
	if !c.startedClosed {
		c.startedClosed = true
		close(c.started)
	}
}

func (c *ControlPlane) fail(err error) error {
	c.mu.Lock()
	c.failed = err
	c.closeStartedLocked()
	c.mu.Unlock()
	return err
}

// EtcdLost implements talossim.EtcdLoser: the control plane's etcd data is
// gone with the last control plane's disk, so it stops (its API server is
// gone with the VMs) and the next Bootstrap or Recover starts a new one.
func (c *ControlPlane) EtcdLost(context.Context) {
	c.mu.Lock()
	kc := c.cluster
	c.cluster, c.failed, c.pending = nil, nil, nil
	c.closeStartedLocked()
	lost := c.lost
	c.started, c.startedClosed, c.lost = make(chan struct{}), false, make(chan struct{})
	c.mu.Unlock()
	close(lost)
	if kc != nil {
		c.log.Info().Msg("lab control plane: etcd data lost with the control plane disks; stopping it")
		if err := kc.Stop(); err != nil {
			c.log.Warn().Err(err).Msg("stopping the lab control plane")
		}
	}
}

// NodeConfigured registers the node, or remembers it until Bootstrap.
func (c *ControlPlane) NodeConfigured(ctx context.Context, n talossim.NodeInfo) error {
	c.mu.Lock()
	kc := c.cluster
	if kc == nil {
		c.pending = append(c.pending, n)
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	return c.register(ctx, kc, n)
}

func (c *ControlPlane) register(ctx context.Context, kc *kube.Cluster, n talossim.NodeInfo) error {
	role := kube.RoleWorker
	if n.Role == "controlplane" {
		role = kube.RoleControlPlane
	}
	if err := kc.RegisterKubelet(ctx, n.Hostname, n.IP, role, talossim.KubeletVersion(n.KubeletImage)); err != nil {
		return err
	}
	if role == kube.RoleControlPlane {
		return c.syncMirrors(ctx, kc, n.Hostname)
	}
	return nil
}

// MirrorPods implements talossim.MirrorPodSyncer: the report is kept and,
// once the control plane runs and the Node exists, shown as mirror pods.
func (c *ControlPlane) MirrorPods(ctx context.Context, node talossim.NodeInfo, seq uint64, pods []talossim.StaticPod) error {
	reported := time.Now()
	c.mirrorsMu.Lock()
	if c.mirrors == nil {
		c.mirrors = map[string]mirrorReport{}
	}
	if cur, ok := c.mirrors[node.Hostname]; ok && cur.seq >= seq {
		c.mirrorsMu.Unlock()
		return nil
	}
	c.mirrors[node.Hostname] = mirrorReport{seq: seq, pods: pods}
	c.mirrorsMu.Unlock()
	c.mu.Lock()
	kc := c.cluster
	c.mu.Unlock()
	if kc == nil {
		return nil
	}
	// The API server may be restarting (a control plane's new image):
	// kubelet keeps trying, so does this, until a later report takes over.
	for attempt := 0; ; attempt++ {
		err := c.syncMirrors(ctx, kc, node.Hostname)
		switch {
		case err == nil:
			c.mirrorsMu.Lock()
			if now := time.Now(); now.After(c.mirrorShownAt) {
				c.mirrorShown, c.mirrorShownAt = now.Sub(reported), now
			}
			c.mirrorsMu.Unlock()
			return nil
		case apierrors.IsNotFound(err):
			// Not registered yet: register applies it.
			return nil
		case attempt == 60:
			return err
		}
		c.mirrorsMu.Lock()
		superseded := c.mirrors[node.Hostname].seq != seq
		c.mirrorsMu.Unlock()
		if superseded {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// MirrorSyncTime is how long the lab took to show the static pods a
// control plane reported last: from the report (its boot sequence done,
// etcd running) to its mirror pods in the API. It is lab time, the API
// server's writes, that the talos stage's health wait cannot avoid; 0
// before any report was shown.
func (c *ControlPlane) MirrorSyncTime() time.Duration {
	c.mirrorsMu.Lock()
	defer c.mirrorsMu.Unlock()
	return c.mirrorShown
}

// syncMirrors applies the node's latest report; the node's lock
// serialises its reports, so the API ends at the latest one.
func (c *ControlPlane) syncMirrors(ctx context.Context, kc *kube.Cluster, hostname string) error {
	c.mirrorsMu.Lock()
	if c.mirrorSyncs == nil {
		c.mirrorSyncs = map[string]*sync.Mutex{}
	}
	node := c.mirrorSyncs[hostname]
	if node == nil {
		node = &sync.Mutex{}
		c.mirrorSyncs[hostname] = node
	}
	c.mirrorsMu.Unlock()
	node.Lock()
	defer node.Unlock()
	c.mirrorsMu.Lock()
	r, ok := c.mirrors[hostname]
	c.mirrorsMu.Unlock()
	if !ok {
		return nil
	}
	pods := make([]kube.MirrorPod, 0, len(r.pods))
	for _, p := range r.pods {
		pods = append(pods, kube.MirrorPod{Name: p.Name, Image: p.Image, Version: talossim.ImageTag(p.Image), Ready: p.Ready})
	}
	return kc.SyncMirrorPods(ctx, hostname, pods)
}

// StaticPodImage implements talossim.KubernetesUpdater: the lab's one
// control plane stands for every control plane's static pods, so the first
// control plane asking for a new version restarts the real server at that
// version on the same etcd data; the others find it running there.
func (c *ControlPlane) StaticPodImage(ctx context.Context, node talossim.NodeInfo, name, image string) error {
	kc, err := c.Cluster()
	if err != nil {
		return err
	}
	v := talossim.ImageTag(image)
	if v == "" {
		return fmt.Errorf("%s: image %q names no version", name, image)
	}
	return kc.RestartServer(ctx, name, v)
}

// KubeletImage implements talossim.KubernetesUpdater: the node reports the
// kubelet version of its new image.
func (c *ControlPlane) KubeletImage(ctx context.Context, node talossim.NodeInfo, image string) error {
	kc, err := c.Cluster()
	if err != nil {
		return err
	}
	v := talossim.KubeletVersion(image)
	if v == "" {
		return fmt.Errorf("kubelet image %q names no version", image)
	}
	return kc.SetKubeletVersion(ctx, node.Hostname, v)
}

// Kubeconfig returns the admin kubeconfig for the running control plane.
func (c *ControlPlane) Kubeconfig(ctx context.Context) ([]byte, error) {
	kc, err := c.Cluster()
	if err != nil {
		return nil, err
	}
	return kc.Kubeconfig()
}

// Healthy reports whether the API server and its companions answer.
func (c *ControlPlane) Healthy(ctx context.Context) bool {
	kc, err := c.Cluster()
	return err == nil && kc.Healthy(ctx) == nil
}

// SetCordoned implements talossim.Cordoner: it marks the Node
// unschedulable (or schedulable again), as Talos's controllers do around
// an upgrade.
func (c *ControlPlane) SetCordoned(ctx context.Context, nodeName string, cordoned bool) error {
	kc, err := c.Cluster()
	if err != nil {
		return err
	}
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%t}}`, cordoned)
	_, err = kc.Client().CoreV1().Nodes().Patch(ctx, nodeName, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// EtcdSnapshot implements talossim.EtcdSnapshotter with the real etcd's
// own snapshot.
func (c *ControlPlane) EtcdSnapshot(ctx context.Context) (io.ReadCloser, error) {
	c.mu.Lock()
	fault := c.snapshotFault
	c.mu.Unlock()
	if fault != nil {
		return nil, fault
	}
	kc, err := c.Cluster()
	if err != nil {
		return nil, err
	}
	return kc.EtcdSnapshot(ctx)
}

// FailEtcdSnapshots makes every etcd snapshot fail with err until it is
// called with nil: a test's stand-in for an etcd whose snapshot stream
// breaks. Talos relays the error as "failed reading etcd snapshot: …"
// (talossim EtcdSnapshot); what real etcd answers on a broken stream is
// unverified, so err is the test's own text.
func (c *ControlPlane) FailEtcdSnapshots(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.snapshotFault = err
}

// Cluster returns the running control plane, or why there is none.
func (c *ControlPlane) Cluster() (*kube.Cluster, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.cluster != nil:
		return c.cluster, nil
	case c.failed != nil:
		return nil, c.failed
	}
	return nil, errors.New("the control plane is not bootstrapped yet")
}

// WaitStarted waits until Bootstrap has started the control plane (or
// failed to).
func (c *ControlPlane) WaitStarted(ctx context.Context) (*kube.Cluster, error) {
	kc, _, err := c.WaitGeneration(ctx)
	return kc, err
}

// WaitGeneration is WaitStarted that also returns a channel closed when
// that control plane loses its etcd (EtcdLost), for what runs beside it.
func (c *ControlPlane) WaitGeneration(ctx context.Context) (*kube.Cluster, <-chan struct{}, error) {
	c.mu.Lock()
	started, lost := c.started, c.lost
	c.mu.Unlock()
	select {
	case <-started:
		kc, err := c.Cluster()
		return kc, lost, err
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// Stop stops the control plane if it runs.
func (c *ControlPlane) Stop() error {
	c.mu.Lock()
	kc := c.cluster
	c.mu.Unlock()
	if kc == nil {
		return nil
	}
	return kc.Stop()
}

// applyBootstrapManifests creates the bootstrap manifests the bootstrap
// node's config renders (talossim.BootstrapManifests) as Talos'
// ManifestApplyController does
// (internal/app/machined/pkg/controllers/k8s/manifest_apply.go at
// v1.13.3): it reads the bootstrap manifests' inventory (the ConfigMap
// kube-system/talos-bootstrap-manifests-inventory, created empty when
// missing: go-kubernetes v0.2.37 kubernetes/ssa GetInventory), skips every
// object the inventory records (even one deleted since), records an
// object that exists without being recorded (a restored etcd keeps its
// own), and applies a new one with field manager "talos" and the
// inventory's annotation, recording it; the inventory is written even
// when an object failed. Only talosctl upgrade-k8s (here: the product's
// manifest sync) changes or prunes them later.
func applyBootstrapManifests(ctx context.Context, kc *kube.Cluster, cfg config.Provider) error {
	dyn, err := dynamic.NewForConfig(kc.RESTConfig())
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(kc.Client().Discovery()))
	cms := kc.Client().CoreV1().ConfigMaps(constants.KubernetesInventoryNamespace)
	cm, err := cms.Get(ctx, constants.KubernetesBootstrapManifestsInventoryName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: constants.KubernetesBootstrapManifestsInventoryName, Namespace: constants.KubernetesInventoryNamespace}}, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("the bootstrap manifests' inventory: %w", err)
	}
	inv := map[string]string{}
	for k := range cm.Data {
		inv[k] = ""
	}
	var errs []error
	for _, m := range talossim.BootstrapManifests(cfg) {
		for _, o := range m.Objects {
			obj := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(o)}
			gvk := obj.GroupVersionKind()
			ref := object.ObjMetadata{Namespace: obj.GetNamespace(), Name: obj.GetName(), GroupKind: gvk.GroupKind()}.String()
			if _, ok := inv[ref]; ok {
				continue
			}
			mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err))
				continue
			}
			var r dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
			if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
				r = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
			}
			if _, err := r.Get(ctx, obj.GetName(), metav1.GetOptions{}); err == nil {
				inv[ref] = ""
				continue
			} else if !apierrors.IsNotFound(err) {
				errs = append(errs, err)
				continue
			}
			ann := obj.GetAnnotations()
			if ann == nil {
				ann = map[string]string{}
			}
			ann["config.k8s.io/owning-inventory"] = constants.KubernetesBootstrapManifestsInventoryName
			obj.SetAnnotations(ann)
			if _, err := r.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: constants.KubernetesFieldManagerName}); err != nil {
				errs = append(errs, fmt.Errorf("creating %s %s: %w", gvk.Kind, obj.GetName(), err))
				continue
			}
			inv[ref] = ""
		}
	}
	cm.Data = inv
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		errs = append(errs, fmt.Errorf("updating the bootstrap manifests' inventory: %w", err))
	}
	return errors.Join(errs...)
}
