package stages

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/cli"
	"helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/infra"
	"github.com/homelab/bootstrap/internal/wait"
)

func helmTestHome(t *testing.T) {
	home := t.TempDir()
	for _, k := range []string{"HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"} {
		t.Setenv(k, filepath.Join(home, k))
	}
}

func helmConfig(t *testing.T, kubeconfig, ns string) *action.Configuration {
	t.Helper()
	s := cli.New()
	s.KubeConfig = kubeconfig
	s.SetNamespace(ns)
	cfg := new(action.Configuration)
	if err := cfg.Init(s.RESTClientGetter(), ns, "secret", func(string, ...any) {}); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func (l *kubeLab) runStage(s Stage, dryRun bool) (*Env, error) {
	env := l.env(dryRun)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err := s.Run(ctx, env)
	return env, err
}

func changeList(env *Env) string {
	var out []string
	for _, c := range env.Changes() {
		out = append(out, c.Action)
	}
	return strings.Join(out, "\n")
}

// TestInfraStageOnTheLab covers issue 7 against the real API server, the
// lab chart repository, the lab NFS server and the provisioner stand-in.
func TestInfraStageOnTheLab(t *testing.T) {
	helmTestHome(t)
	l := newKubeLab(t, kubeLabOptions{})
	ctx := context.Background()
	cs := l.client()

	// Talos or an earlier install left another default class.
	other := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "local-path",
		Annotations: map[string]string{infra.DefaultClassAnnotation: "true"}}, Provisioner: "rancher.io/local-path"}
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Dry run first: a plan, and nothing installed.
	env, err := l.runStage(InfraStage{}, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := changeList(env); !strings.Contains(got, "install nfs-subdir-external-provisioner@4.0.18 as release nfs-provisioner in nfs-provisioner") {
		t.Fatalf("dry-run plan:\n%s", got)
	}
	if _, err := cs.StorageV1().StorageClasses().Get(ctx, "nfs-storage", metav1.GetOptions{}); err == nil {
		t.Fatal("a dry run installed the chart")
	}

	// First run installs, demotes the other default, and a PVC binds.
	const archive = "/nfs-subdir-external-provisioner-4.0.18.tgz"
	before := l.repo.Requests(archive)
	env, err = l.runStage(InfraStage{}, false)
	if err != nil {
		t.Fatal(err)
	}
	// The chart is rendered (to check the class) and installed: one download.
	if n := l.repo.Requests(archive) - before; n != 1 {
		t.Fatalf("the install run downloaded the chart %d times, want once", n)
	}
	if got := changeList(env); !strings.Contains(got, "install nfs-subdir") || !strings.Contains(got, "remove the default annotation from StorageClass local-path") {
		t.Fatalf("first run changes:\n%s", got)
	}
	if sc, _ := cs.StorageV1().StorageClasses().Get(ctx, "local-path", metav1.GetOptions{}); infra.IsDefault(sc) {
		t.Fatal("local-path is still default")
	}
	if l.st.Outputs.Infra.Revision != 1 || l.st.Outputs.Infra.StorageClass != "nfs-storage" {
		t.Fatalf("outputs: %+v", l.st.Outputs.Infra)
	}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}}}
	if _, err := cs.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var volume string
	if err := wait.Until(ctx, wait.Spec{What: "PVC default/data Bound", Timeout: 30 * time.Second, Interval: 200 * time.Millisecond},
		func(ctx context.Context) (bool, string, error) {
			p, err := cs.CoreV1().PersistentVolumeClaims("default").Get(ctx, "data", metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			volume = p.Spec.VolumeName
			return p.Status.Phase == corev1.ClaimBound, string(p.Status.Phase), nil
		}); err != nil {
		t.Fatal(err)
	}
	if p, _ := cs.CoreV1().PersistentVolumeClaims("default").Get(ctx, "data", metav1.GetOptions{}); *p.Spec.StorageClassName != "nfs-storage" {
		t.Fatalf("PVC without a class did not get the default nfs-storage: %v", *p.Spec.StorageClassName)
	}
	if _, err := os.Stat(filepath.Join(l.nfs.Dir(), "default-data-"+volume)); err != nil {
		t.Fatalf("provisioned directory missing on the export: %v", err)
	}

	// Re-run on the converged cluster: no change at all, same revision.
	env, err = l.runStage(InfraStage{}, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := changeList(env); got != "" {
		t.Fatalf("re-run changed things:\n%s", got)
	}
	cfg := helmConfig(t, l.cfg.Paths().Kubeconfig, infra.NFSNamespace)
	if last, _ := cfg.Releases.Last(infra.NFSRelease); last.Version != 1 {
		t.Fatalf("re-run made revision %d", last.Version)
	}

	// Changed values: exactly one upgrade.
	l.cfg.Storage.NFS.MountOptions = []string{"nfsvers=4.1", "hard"}
	env, err = l.runStage(InfraStage{}, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := changeList(env); !strings.Contains(got, "upgrade release nfs-provisioner/nfs-provisioner (values changed: nfs.mountOptions)") {
		t.Fatalf("values change:\n%s", got)
	}
	if last, _ := cfg.Releases.Last(infra.NFSRelease); last.Version != 2 {
		t.Fatalf("upgrade made revision %d", last.Version)
	}

	// A run killed during an upgrade leaves it pending: the next run recovers.
	last, _ := cfg.Releases.Last(infra.NFSRelease)
	stuck := *last
	stuck.Version, stuck.Info = 3, &release.Info{Status: release.StatusPendingUpgrade, FirstDeployed: last.Info.FirstDeployed, LastDeployed: last.Info.LastDeployed}
	last.Info.Status = release.StatusSuperseded
	cfg.Releases.Update(last)
	if err := cfg.Releases.Create(&stuck); err != nil {
		t.Fatal(err)
	}
	env, err = l.runStage(InfraStage{}, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := changeList(env); !strings.Contains(got, "roll release nfs-provisioner back from revision 3 (pending-upgrade) to 2") {
		t.Fatalf("recovery:\n%s", got)
	}
	if last, _ := cfg.Releases.Last(infra.NFSRelease); last.Info.Status != release.StatusDeployed {
		t.Fatalf("release left %s", last.Info.Status)
	}

	// Someone removed our default annotation: it comes back.
	if err := infra.Demote(ctx, cs, "nfs-storage"); err != nil {
		t.Fatal(err)
	}
	env, err = l.runStage(InfraStage{}, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := changeList(env); got != "annotate StorageClass nfs-storage as the default" {
		t.Fatalf("restoring the default:\n%s", got)
	}

	// A values file that adds a class parameter: the class is checked
	// against what the chart renders with it, so re-runs change nothing.
	values := filepath.Join(l.dir, "nfs-values.yaml")
	if err := os.WriteFile(values, []byte("storageClass:\n  pathPattern: \"${.PVC.namespace}/${.PVC.name}\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l.cfg.Storage.NFS.ValuesFile, l.cfg.Storage.NFS.StorageClass = values, "nfs-pattern"
	for run := 1; run <= 2; run++ {
		env, err := l.runStage(InfraStage{}, false)
		if err != nil {
			t.Fatalf("run %d with storageClass.pathPattern: %v", run, err)
		}
		if got := changeList(env); run == 2 && got != "" {
			t.Fatalf("re-run with storageClass.pathPattern changed:\n%s", got)
		}
	}
	pattern, err := cs.StorageV1().StorageClasses().Get(ctx, "nfs-pattern", metav1.GetOptions{})
	if err != nil || pattern.Parameters["pathPattern"] != "${.PVC.namespace}/${.PVC.name}" {
		t.Fatalf("class with pathPattern: %v %v", err, pattern)
	}

	// A class that matches the chart's but that the release does not own:
	// Helm would refuse it; the stage says how to hand it over, and once
	// that is done the release takes it.
	unowned := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "nfs-unowned"}, Provisioner: pattern.Provisioner,
		Parameters: pattern.Parameters, ReclaimPolicy: pattern.ReclaimPolicy}
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, unowned, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	l.cfg.Storage.NFS.StorageClass = "nfs-unowned"
	_, err = l.runStage(InfraStage{}, false)
	if err == nil || !strings.Contains(err.Error(), "does not own it") || !strings.Contains(err.Error(), "kubectl annotate storageclass nfs-unowned meta.helm.sh/release-name=nfs-provisioner meta.helm.sh/release-namespace=nfs-provisioner --overwrite") {
		t.Fatalf("unowned class: %v", err)
	}
	patch := `{"metadata":{"labels":{"app.kubernetes.io/managed-by":"Helm"},"annotations":{"meta.helm.sh/release-name":"nfs-provisioner","meta.helm.sh/release-namespace":"nfs-provisioner"}}}`
	if _, err := cs.StorageV1().StorageClasses().Patch(ctx, "nfs-unowned", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.runStage(InfraStage{}, false); err != nil {
		t.Fatalf("after handing the class to the release as told: %v", err)
	}
	l.cfg.Storage.NFS.ValuesFile = ""

	// A class the release would own but with another volumeBindingMode
	// (immutable) is named, not left to fail Helm's upgrade.
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	late := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "nfs-late", Labels: map[string]string{"app.kubernetes.io/managed-by": "Helm"},
		Annotations: map[string]string{"meta.helm.sh/release-name": "nfs-provisioner", "meta.helm.sh/release-namespace": "nfs-provisioner"}},
		Provisioner: pattern.Provisioner, Parameters: pattern.Parameters, ReclaimPolicy: pattern.ReclaimPolicy, VolumeBindingMode: &wffc}
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, late, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	l.cfg.Storage.NFS.StorageClass = "nfs-late"
	if _, err := l.runStage(InfraStage{}, false); err == nil || !strings.Contains(err.Error(), "volumeBindingMode WaitForFirstConsumer (want Immediate)") {
		t.Fatalf("class with another binding mode: %v", err)
	}

	// An nfs-storage class from another provisioner cannot be taken over.
	l.cfg.Storage.NFS.StorageClass = "nfs-other"
	foreign := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "nfs-other"}, Provisioner: "example.com/other"}
	cs.StorageV1().StorageClasses().Create(ctx, foreign, metav1.CreateOptions{})
	if _, err := l.runStage(InfraStage{}, false); err == nil || !strings.Contains(err.Error(), `StorageClass nfs-other already exists with provisioner "example.com/other"`) {
		t.Fatalf("foreign class: %v", err)
	}
}

// TestInfraStageCiliumFirst: with cni cilium the Cilium chart is installed
// and every node is Ready before the NFS chart goes in.
func TestInfraStageCiliumFirst(t *testing.T) {
	helmTestHome(t)
	l := newKubeLab(t, kubeLabOptions{cni: "cilium"})
	env, err := l.runStage(InfraStage{}, false)
	if err != nil {
		t.Fatal(err)
	}
	got := changeList(env)
	ci, ni := strings.Index(got, "install cilium@"+config.DefaultCiliumVersion), strings.Index(got, "install nfs-subdir-external-provisioner")
	if ci < 0 || ni < 0 || ci > ni {
		t.Fatalf("Cilium must come before the NFS chart:\n%s", got)
	}
	cfg := helmConfig(t, l.cfg.Paths().Kubeconfig, infra.CiliumNamespace)
	rel, err := cfg.Releases.Last(infra.CiliumRelease)
	if err != nil || rel.Config["kubeProxyReplacement"] != true || rel.Config["k8sServiceHost"] != infra.KubePrismHost || rel.Config["k8sServicePort"] != float64(7445) {
		t.Fatalf("cilium release: %v %v", err, rel.Config)
	}
	// Two nodes: the chart's two operator replicas fit, one per node.
	if op, _ := rel.Config["operator"].(map[string]any); op["replicas"] != float64(2) {
		t.Fatalf("operator values %v, want 2 replicas on 2 nodes", rel.Config["operator"])
	}
	nfsRel, _ := helmConfig(t, l.cfg.Paths().Kubeconfig, infra.NFSNamespace).Releases.Last(infra.NFSRelease)
	if !rel.Info.FirstDeployed.Time.Before(nfsRel.Info.FirstDeployed.Time) && !rel.Info.FirstDeployed.Time.Equal(nfsRel.Info.FirstDeployed.Time) {
		t.Fatal("NFS release deployed before Cilium")
	}
	ds, err := l.client().AppsV1().DaemonSets(infra.CiliumNamespace).Get(context.Background(), "cilium", metav1.GetOptions{})
	if err != nil || ds.Status.DesiredNumberScheduled != 2 {
		t.Fatalf("cilium agent DaemonSet: %v %+v", err, ds.Status)
	}
}
