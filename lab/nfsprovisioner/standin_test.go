package nfsprovisioner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/cli"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/lab/chartrepo"
	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
	"github.com/homelab/bootstrap/lab/nfs"
	"github.com/homelab/bootstrap/lab/nfsprovisioner"
)

const (
	ns          = "nfs-provisioner"
	release     = "nfs-provisioner"
	provName    = "homelab.local/nfs"
	deployName  = "nfs-provisioner-nfs-subdir-external-provisioner"
	chartName   = "nfs-subdir-external-provisioner"
	chartVer    = "4.0.18"
	waitTimeout = 60 * time.Second
)

func poll(t *testing.T, what string, timeout time.Duration, cond func(ctx context.Context) (bool, string, error)) {
	t.Helper()
	if err := wait.Until(context.Background(), wait.Spec{What: what, Timeout: timeout, Interval: 200 * time.Millisecond, Log: kubetest.Logger(t)}, cond); err != nil {
		t.Fatal(err)
	}
}

// helmSettings points the Helm SDK at the lab and at throwaway Helm dirs.
func helmSettings(t *testing.T, kubeconfig, ns string) *cli.EnvSettings {
	home := t.TempDir()
	t.Setenv("HELM_CACHE_HOME", filepath.Join(home, "cache"))
	t.Setenv("HELM_CONFIG_HOME", filepath.Join(home, "config"))
	t.Setenv("HELM_DATA_HOME", filepath.Join(home, "data"))
	s := cli.New()
	s.KubeConfig = kubeconfig
	s.SetNamespace(ns)
	return s
}

func helmConfig(t *testing.T, s *cli.EnvSettings, ns string) *action.Configuration {
	cfg := new(action.Configuration)
	if err := cfg.Init(s.RESTClientGetter(), ns, "secret", func(f string, v ...any) { t.Logf("helm: "+f, v...) }); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// helmDeploy installs (or upgrades) the lab chart from the lab repository by
// URL, the way the infra stage does, and waits for it.
func helmDeploy(t *testing.T, s *cli.EnvSettings, repoURL, ns, release string, vals map[string]any, upgrade bool) {
	t.Helper()
	cpo := action.ChartPathOptions{RepoURL: repoURL, Version: chartVer}
	p, err := cpo.LocateChart(chartName, s)
	if err != nil {
		t.Fatalf("locating the chart in %s: %v", repoURL, err)
	}
	ch, err := loader.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitTimeout)
	defer cancel()
	cfg := helmConfig(t, s, ns)
	if upgrade {
		up := action.NewUpgrade(cfg)
		up.Namespace, up.Wait, up.Timeout, up.ResetValues = ns, true, waitTimeout, true
		if _, err := up.RunWithContext(ctx, release, ch, vals); err != nil {
			t.Fatalf("helm upgrade: %v", err)
		}
		return
	}
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace, in.CreateNamespace, in.Wait, in.Timeout = release, ns, true, true, waitTimeout
	if _, err := in.RunWithContext(ctx, ch, vals); err != nil {
		t.Fatalf("helm install: %v", err)
	}
}

func pvc(name, class string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
}

func phaseOf(ctx context.Context, cs kubernetes.Interface, name string) corev1.PersistentVolumeClaimPhase {
	c, err := cs.CoreV1().PersistentVolumeClaims("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return c.Status.Phase
}

func waitBound(t *testing.T, cs kubernetes.Interface, name string) *corev1.PersistentVolumeClaim {
	t.Helper()
	poll(t, "PVC "+name+" Bound", waitTimeout, func(ctx context.Context) (bool, string, error) {
		p := phaseOf(ctx, cs, name)
		return p == corev1.ClaimBound, "phase " + string(p), nil
	})
	c, err := cs.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// stillPending asserts a claim stays Pending for a while: the negative cases.
func stillPending(t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		if p := phaseOf(context.Background(), cs, name); p != corev1.ClaimPending {
			t.Fatalf("PVC %s is %q, want it left Pending", name, p)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func serving(s *nfsprovisioner.StandIn) string { return strings.Join(s.Serving(), ",") }

func TestStandInProvisionsForTheChart(t *testing.T) {
	ctx := context.Background()
	c := kubetest.Start(t, kube.Options{})
	cs := c.Client()
	if err := c.RegisterNode(ctx, "w-1", "10.5.0.21", kube.RoleWorker); err != nil {
		t.Fatal(err)
	}

	nfsHost := kubetest.LoopbackIP()
	srv, err := nfs.Start(nfs.Options{Addr: nfsHost + ":0", Log: kubetest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	repo, err := chartrepo.Start(chartrepo.Options{Log: kubetest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer repo.Close()
	hs := helmSettings(t, c.AdminKubeconfigPath(), ns)
	vals := map[string]any{
		"nfs":          map[string]any{"server": nfsHost, "path": nfs.DefaultExportPath},
		"storageClass": map[string]any{"provisionerName": provName, "defaultClass": true},
	}
	start := time.Now()
	helmDeploy(t, hs, repo.URL(), ns, release, vals, false)
	t.Logf("MEASURE helm install from the lab repo (wait included): %s", time.Since(start).Round(10*time.Millisecond))
	if repo.Requests("/index.yaml") == 0 || repo.Requests("/"+chartName+"-"+chartVer+".tgz") == 0 {
		t.Errorf("the chart was not fetched from the lab repository by URL")
	}
	// Started once the chart is in: the provisioning library registers types
	// in client-go's global scheme when it makes a controller, so nothing
	// else here talks to the API server until it serves (keeps -race quiet).
	si, err := nfsprovisioner.Start(ctx, nfsprovisioner.Options{Client: cs, Log: kubetest.Logger(t), NFSPort: srv.Port()})
	if err != nil {
		t.Fatal(err)
	}
	defer si.Stop()
	poll(t, "stand-in serving "+provName, 20*time.Second, func(context.Context) (bool, string, error) {
		return serving(si) == provName, "serving: " + serving(si), nil
	})

	t.Run("right class binds, directory over NFS", func(t *testing.T) {
		if _, err := cs.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc("data", "nfs-client"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		claim := waitBound(t, cs, "data")
		pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		dir := "default-data-" + pv.Name
		if pv.Spec.NFS == nil || pv.Spec.NFS.Server != nfsHost || pv.Spec.NFS.Path != nfs.DefaultExportPath+"/"+dir {
			t.Fatalf("PV source %+v, want NFS %s:%s/%s", pv.Spec.PersistentVolumeSource, nfsHost, nfs.DefaultExportPath, dir)
		}
		if fi, err := os.Stat(filepath.Join(srv.Dir(), dir)); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o777 {
			t.Fatalf("directory %s in the export: %v %v", dir, fi, err)
		}
		// The PV's path mounts, as kubelet would mount it.
		m, err := nfs.Dial(ctx, nfsHost, srv.Port(), pv.Spec.NFS.Path)
		if err != nil {
			t.Fatal(err)
		}
		m.Close()

		if err := cs.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(t, "directory "+dir+" archived after the claim was deleted", waitTimeout, func(context.Context) (bool, string, error) {
			_, errOld := os.Stat(filepath.Join(srv.Dir(), dir))
			_, errArch := os.Stat(filepath.Join(srv.Dir(), "archived-"+dir))
			return os.IsNotExist(errOld) && errArch == nil, fmt.Sprintf("old: %v, archived: %v", errOld, errArch), nil
		})
	})

	t.Run("other provisioner name stays Pending", func(t *testing.T) {
		sc := `{"apiVersion":"storage.k8s.io/v1","kind":"StorageClass","metadata":{"name":"other"},"provisioner":"example.com/other"}`
		if _, err := cs.StorageV1().StorageClasses().Patch(ctx, "other", types.ApplyPatchType, []byte(sc), metav1.PatchOptions{FieldManager: "test"}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc("foreign", "other"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		stillPending(t, cs, "foreign")
	})

	t.Run("broken Deployment stops provisioning", func(t *testing.T) {
		// No node matches: with the chart's Recreate strategy the pod goes
		// and its replacement stays Pending, so the Deployment is unavailable.
		patch := []byte(`{"spec":{"template":{"spec":{"nodeSelector":{"lab":"nowhere"}}}}}`)
		if _, err := cs.AppsV1().Deployments(ns).Patch(ctx, deployName, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(t, "stand-in to stop serving", 30*time.Second, func(context.Context) (bool, string, error) {
			return serving(si) == "", "serving: " + serving(si), nil
		})
		if _, err := cs.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc("late", "nfs-client"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		stillPending(t, cs, "late")

		fix := []byte(`{"spec":{"template":{"spec":{"nodeSelector":null}}}}`)
		if _, err := cs.AppsV1().Deployments(ns).Patch(ctx, deployName, types.StrategicMergePatchType, fix, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		waitBound(t, cs, "late")
	})

	t.Run("wrong nfs.path is not served", func(t *testing.T) {
		// A second release whose export path the server refuses: its pod
		// would never mount the volume, so nothing provisions its class.
		const badNS, badRelease, badProv = "nfs-wrong", "nfs-wrong", "homelab.local/nfs-wrong"
		bad := map[string]any{
			"nfs":          map[string]any{"server": nfsHost, "path": "/export/wrong"},
			"storageClass": map[string]any{"provisionerName": badProv, "name": "nfs-wrong"},
		}
		helmDeploy(t, helmSettings(t, c.AdminKubeconfigPath(), badNS), repo.URL(), badNS, badRelease, bad, false)
		key := badNS + "/" + badRelease + "-" + chartName
		poll(t, "stand-in to refuse "+key, 30*time.Second, func(context.Context) (bool, string, error) {
			why := si.NotServing()[key]
			return strings.Contains(why, "MNT3ERR_ACCES"), "reason: " + why, nil
		})
		if slices.Contains(si.Serving(), badProv) || !slices.Contains(si.Serving(), provName) {
			t.Fatalf("serving %v", si.Serving())
		}
		if _, err := cs.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc("wrongpath", "nfs-wrong"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		stillPending(t, cs, "wrongpath")
	})

	t.Run("archiveOnDelete false removes the directory", func(t *testing.T) {
		sc := map[string]any{
			"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
			"metadata":    map[string]any{"name": "nfs-scratch"},
			"provisioner": provName,
			"parameters":  map[string]any{"archiveOnDelete": "false"},
		}
		body, _ := json.Marshal(sc)
		if _, err := cs.StorageV1().StorageClasses().Patch(ctx, "nfs-scratch", types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "test"}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc("scratch", "nfs-scratch"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		claim := waitBound(t, cs, "scratch")
		dir := "default-scratch-" + claim.Spec.VolumeName
		if _, err := os.Stat(filepath.Join(srv.Dir(), dir)); err != nil {
			t.Fatal(err)
		}
		if err := cs.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "scratch", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(t, "directory "+dir+" removed", waitTimeout, func(context.Context) (bool, string, error) {
			entries, _ := os.ReadDir(srv.Dir())
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			gone := !slices.Contains(names, dir) && !slices.Contains(names, "archived-"+dir)
			return gone, "export holds " + strings.Join(names, ","), nil
		})
	})
}
