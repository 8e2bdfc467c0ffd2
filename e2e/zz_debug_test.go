package e2e_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/homelab/bootstrap/e2e"
)

func TestZZDebugInfra(t *testing.T) {
	ctx := testContext(t, 5*time.Minute)
	h := startHarness(t, e2e.Options{ControlPlanes: 1, Profile: "n100", TimeScale: 0.1})
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(200 * time.Millisecond):
			}
			kc, err := h.Lab.Kube.Cluster()
			if err != nil {
				continue
			}
			pods, _ := kc.Client().CoreV1().Pods("nfs-provisioner").List(context.Background(), metav1.ListOptions{})
			for _, p := range pods.Items {
				var cs []string
				for _, c := range p.Status.Conditions {
					cs = append(cs, string(c.Type)+"="+string(c.Status)+":"+c.Reason+":"+c.Message)
				}
				t.Logf("%s pod node=%q phase=%s %v", time.Now().Format("15:04:05.000"), p.Spec.NodeName, p.Status.Phase, cs)
			}
			nodes, _ := kc.Client().CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
			for _, n := range nodes.Items {
				t.Logf("%s   node %s taints=%v", time.Now().Format("15:04:05.000"), n.Name, n.Spec.Taints)
			}
		}
	}()
	r := run(t, ctx, h, "run", "--stage", "all")
	close(done)
	if r.ExitCode != 0 {
		t.Fatal(r.Tail(20))
	}
	kc, _ := h.Lab.Kube.Cluster()
	evs, _ := kc.Client().CoreV1().Events("nfs-provisioner").List(ctx, metav1.ListOptions{})
	for _, e := range evs.Items {
		t.Logf("event %s %s %s: %s", e.LastTimestamp.Format("15:04:05"), e.InvolvedObject.Name, e.Reason, e.Message)
	}
	for _, p := range kc.Processes() {
		if strings.Contains(p.Name, "sched") || p.Name == "kwok" {
			t.Logf("%s: %s", p.Name, p.LogPath)
			out, _ := exec.Command("tail", "-40", p.LogPath).Output()
			t.Logf("%s", out)
		}
	}
	t.Fail()
}
