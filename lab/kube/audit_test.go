package kube_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
)

// TestAuditLogTellsWritersApart starts the API server with the writes
// policy: a create through a kubeconfig issued as Talos does is logged
// under "admin", the lab's own client under "lab-admin", a server-side dry
// run is marked as one, and reads are not logged at all.
func TestAuditLogTellsWritersApart(t *testing.T) {
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(kube.WritesAuditPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "audit.log")
	c := kubetest.Start(t, kube.Options{AuditPolicyFile: policy, AuditLogPath: logPath})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	kc, err := c.Kubeconfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(kc)
	if err != nil {
		t.Fatal(err)
	}
	cfg.UserAgent = "audit-test-user"
	user := kubernetes.NewForConfigOrDie(cfg)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "audited", Namespace: "default"}, Data: map[string]string{"a": "1"}}
	if _, err := user.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := user.CoreV1().ConfigMaps("default").Patch(ctx, "audited", types.MergePatchType, []byte(`{"data":{"a":"2"}}`),
		metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatal(err)
	}
	if _, err := user.CoreV1().ConfigMaps("default").Get(ctx, "audited", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Client().CoreV1().ConfigMaps("default").Delete(ctx, "audited", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	var got []kube.AuditEvent
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs, err := kube.ReadAuditLog(logPath)
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, e := range evs {
			if e.ObjectRef.Resource == "configmaps" && e.ObjectRef.Name == "audited" {
				got = append(got, e)
			}
		}
		if len(got) >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(got) != 3 {
		t.Fatalf("want create, dry-run patch and delete of the ConfigMap, got %v", got)
	}
	want := []struct {
		verb, user, agent string
		dryRun            bool
	}{
		{"create", kube.AdminUser, "audit-test-user", false},
		{"patch", kube.AdminUser, "audit-test-user", true},
		{"delete", kube.LabAdminUser, "", false},
	}
	for i, w := range want {
		e := got[i]
		if e.Verb != w.verb || e.User.Username != w.user || e.DryRun() != w.dryRun || (w.agent != "" && e.UserAgent != w.agent) {
			t.Errorf("event %d = %s (dry run %v), want %s by %s (%s), dry run %v", i, e, e.DryRun(), w.verb, w.user, w.agent, w.dryRun)
		}
	}
}
