package kube_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
)

// poll waits for cond with the project's bounded wait.
func poll(t *testing.T, what string, timeout time.Duration, cond func(ctx context.Context) (bool, string, error)) {
	t.Helper()
	err := wait.Until(context.Background(), wait.Spec{What: what, Timeout: timeout, Interval: 200 * time.Millisecond, Log: kubetest.Logger(t)}, cond)
	if err != nil {
		t.Fatal(err)
	}
}

func nodeReady(ctx context.Context, cs kubernetes.Interface, name string) corev1.ConditionStatus {
	n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return kube.NodeReady(n)
}

func TestControlPlane(t *testing.T) {
	ctx := context.Background()
	bundle := kubetest.NewBundle(t)
	pki, err := kube.PKIFromBundle(bundle)
	if err != nil {
		t.Fatal(err)
	}
	host := kubetest.LoopbackIP()
	endpoint := "https://" + host + ":6443"
	c := kubetest.Start(t, kube.Options{
		ClusterName:            "lab-test",
		Endpoint:               endpoint,
		PKI:                    pki,
		NodeLeaseDuration:      4 * time.Second,
		NodeMonitorGracePeriod: 10 * time.Second,
	})
	t.Logf("MEASURE lab start (no Flux): %s", c.StartupTime().Round(10*time.Millisecond))
	if c.Server() != endpoint {
		t.Fatalf("server %s, want the loopback endpoint %s", c.Server(), endpoint)
	}

	// The kubeconfig a user gets, written and read back as the talos stage does.
	kcData, err := c.Kubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	kcPath := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kcPath, kcData, 0o600); err != nil {
		t.Fatal(err)
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", kcPath)
	if err != nil {
		t.Fatal(err)
	}
	if restCfg.Host != endpoint {
		t.Errorf("kubeconfig server %s, want %s", restCfg.Host, endpoint)
	}
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		t.Fatal(err)
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version through the Talos-style kubeconfig: %v", err)
	}
	if v.GitVersion != c.KubernetesVersion() {
		t.Errorf("server reports %s, want %s", v.GitVersion, c.KubernetesVersion())
	}

	t.Run("serving certificate", func(t *testing.T) {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pki.CACertPEM)
		conn, err := tls.Dial("tcp", net.JoinHostPort(host, "6443"), &tls.Config{RootCAs: pool, ServerName: host})
		if err != nil {
			t.Fatalf("TLS to the API server verifying against the bundle's CA: %v", err)
		}
		leaf := conn.ConnectionState().PeerCertificates[0]
		conn.Close()
		var ips []string
		for _, ip := range leaf.IPAddresses {
			ips = append(ips, ip.String())
		}
		for _, want := range []string{host, "127.0.0.1", "10.96.0.1"} {
			if !slices.Contains(ips, want) {
				t.Errorf("serving cert IP SANs %v miss %s", ips, want)
			}
		}
	})

	t.Run("foreign CA rejected", func(t *testing.T) {
		other := kubetest.PKI(t)
		foreign, err := kube.IssueKubeconfig("lab-test", endpoint, other.CACertPEM, other.CAKeyPEM, 0)
		if err != nil {
			t.Fatal(err)
		}
		fc, err := clientcmd.RESTConfigFromKubeConfig(foreign)
		if err != nil {
			t.Fatal(err)
		}
		fc.CAData = pki.CACertPEM // trust the server, present a client cert from another CA
		fcs := kubernetes.NewForConfigOrDie(fc)
		_, err = fcs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if !apierrors.IsUnauthorized(err) {
			t.Errorf("client cert from another CA: got %v, want 401 Unauthorized", err)
		}
	})

	nodes := []struct {
		name, ip string
		role     kube.Role
	}{
		{"cp-1", "10.5.0.11", kube.RoleControlPlane},
		{"w-1", "10.5.0.21", kube.RoleWorker},
		{"w-2", "10.5.0.22", kube.RoleWorker},
	}
	for _, n := range nodes {
		if err := c.RegisterNode(ctx, n.name, n.ip, n.role); err != nil {
			t.Fatal(err)
		}
	}
	regStart := time.Now()
	poll(t, "3 nodes Ready (seen through the Talos-style kubeconfig)", 30*time.Second, func(ctx context.Context) (bool, string, error) {
		var notReady []string
		for _, n := range nodes {
			if nodeReady(ctx, cs, n.name) != corev1.ConditionTrue {
				notReady = append(notReady, n.name)
			}
		}
		return len(notReady) == 0, "not Ready: " + strings.Join(notReady, ","), nil
	})
	t.Logf("MEASURE nodes Ready %s after registration", time.Since(regStart).Round(10*time.Millisecond))
	for _, n := range nodes {
		node, err := cs.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var internal string
		for _, a := range node.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = a.Address
			}
		}
		if internal != n.ip {
			t.Errorf("%s InternalIP %q, want %s", n.name, internal, n.ip)
		}
		_, isCP := node.Labels[kube.LabelControlPlane]
		_, isWorker := node.Labels[kube.LabelWorker]
		if isCP != (n.role == kube.RoleControlPlane) || isWorker != (n.role == kube.RoleWorker) {
			t.Errorf("%s role labels %v, want role %s", n.name, node.Labels, n.role)
		}
		tainted := slices.ContainsFunc(node.Spec.Taints, func(tt corev1.Taint) bool { return tt.Key == kube.LabelControlPlane })
		if tainted != (n.role == kube.RoleControlPlane) {
			t.Errorf("%s control-plane taint = %v", n.name, tainted)
		}
	}
	if err := c.RegisterNode(ctx, "cp-1", "10.5.0.11", kube.RoleControlPlane); err != nil {
		t.Errorf("registering an existing node again: %v", err)
	}

	t.Run("deployment runs", func(t *testing.T) {
		replicas := int32(3)
		labels := map[string]string{"app": "hello"}
		dep := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default"},
			Spec: appsv1.DeploymentSpec{
				Replicas: &replicas,
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "hello", Image: "registry.k8s.io/pause:3.10"}}},
				},
			},
		}
		start := time.Now()
		if _, err := cs.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(t, "3 hello pods Running", 60*time.Second, func(ctx context.Context) (bool, string, error) {
			pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=hello"})
			if err != nil {
				return false, err.Error(), nil
			}
			running := 0
			for _, p := range pods.Items {
				if p.Status.Phase == corev1.PodRunning {
					running++
				}
			}
			return running == 3 && len(pods.Items) == 3, fmt.Sprintf("%d/%d Running", running, len(pods.Items)), nil
		})
		t.Logf("MEASURE deployment Running %s after create", time.Since(start).Round(10*time.Millisecond))
		pods, _ := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=hello"})
		for _, p := range pods.Items {
			if p.Spec.NodeName == "cp-1" {
				t.Errorf("pod %s scheduled on the tainted control plane", p.Name)
			}
		}
		poll(t, "deployment hello Available", 30*time.Second, func(ctx context.Context) (bool, string, error) {
			d, err := cs.AppsV1().Deployments("default").Get(ctx, "hello", metav1.GetOptions{})
			if err != nil {
				return false, err.Error(), nil
			}
			return d.Status.AvailableReplicas == 3, fmt.Sprintf("%d available", d.Status.AvailableReplicas), nil
		})
	})

	t.Run("heartbeat stops and resumes", func(t *testing.T) {
		if err := c.StopHeartbeat(ctx, "w-2"); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		poll(t, "w-2 Ready=Unknown after its heartbeat stopped", 60*time.Second, func(ctx context.Context) (bool, string, error) {
			st := nodeReady(ctx, cs, "w-2")
			return st == corev1.ConditionUnknown, "Ready=" + string(st), nil
		})
		t.Logf("MEASURE w-2 NotReady %s after its heartbeat stopped", time.Since(start).Round(10*time.Millisecond))
		for _, n := range []string{"cp-1", "w-1"} {
			if st := nodeReady(ctx, cs, n); st != corev1.ConditionTrue {
				t.Errorf("%s Ready=%s while only w-2's heartbeat stopped", n, st)
			}
		}
		if err := c.ResumeHeartbeat(ctx, "w-2"); err != nil {
			t.Fatal(err)
		}
		poll(t, "w-2 Ready again after its heartbeat resumed", 60*time.Second, func(ctx context.Context) (bool, string, error) {
			st := nodeReady(ctx, cs, "w-2")
			return st == corev1.ConditionTrue, "Ready=" + string(st), nil
		})
	})

	if err := c.Healthy(ctx); err != nil {
		t.Errorf("Healthy: %v", err)
	}
	procs := c.Processes()
	if len(procs) != 5 {
		t.Errorf("processes %v, want etcd, apiserver, KCM, scheduler, kwok", procs)
	}
	dataDir := c.DataDir()
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if alive(p.PID) {
			t.Errorf("%s (pid %d) still running after Stop", p.Name, p.PID)
		}
	}
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("data dir %s left behind: %v", dataDir, err)
	}
	if err := c.Healthy(ctx); err == nil {
		t.Error("Healthy after Stop")
	}
}

// alive reports whether pid names a running (not zombie) process.
func alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return true
	}
	state := s[i+2]
	return state != 'Z' && state != 'X'
}

const childEnv = "BOOTSTRAP_LAB_KUBE_CHILD"

// TestChildStartsLab is the child side of TestNoSurvivorsWhenTestBinaryDies:
// it starts a lab, prints its PIDs and waits to be killed.
func TestChildStartsLab(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("helper for TestNoSurvivorsWhenTestBinaryDies")
	}
	c, err := kube.Start(context.Background(), kube.Options{PKI: kubetest.PKI(t), Log: kubetest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, p := range c.Processes() {
		pids = append(pids, p.PID)
	}
	out, _ := json.Marshal(map[string]any{"pids": pids, "dataDir": c.DataDir()})
	fmt.Printf("LABCHILD %s\n", out)
	time.Sleep(2 * time.Minute)
	t.Fatal("not killed within 2 minutes")
}

func TestNoSurvivorsWhenTestBinaryDies(t *testing.T) {
	kubetest.Binaries(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildStartsLab$", "-test.v", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() //nolint:errcheck // already dead on the normal path

	type childInfo struct {
		PIDs    []int  `json:"pids"`
		DataDir string `json:"dataDir"`
	}
	got := make(chan childInfo, 1)
	var transcript strings.Builder
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			transcript.WriteString(line + "\n")
			if rest, ok := strings.CutPrefix(line, "LABCHILD "); ok {
				var ci childInfo
				if json.Unmarshal([]byte(rest), &ci) == nil {
					got <- ci
				}
			}
		}
	}()
	var ci childInfo
	select {
	case ci = <-got:
	case <-time.After(3 * time.Minute):
		t.Fatalf("child never reported a started lab\nstdout:\n%s\nstderr:\n%s", transcript.String(), stderr.String())
	}
	t.Cleanup(func() {
		for _, pid := range ci.PIDs {
			if alive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		os.RemoveAll(ci.DataDir)
	})
	if len(ci.PIDs) != 5 {
		t.Fatalf("child reported pids %v, want 5", ci.PIDs)
	}
	for _, pid := range ci.PIDs {
		if !alive(pid) {
			t.Fatalf("pid %d not running before the child was killed", pid)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	poll(t, "every lab process gone after its parent was SIGKILLed", 15*time.Second, func(context.Context) (bool, string, error) {
		var left []string
		for _, pid := range ci.PIDs {
			if alive(pid) {
				left = append(left, fmt.Sprint(pid))
			}
		}
		return len(left) == 0, "still running: " + strings.Join(left, ","), nil
	})
}
