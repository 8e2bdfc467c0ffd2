package postcheck

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/kube"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

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
			log := c.log(ctx)
			log.Info().Str("pvc", p.Name).Msg("removing a test PVC left by an earlier postcheck")
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
			log := c.log(ctx)
			log.Error().Err(err).Str("pvc", name).Msg("test PVC cleanup incomplete")
		}
	}()
	start := c.o.now()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wake := kube.Wake(wctx, func(ctx context.Context) (watch.Interface, error) {
		return pvcs.Watch(ctx, kube.Named(name))
	})
	err = wait.Until(ctx, wait.Spec{What: fmt.Sprintf("test PVC %s/%s Bound", c.o.PVCNamespace, name), Timeout: c.o.PVCTimeout, Interval: pvcPoll, MaxInterval: pvcPollMax, Log: c.log(ctx), Wake: wake},
		func(ctx context.Context) (bool, string, error) {
			p, err := pvcs.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			volume = p.Spec.VolumeName
			return p.Status.Phase == corev1.ClaimBound, "phase " + string(p.Status.Phase) + c.pvcEvents(ctx, cs, name), nil
		})
	if err != nil {
		if cause := c.provisionerDown(ctx, cs); cause != "" {
			c.saw(CheckNFS, Cause{Seen: cause})
		}
		return check.Failf("%v", err)
	}
	return check.Passf("test PVC %s bound to %s via %s in %s", name, volume, class, wait.Round(c.o.now().Sub(start)))
}

// provisionerDown names a Deployment in the test PVC's namespace (the NFS
// provisioner's) with fewer ready replicas than it wants, or none ("" when
// each is ready or they cannot be read): a claim nobody provisions stays
// Pending, and that is the first thing to fix.
func (c *checker) provisionerDown(ctx context.Context, cs kubernetes.Interface) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	deps, err := cs.AppsV1().Deployments(c.o.PVCNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return ""
	}
	for _, d := range deps.Items {
		want := int32(1)
		if d.Spec.Replicas != nil {
			want = *d.Spec.Replicas
		}
		ready := d.Status.ReadyReplicas
		switch {
		case want == 0:
			return fmt.Sprintf("the NFS provisioner %s/%s has 0/0 ready replicas (scaled to 0): kubectl --kubeconfig <(bootstrap kubeconfig) -n %s scale deployment %s --replicas=1, and find out who scaled it down", d.Namespace, d.Name, d.Namespace, d.Name)
		case ready < want:
			return fmt.Sprintf("the NFS provisioner %s/%s has %d/%d ready replicas: kubectl --kubeconfig <(bootstrap kubeconfig) -n %s describe deployment %s and its pods say why", d.Namespace, d.Name, ready, want, d.Namespace, d.Name)
		}
	}
	return ""
}

// The test PVC's waits start polling quickly and back off: the nightly
// postcheck pays for the bind and the volume's removal, not for the
// spacing of the polls (a provisioner that takes seconds is asked a few
// times a second at first, then once a second).
const (
	pvcPoll    = 50 * time.Millisecond
	pvcPollMax = time.Second
)

// pvcEvents quotes why the PVC is still Pending: the newest Warning event
// about it (ProvisioningFailed), else the newest event. A provisioner
// retrying a failed claim records a Normal "Provisioning" before each
// attempt, so the newest event alone would hide the failure behind the
// retry.
func (c *checker) pvcEvents(ctx context.Context, cs kubernetes.Interface, name string) string {
	ev, err := cs.CoreV1().Events(c.o.PVCNamespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil || len(ev.Items) == 0 {
		return ""
	}
	sort.SliceStable(ev.Items, func(i, j int) bool { return ev.Items[i].LastTimestamp.Before(&ev.Items[j].LastTimestamp) })
	last := ev.Items[len(ev.Items)-1]
	for _, e := range ev.Items {
		if e.Type == corev1.EventTypeWarning {
			last = e
		}
	}
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
	return wait.Until(ctx, wait.Spec{What: fmt.Sprintf("test PVC %s and its volume deleted", name), Timeout: c.o.PVCTimeout, Interval: pvcPoll, MaxInterval: pvcPollMax, Log: c.log(ctx), Wake: wake},
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
