package flux

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/homelab/bootstrap/gitsnap"
	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
)

// TestSyncAgainstRealFlux applies the GitRepository and Kustomization to a
// real API server where the real source-controller and kustomize-controller
// run, pointed at a snapshot served by gitsnap, and waits for the objects
// under ./infra to appear. A second apply must change nothing.
func TestSyncAgainstRealFlux(t *testing.T) {
	lab := kubetest.Start(t, kube.Options{Flux: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	repo := t.TempDir()
	os.MkdirAll(filepath.Join(repo, "infra"), 0o755)
	os.WriteFile(filepath.Join(repo, "infra", "kustomization.yaml"), []byte("resources: [cm.yaml]\n"), 0o644)
	os.WriteFile(filepath.Join(repo, "infra", "cm.yaml"), []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: from-git\n  namespace: default\ndata:\n  hello: world\n"), 0o644)
	if out, err := exec.Command("git", "-C", repo, "init", "-q", "-b", "main").CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String() + "/homelab.git"
	srv, err := gitsnap.NewServer(ctx, gitsnap.ServerOptions{Build: gitsnap.BuildOptions{Dir: repo, Branch: "main"}, URL: url, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ctx, l, nil)

	c, err := NewClient(lab.AdminKubeconfigPath(), kubetest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := SyncObjects(SyncOptions{Name: "flux-system", Namespace: "flux-system", URL: url, Branch: "main", Path: "./infra", Interval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lab.Client().CoreV1().Namespaces().Get(ctx, "flux-system", metav1.GetOptions{}); err != nil {
		t.Fatalf("the lab with Flux must have flux-system: %v", err)
	}
	plan, err := c.Plan(ctx, objs)
	if err != nil || len(plan) != 2 {
		t.Fatalf("first plan: %+v %v", plan, err)
	}
	if _, err := c.Apply(ctx, objs, time.Minute); err != nil {
		t.Fatal(err)
	}
	want := srv.Snapshot().Revision()
	if err := c.WaitReady(ctx, "flux-system", "flux-system", want, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	cm, err := lab.Client().CoreV1().ConfigMaps("default").Get(ctx, "from-git", metav1.GetOptions{})
	if err != nil || cm.Data["hello"] != "world" {
		t.Fatalf("object under ./infra not applied: %v", err)
	}
	if plan, err := c.Plan(ctx, objs); err != nil || len(plan) != 0 {
		t.Fatalf("re-plan on a converged cluster: %+v %v", plan, err)
	}
	repoR, ks, err := c.Status(ctx, "flux-system", "flux-system")
	if err != nil || !repoR.Ready || ks.Revision != want {
		t.Fatalf("status: %+v %+v %v", repoR, ks, err)
	}
}
