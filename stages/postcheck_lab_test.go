package stages_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/homelab/bootstrap/check"
	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/flux"
	"github.com/homelab/bootstrap/gitsnap"
	"github.com/homelab/bootstrap/infra"
	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/internal/testbin"
	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/kube"
	"github.com/homelab/bootstrap/lab"
	labkube "github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
	"github.com/homelab/bootstrap/postcheck"
	"github.com/homelab/bootstrap/postcheck/reporttest"
	"github.com/homelab/bootstrap/stages"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/ui"
)

type postcheckLab struct {
	t    *testing.T
	lab  *lab.Lab
	cfg  *config.Config
	st   *state.State
	cs   kubernetes.Interface
	log  string
	out  bytes.Buffer
	runs int
}

func (p *postcheckLab) env() *stages.Env {
	log := kubetest.Logger(p.t)
	p.out.Reset()
	return &stages.Env{Config: p.cfg, Paths: p.cfg.Paths(), State: p.st, Log: log, UI: ui.NewReporter(log), Out: &p.out,
		Secrets: &redact.Set{}, Now: time.Now, LogPath: p.log}
}

// postcheck runs the stage and returns the report from its archive.
func (p *postcheckLab) postcheck() (postcheck.Report, map[string][]byte, error) {
	p.t.Helper()
	p.runs++
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	runErr := stages.PostcheckStage{}.Run(ctx, p.env())
	files := untar(p.t, p.st.Outputs.Postcheck.Archive)
	var rep postcheck.Report
	if err := json.Unmarshal(files["report.json"], &rep); err != nil {
		p.t.Fatalf("report.json: %v", err)
	}
	if err := reporttest.Validate(p.t, files["report.json"]); err != nil {
		p.t.Errorf("report.json against docs/report.schema.json: %v", err)
	}
	return rep, files, runErr
}

func untar(t *testing.T, path string) map[string][]byte {
	t.Helper()
	out, err := postcheck.ReadArchive(path)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// expectOnly asserts that exactly the named check failed, with reason.
func (p *postcheckLab) expectOnly(rep postcheck.Report, runErr error, failing, reason string) {
	p.t.Helper()
	want := map[string]string{}
	if failing != "" {
		want[failing] = reason
	}
	p.expectFailing(rep, runErr, want)
}

// expectFailing wants exactly the checks named failing to fail, each with
// its reason.
func (p *postcheckLab) expectFailing(rep postcheck.Report, runErr error, failing map[string]string) {
	p.t.Helper()
	for _, c := range rep.Checks {
		reason, want := failing[c.Name]
		switch {
		case want && (c.Status != check.Fail || !strings.Contains(c.Reason, reason)):
			p.t.Errorf("%s: got %s %q, want fail containing %q", c.Name, c.Status, c.Reason, reason)
		case !want && c.Status == check.Fail:
			p.t.Errorf("%s failed too: %s", c.Name, c.Reason)
		}
	}
	if len(failing) == 0 && runErr != nil || len(failing) > 0 && runErr == nil {
		p.t.Errorf("stage error %v with failing checks %v", runErr, failing)
	}
	// Never a test PVC left behind, pass or fail.
	pvcs, err := p.cs.CoreV1().PersistentVolumeClaims(stages.NFSNamespace).List(context.Background(), metav1.ListOptions{LabelSelector: postcheck.TestPVCLabel + "=true"})
	if err != nil || len(pvcs.Items) != 0 {
		p.t.Errorf("test PVCs left behind: %v %d", err, len(pvcs.Items))
	}
}

func waitFor(t *testing.T, what string, cond func(context.Context) (bool, string, error)) {
	t.Helper()
	if err := wait.Until(context.Background(), wait.Spec{What: what, Timeout: 90 * time.Second, Interval: 250 * time.Millisecond}, cond); err != nil {
		t.Fatal(err)
	}
}

// TestPostcheckCriteriaOnTheLab is issue 9 against a converged lab cluster.
func TestPostcheckCriteriaOnTheLab(t *testing.T) {
	bins := kubetest.Binaries(t)
	for _, k := range []string{"HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"} {
		t.Setenv(k, filepath.Join(t.TempDir(), k))
	}
	ctx := context.Background()
	l, err := lab.Start(ctx, lab.Options{Dir: t.TempDir(), BinDir: bins.Dir, Log: kubetest.Logger(t), Workers: 2, NodeMonitorGracePeriod: 8 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Stop() })
	cfg, err := config.Load(l.ConfigPath(), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gitsnap.Stop(context.Background(), cfg.Paths().StateDir, 5*time.Second, zerolog.Nop()) })
	cfg.Postcheck.Keep = 2
	cfg.Postcheck.PVCTimeout = config.Duration(6 * time.Second)
	p := &postcheckLab{t: t, lab: l, cfg: cfg, st: state.New(cfg.Cluster.Name), log: filepath.Join(t.TempDir(), "run.log")}
	os.WriteFile(p.log, []byte(`{"level":"info","message":"run started"}`+"\n"), 0o600)
	pipeline := []stages.Stage{stages.PrecheckStage{}, stages.ProvisionStage{}, stages.TalosStage{}, stages.InfraStage{}, stages.FluxStage{}}
	if err := stages.Run(ctx, p.env(), pipeline, stages.RunInfo{ID: "converge"}); err != nil {
		t.Fatalf("%v\n%s", err, p.out.String())
	}
	cs, _, err := kube.Clientset(cfg.Paths().Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	p.cs = cs

	// Converged: every check passes, and the archive holds what is promised.
	rep, files, err := p.postcheck()
	p.expectOnly(rep, err, "", "")
	for _, name := range []string{"report.json", "junit.xml", "metrics.prom", "run.log", "evidence/nodes.yaml", "evidence/storageclasses.yaml",
		"evidence/persistentvolumes.yaml", "evidence/nfs-provisioner/persistentvolumeclaims.yaml", "evidence/nfs-provisioner/events.yaml",
		"evidence/flux-system/gitrepositories.yaml", "evidence/flux-system/kustomizations.yaml", "evidence/flux-system/events.yaml"} {
		if len(files[name]) == 0 {
			t.Errorf("archive lacks %s", name)
		}
	}
	if !bytes.Contains(files["evidence/nodes.yaml"], []byte("name: wk-1")) || !bytes.Contains(files["evidence/flux-system/gitrepositories.yaml"], []byte("kind: GitRepository")) {
		t.Error("evidence does not show the cluster")
	}
	for name := range files {
		if strings.Contains(strings.ToLower(name), "secret") {
			t.Errorf("archive holds %s", name)
		}
	}

	t.Run("node heartbeat stopped", func(t *testing.T) {
		// A worker that does not run the provisioner: losing that one
		// would rightly fail provisioning too.
		pods, err := cs.CoreV1().Pods(stages.NFSNamespace).List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) != 1 {
			t.Fatalf("provisioner pod: %v", err)
		}
		victim := "wk-1"
		if pods.Items[0].Spec.NodeName == victim {
			victim = "wk-2"
		}
		kc, _ := l.Kube.Cluster()
		if err := kc.StopHeartbeat(ctx, victim); err != nil {
			t.Fatal(err)
		}
		waitFor(t, victim+" NotReady", func(ctx context.Context) (bool, string, error) {
			_, notReady, err := kube.NodeStatus(ctx, cs, []string{victim})
			return len(notReady) == 1, "", err
		})
		// Its kube-proxy pod is marked not Ready with it (the node
		// lifecycle controller), which talosctl health reports too.
		waitFor(t, victim+"'s kube-proxy not Ready", func(ctx context.Context) (bool, string, error) {
			pods, err := cs.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-proxy", FieldSelector: "spec.nodeName=" + victim})
			if err != nil || len(pods.Items) != 1 {
				return false, fmt.Sprint(err), nil
			}
			for _, c := range pods.Items[0].Status.Conditions {
				if c.Type == corev1.PodReady {
					return c.Status != corev1.ConditionTrue, string(c.Status), nil
				}
			}
			return false, "no Ready condition", nil
		})
		rep, _, err := p.postcheck()
		p.expectFailing(rep, err, map[string]string{postcheck.CheckNodesReady: "NotReady: " + victim, postcheck.CheckTalosHealth: "kube-proxy to report ready"})
		kc.ResumeHeartbeat(ctx, victim)
		waitFor(t, victim+" Ready again", func(ctx context.Context) (bool, string, error) {
			_, notReady, err := kube.NodeStatus(ctx, cs, []string{victim})
			return len(notReady) == 0, "", err
		})
	})

	t.Run("control plane component not Ready", func(t *testing.T) {
		// The kubelet's mirror of cp-1's scheduler reports not Ready:
		// talosctl health's "all control plane components to be ready"
		// (K8sFullControlPlaneAssertion) fails on it.
		name := "kube-scheduler-cp-1"
		pod, err := cs.CoreV1().Pods("kube-system").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the lab shows no mirror pod of cp-1's scheduler: %v", err)
		}
		if pod.Labels["k8s-app"] != "kube-scheduler" || pod.Spec.NodeName != "cp-1" || pod.Annotations["kubernetes.io/config.mirror"] == "" {
			t.Errorf("mirror pod %s: labels %v, node %q, annotations %v", name, pod.Labels, pod.Spec.NodeName, pod.Annotations)
		}
		setReady := func(status corev1.ConditionStatus) {
			t.Helper()
			pod, err := cs.CoreV1().Pods("kube-system").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for i := range pod.Status.Conditions {
				if pod.Status.Conditions[i].Type == corev1.PodReady {
					pod.Status.Conditions[i].Status = status
				}
			}
			if _, err := cs.CoreV1().Pods("kube-system").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		setReady(corev1.ConditionFalse)
		rep, _, err := p.postcheck()
		p.expectOnly(rep, err, postcheck.CheckTalosHealth, "all control plane components to be ready: kube-scheduler not Ready: "+name)
		setReady(corev1.ConditionTrue)
	})

	t.Run("node not in the config", func(t *testing.T) {
		// A Node no config entry accounts for (a machine removed from the
		// config, or joined by hand): talosctl health matches nodes by
		// address and fails on one left over.
		kc, _ := l.Kube.Cluster()
		if err := kc.RegisterNode(ctx, "stray", "127.0.0.99", labkube.RoleWorker); err != nil {
			t.Fatal(err)
		}
		rep, _, err := p.postcheck()
		p.expectOnly(rep, err, postcheck.CheckTalosHealth, "unexpected nodes, registered but not in the config: stray (127.0.0.99)")
		if err := cs.CoreV1().Nodes().Delete(ctx, "stray", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("default annotation removed", func(t *testing.T) {
		if err := infra.Demote(ctx, cs, "nfs-storage"); err != nil {
			t.Fatal(err)
		}
		rep, _, err := p.postcheck()
		p.expectOnly(rep, err, postcheck.CheckDefaultClass, "no default StorageClass: nfs-storage lacks the is-default-class annotation")
		infra.MakeDefault(ctx, cs, "nfs-storage")
	})

	t.Run("GitRepository on a missing branch", func(t *testing.T) {
		rc, _ := kube.RESTConfig(cfg.Paths().Kubeconfig)
		dyn, err := dynamic.NewForConfig(rc)
		if err != nil {
			t.Fatal(err)
		}
		repos := dyn.Resource(flux.GitRepositoryGVR).Namespace("flux-system")
		patch := func(branch string) {
			body := fmt.Sprintf(`{"spec":{"ref":{"branch":%q}}}`, branch)
			if _, err := repos.Patch(ctx, "flux-system", types.MergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		readyIs := func(want bool) func(context.Context) (bool, string, error) {
			return func(ctx context.Context) (bool, string, error) {
				u, err := repos.Get(ctx, "flux-system", metav1.GetOptions{})
				if err != nil {
					return false, "", err
				}
				r := flux.ReadinessOf(u)
				return r.Ready == want && (want || r.Detail != "no Ready condition yet"), r.Detail, nil
			}
		}
		patch("does-not-exist")
		waitFor(t, "GitRepository not Ready", readyIs(false))
		rep, _, err := p.postcheck()
		p.expectOnly(rep, err, postcheck.CheckFlux, "GitRepository not Ready")
		patch("main")
		waitFor(t, "GitRepository Ready again", readyIs(true))
	})

	t.Run("provisioner scaled to 0", func(t *testing.T) {
		scale := func(n int) {
			deps, err := cs.AppsV1().Deployments(stages.NFSNamespace).List(ctx, metav1.ListOptions{})
			if err != nil || len(deps.Items) != 1 {
				t.Fatalf("provisioner Deployment: %v", err)
			}
			body := fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)
			if _, err := cs.AppsV1().Deployments(stages.NFSNamespace).Patch(ctx, deps.Items[0].Name, types.MergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		scale(0)
		waitFor(t, "the provisioner to stop serving", func(context.Context) (bool, string, error) {
			return len(l.Provisioner().Serving()) == 0, fmt.Sprint(l.Provisioner().NotServing()), nil
		})
		rep, _, err := p.postcheck()
		p.expectOnly(rep, err, postcheck.CheckNFS, "phase Pending")
		scale(1)
		waitFor(t, "the provisioner Available again", func(ctx context.Context) (bool, string, error) {
			deps, err := cs.AppsV1().Deployments(stages.NFSNamespace).List(ctx, metav1.ListOptions{})
			if err != nil || len(deps.Items) != 1 {
				return false, "", err
			}
			ok, st := kube.DeploymentAvailable(&deps.Items[0])
			return ok, st, nil
		})
		rep, _, err = p.postcheck()
		p.expectOnly(rep, err, "", "")
	})

	// Retention: postcheck.keep archives and no more; beside them the
	// history page, which shows exactly those.
	entries, _ := os.ReadDir(filepath.Join(cfg.Paths().StateDir, "postcheck"))
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		} else if e.Name() != postcheck.HistoryPage {
			t.Errorf("postcheck/ holds %s", e.Name())
		}
	}
	if p.runs < 3 || len(dirs) != 2 {
		t.Errorf("%d postchecks left %d archives, want 2", p.runs, len(dirs))
	}
	nights, err := postcheck.ReadNights(filepath.Join(cfg.Paths().StateDir, "postcheck"), postcheck.HistoryNights)
	if err != nil || len(nights) != 2 || p.st.Outputs.Postcheck.Page == "" {
		t.Errorf("the history page shows %d nights (%v), page %q", len(nights), err, p.st.Outputs.Postcheck.Page)
	}

	// Cron overlap: a nightly postcheck while a run holds the lock exits 3.
	lock, err := state.Acquire(cfg.Paths().StateDir, state.Holder{PID: os.Getpid(), Command: "bootstrap run --stage all", Started: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(testbin.Bootstrap(t), "run", "--config", l.ConfigPath(), "--stage", "postcheck")
	out, err := cmd.CombinedOutput()
	lock.Release()
	if cmd.ProcessState.ExitCode() != 3 || !strings.Contains(string(out), "another bootstrap run holds the lock") {
		t.Fatalf("cron overlap: exit %d: %v\n%s", cmd.ProcessState.ExitCode(), err, out)
	}
}
