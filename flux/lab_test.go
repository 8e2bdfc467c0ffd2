package flux

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/homelab/bootstrap/gitsnap"
	"github.com/homelab/bootstrap/internal/testcert"
	"github.com/homelab/bootstrap/internal/wait"
	"github.com/homelab/bootstrap/lab/gitssh"
	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m)) }

// fluxLab is the lab with the Flux controllers the package's lab tests
// share, one after another (none is parallel: the layouts test waits for
// every Kustomization and HelmRelease of the cluster). Each test names
// its own objects (its own CRD group, namespaces, sync pair) and deletes
// the sync pairs it made (removeSync), whose sources end with the test.
func fluxLab(t *testing.T) *kube.Cluster {
	return kubetest.Shared(t, "flux", kube.Options{Flux: true})
}

// removeSync deletes the GitRepository and Kustomization flux-system/name
// when the test ends and waits until they are gone: their source is a
// server of the test, and a later test waits for every Kustomization.
func removeSync(t *testing.T, c *Client, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, gvk := range []schema.GroupVersionKind{KustomizationGVK, GitRepositoryGVK} {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(gvk)
			u.SetNamespace("flux-system")
			u.SetName(name)
			if err := c.kube.Delete(ctx, u); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("removing %s flux-system/%s: %v", gvk.Kind, name, err)
				continue
			}
			err := wait.Until(ctx, wait.Spec{What: gvk.Kind + " flux-system/" + name + " gone", Timeout: time.Minute, Interval: 100 * time.Millisecond},
				func(ctx context.Context) (bool, string, error) {
					err := c.kube.Get(ctx, client.ObjectKeyFromObject(u), u.DeepCopy())
					if apierrors.IsNotFound(err) {
						return true, "", nil
					}
					return false, "still there", nil
				})
			if err != nil {
				t.Error(err)
			}
		}
	})
}

// TestSyncAgainstRealFlux applies the GitRepository and Kustomization to a
// real API server where the real source-controller and kustomize-controller
// run, pointed at a snapshot served by gitsnap, and waits for the objects
// under ./infra to appear. A second apply must change nothing.
func TestSyncAgainstRealFlux(t *testing.T) {
	lab := fluxLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	repo := infraTree(t, "from-git", "hello", "world", false)
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

	// The dry runs the client asks for, counted on the wire.
	var dryRuns atomic.Int32
	rc := lab.RESTConfig()
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.URL.Query().Has("dryRun") {
				dryRuns.Add(1)
			}
			return rt.RoundTrip(req)
		})
	})
	c, err := NewClient(rc, kubetest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := SyncObjects(SyncOptions{Name: "sync-http", Namespace: "flux-system", URL: url, Branch: "main", Path: "./infra", Interval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	removeSync(t, c, "sync-http")
	if _, err := lab.Client().CoreV1().Namespaces().Get(ctx, "flux-system", metav1.GetOptions{}); err != nil {
		t.Fatalf("the lab with Flux must have flux-system: %v", err)
	}
	plan, err := c.Plan(ctx, objs)
	if err != nil || len(plan) != 2 {
		t.Fatalf("first plan: %+v %v", plan, err)
	}
	// Objects a list shows absent are planned as created without a dry
	// run each (Plan's lists).
	if n := dryRuns.Load(); n != 0 {
		t.Fatalf("the first plan asked %d dry runs for objects that do not exist", n)
	}
	// Long enough for the lab to restart a controller whose reconcilers
	// never started (docs/lab.md).
	if _, err := c.Apply(ctx, objs, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	want := srv.Snapshot().Revision()
	if err := c.WaitReady(ctx, "flux-system", "sync-http", want, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	cm, err := lab.Client().CoreV1().ConfigMaps("default").Get(ctx, "from-git", metav1.GetOptions{})
	if err != nil || cm.Data["hello"] != "world" {
		t.Fatalf("object under ./infra not applied: %v", err)
	}
	dryRuns.Store(0)
	if plan, err := c.Plan(ctx, objs); err != nil || len(plan) != 0 {
		t.Fatalf("re-plan on a converged cluster: %+v %v", plan, err)
	}
	if n := dryRuns.Load(); n != int32(len(objs)) {
		t.Fatalf("the re-plan asked %d dry runs for %d existing objects", n, len(objs))
	}
	repoR, ks, err := c.Status(ctx, "flux-system", "sync-http")
	if err != nil || !repoR.Ready || ks.Revision != want {
		t.Fatalf("status: %+v %+v %v", repoR, ks, err)
	}
}

// TestSSHSyncAgainstRealFlux: the real source-controller clones over
// ssh:// from the lab's SSH git server (real `git upload-pack`) with the
// Secret AuthSecret builds (deploy key and known_hosts), and the
// precheck's remote lookup verifies the same host key. The same source
// with a Secret lacking known_hosts is refused by source-controller
// itself, which is why config validate requires the file.
func TestSSHSyncAgainstRealFlux(t *testing.T) {
	lab := fluxLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	repo := infraTree(t, "over-ssh", "via", "ssh", true)
	head, err := exec.Command("git", "-C", repo, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	srv, err := gitssh.Start(gitssh.Options{Repos: map[string]string{"/homelab.git": repo}, Log: kubetest.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	key, err := srv.DeployKey()
	if err != nil {
		t.Fatal(err)
	}
	url := srv.URL("/homelab.git")

	// The precheck's lookup: the host key is checked against known_hosts.
	kh := filepath.Join(t.TempDir(), "known_hosts")
	os.WriteFile(kh, srv.KnownHosts(), 0o600)
	got, err := RemoteBranchHead(ctx, url, "main", Credentials{SSHKey: key}, kh)
	if err != nil || got != strings.TrimSpace(string(head)) {
		t.Fatalf("remote head over SSH: %q %v, want %s", got, err, head)
	}
	wrong := filepath.Join(t.TempDir(), "known_hosts")
	other, _ := gitssh.Start(gitssh.Options{Log: kubetest.Logger(t)})
	// Another server's key under this server's address ([127.0.0.1]:port).
	port := func(s *gitssh.Server) string { return s.URL("")[strings.LastIndex(s.URL(""), ":"):] }
	os.WriteFile(wrong, []byte(strings.Replace(string(other.KnownHosts()), "]"+port(other), "]"+port(srv), 1)), 0o600)
	other.Close()
	if _, err := RemoteBranchHead(ctx, url, "main", Credentials{SSHKey: key}, wrong); err == nil || !strings.Contains(err.Error(), "key mismatch") {
		t.Fatalf("a host key other than the one in known_hosts: %v", err)
	}
	if _, err := AuthSecret("no-hosts", "flux-system", Credentials{SSHKey: key}); err == nil {
		t.Fatal("AuthSecret wrote an SSH Secret without known_hosts")
	}

	c, err := NewClient(lab.RESTConfig(), kubetest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	syncWithSecret(t, ctx, c, "sync-ssh", url, Credentials{SSHKey: key, KnownHosts: srv.KnownHosts()}, "main@sha1:"+strings.TrimSpace(string(head)))
	if cm, err := lab.Client().CoreV1().ConfigMaps("default").Get(ctx, "over-ssh", metav1.GetOptions{}); err != nil || cm.Data["via"] != "ssh" {
		t.Fatalf("object under ./infra not applied over SSH: %v", err)
	}

	// What a config without known_hosts would have produced.
	bare := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "no-known-hosts", Namespace: "flux-system"}, Data: map[string][]byte{"identity": key}}
	if _, err := lab.Client().CoreV1().Secrets("flux-system").Create(ctx, bare, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	objs, err := SyncObjects(SyncOptions{Name: "no-known-hosts", Namespace: "flux-system", URL: url, Branch: "main", Path: "./infra", Interval: time.Minute, SecretName: "no-known-hosts"})
	if err != nil {
		t.Fatal(err)
	}
	// Created without Apply's wait: it would wait for a Ready that never comes.
	removeSync(t, c, "no-known-hosts")
	if err := c.kube.Create(ctx, objs[0]); err != nil {
		t.Fatal(err)
	}
	var verdict string
	err = wait.Until(ctx, wait.Spec{What: "source-controller's verdict on an SSH Secret without known_hosts", Timeout: time.Minute, Interval: 250 * time.Millisecond},
		func(ctx context.Context) (bool, string, error) {
			r, _, err := c.Status(ctx, "flux-system", "no-known-hosts")
			if r.Detail == "" && err != nil {
				return false, err.Error(), nil
			}
			if r.Ready {
				return false, "", fmt.Errorf("source-controller cloned over SSH without known_hosts")
			}
			verdict = r.Detail
			return strings.Contains(r.Detail, "known_hosts"), r.Detail, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("source-controller without known_hosts: %s", verdict)
}

// TestSnapshotOverTLSWithAuthAgainstRealFlux: the real source-controller
// clones from a snapshot server that requires the credential and speaks
// only HTTPS with a self-signed certificate, given the Secret AuthSecret
// builds (username, password, ca.crt).
func TestSnapshotOverTLSWithAuthAgainstRealFlux(t *testing.T) {
	lab := fluxLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	repo := infraTree(t, "over-tls", "via", "https", false)
	dir := t.TempDir()
	certFile, keyFile := testcert.SelfSigned(t, dir)
	auth, _, err := gitsnap.EnsureAuth(dir)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "https://" + l.Addr().String() + "/homelab.git"
	srv, err := gitsnap.NewServer(ctx, gitsnap.ServerOptions{Build: gitsnap.BuildOptions{Dir: repo, Branch: "main"}, URL: url,
		Auth: &auth, TLSCert: certFile, TLSKey: keyFile, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ctx, l, nil)

	c, err := NewClient(lab.RESTConfig(), kubetest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := os.ReadFile(certFile)
	syncWithSecret(t, ctx, c, "sync-tls", url, Credentials{Username: auth.Username, Token: auth.Password, CA: ca}, srv.Snapshot().Revision())
	if cm, err := lab.Client().CoreV1().ConfigMaps("default").Get(ctx, "over-tls", metav1.GetOptions{}); err != nil || cm.Data["via"] != "https" {
		t.Fatalf("object under ./infra not applied over HTTPS: %v", err)
	}
}

// infraTree makes a git work tree whose ./infra holds one ConfigMap
// (default/name with key: value), on branch main; committed when the
// server needs a real commit (upload-pack), left as a work tree when the
// snapshot server builds its own.
func infraTree(t *testing.T, name, key, value string, commit bool) string {
	t.Helper()
	repo := t.TempDir()
	os.MkdirAll(filepath.Join(repo, "infra"), 0o755)
	os.WriteFile(filepath.Join(repo, "infra", "kustomization.yaml"), []byte("resources: [cm.yaml]\n"), 0o644)
	os.WriteFile(filepath.Join(repo, "infra", "cm.yaml"), []byte(fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: %s\n  namespace: default\ndata:\n  %s: %s\n", name, key, value)), 0o644)
	cmds := [][]string{{"init", "-q", "-b", "main"}}
	if commit {
		cmds = append(cmds, []string{"add", "."}, []string{"-c", "user.name=lab", "-c", "user.email=lab@example.invalid", "commit", "-q", "-m", "infra"})
	}
	for _, args := range cmds {
		if out, err := exec.Command("git", append([]string{"-C", repo}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	return repo
}

// syncWithSecret applies the Secret AuthSecret builds from cr with the
// GitRepository and Kustomization flux-system/name for url, and waits
// until both are Ready at revision; they are removed when the test ends.
func syncWithSecret(t *testing.T, ctx context.Context, c *Client, name, url string, cr Credentials, revision string) {
	t.Helper()
	secret, err := AuthSecret(name, "flux-system", cr)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := SyncObjects(SyncOptions{Name: name, Namespace: "flux-system", URL: url, Branch: "main", Path: "./infra", Interval: time.Minute, SecretName: name})
	if err != nil {
		t.Fatal(err)
	}
	removeSync(t, c, name)
	// The apply waits for the sync pair too: long enough for the lab to
	// restart a controller whose reconcilers never started (docs/lab.md).
	if _, err := c.Apply(ctx, append([]*unstructured.Unstructured{secret}, objs...), 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx, "flux-system", name, revision, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
