package lab_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/homelab/bootstrap/config"
	"github.com/homelab/bootstrap/internal/redact"
	"github.com/homelab/bootstrap/kube"
	"github.com/homelab/bootstrap/lab"
	labkube "github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
	"github.com/homelab/bootstrap/lab/talossim"
	"github.com/homelab/bootstrap/stages"
	"github.com/homelab/bootstrap/state"
	"github.com/homelab/bootstrap/ui"
)

// TestTalosStageStartsRealControlPlane runs the talos stage against the
// Talos simulator whose Bootstrap starts the lab's real control plane, then
// uses the kubeconfig the stage fetched, as a user would.
func TestTalosStageStartsRealControlPlane(t *testing.T) {
	bins := kubetest.Binaries(t)
	prefix, err := talossim.RandomLoopbackPrefix(50000)
	if err != nil {
		t.Fatal(err)
	}
	ip := func(last byte) string { return talossim.HostAddr(prefix, last) }
	dir := t.TempDir()
	yaml := fmt.Sprintf(`cluster:
  name: rehearsal
  endpoint: https://%[1]s:6443
  # The stock installer: these tests are not about Image Factory images.
  installImage: ghcr.io/siderolabs/installer:v1.13.3
  timeouts: {call: 5s, install: 30s, bootstrap: 90s, health: 90s}
  network: {cidr: %[4]s, gateway: %[5]s, nameservers: [%[5]s]}
nodes:
  - {name: cp-1, role: controlplane, vmid: 701, ip: %[1]s, cores: 2, memoryMiB: 4096, diskGiB: 32}
  - {name: wk-1, role: worker, vmid: 711, ip: %[2]s, cores: 2, memoryMiB: 4096, diskGiB: 32}
  - {name: wk-2, role: worker, vmid: 712, ip: %[3]s, cores: 2, memoryMiB: 4096, diskGiB: 32}
`, ip(11), ip(21), ip(22), prefix, ip(1))
	cfg, err := config.Parse(filepath.Join(dir, "bootstrap.yaml"), []byte(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}

	cp := lab.NewControlPlane(labkube.Options{BinDir: bins.Dir, Log: kubetest.Logger(t)})
	sim := talossim.New(talossim.Options{Cluster: cp, Log: zerolog.New(zerolog.NewTestWriter(t))})
	t.Cleanup(func() { sim.Close() })
	for _, n := range cfg.Nodes {
		if _, err := sim.BootNode(context.Background(), talossim.NodeSpec{IP: n.IP, Hostname: n.Name, Disks: []talossim.Disk{{Bus: "scsi", Size: 32 << 30}}}); err != nil {
			t.Fatal(err)
		}
	}

	var out bytes.Buffer
	log := kubetest.Logger(t)
	env := &stages.Env{Config: cfg, Paths: cfg.Paths(), State: state.New("rehearsal"), Log: log, UI: ui.NewReporter(log), Out: &out,
		Secrets: &redact.Set{}, Now: time.Now}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	stage := stages.TalosStage{}
	started := time.Now()
	var kc *labkube.Cluster
	t.Cleanup(func() {
		if kc == nil {
			return
		}
		procs := kc.Processes()
		if err := cp.Stop(); err != nil {
			t.Errorf("stopping the lab: %v", err)
		}
		for _, p := range procs {
			if err := syscall.Kill(p.PID, 0); err == nil {
				t.Errorf("%s (pid %d) survived the lab's stop", p.Name, p.PID)
			}
		}
	})
	if err := stage.Run(ctx, env); err != nil {
		if c, _ := cp.Cluster(); c != nil {
			kc = c
			t.Logf("lab logs:\n%s", c.LogTail(40))
		}
		t.Fatal(err)
	}
	kc, err = cp.Cluster()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("talos stage converged with a real control plane in %s (lab start %s)", time.Since(started).Round(10*time.Millisecond), kc.StartupTime().Round(10*time.Millisecond))

	// From here on only what a user has: the kubeconfig the stage wrote.
	kubeconfig := cfg.Paths().Kubeconfig
	if fi, err := os.Stat(kubeconfig); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig %s: %v", kubeconfig, err)
	}
	cs, _, err := kube.Clientset(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := kube.WaitNodesReady(ctx, cs, []string{"cp-1", "wk-1", "wk-2"}, time.Minute, log); err != nil {
		t.Fatal(err)
	}
	node, err := cs.CoreV1().Nodes().Get(ctx, "wk-1", metav1.GetOptions{})
	if err != nil || node.Status.Addresses[0].Address != ip(21) {
		t.Fatalf("wk-1 registered without its InternalIP: %v %+v", err, node.Status.Addresses)
	}

	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(3)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "registry.k8s.io/pause:3.10"}}},
			},
		},
	}
	if _, err := cs.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.WaitDeploymentAvailable(ctx, cs, "default", "web", time.Minute, log); err != nil {
		t.Fatal(err)
	}
	pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.Spec.NodeName != "" {
			running++
		}
	}
	if running != 3 {
		t.Fatalf("%d/3 pods Running and scheduled", running)
	}
}
