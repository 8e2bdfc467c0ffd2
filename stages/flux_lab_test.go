package stages

import (
	"context"
	"github.com/homelab/bootstrap/config"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/homelab/bootstrap/gitsnap"
)

// TestFluxStageOnTheLab covers issue 8's flux part against the real Flux
// controllers: install from the manifests source, serve the local tree as
// a snapshot, sync ./infra, and a re-run that applies nothing.
func TestFluxStageOnTheLab(t *testing.T) {
	l := newFluxLab(t)
	ctx := context.Background()

	env, err := l.runStage(FluxStage{}, true)
	if err != nil {
		t.Fatal(err)
	}
	if got := changeList(env); !strings.Contains(got, "install Flux v2.9.5 ("+strings.Join(l.cfg.Flux.Components, ", ")+") from "+l.flux.URL()) || !strings.Contains(got, "serve git snapshot") {
		t.Fatalf("dry-run plan:\n%s", got)
	}
	if st, _ := gitsnap.Check(ctx, l.cfg.Paths().StateDir); st.State != nil {
		t.Fatal("a dry run started the snapshot server")
	}

	env, err = l.runStage(FluxStage{}, false)
	if err != nil {
		t.Fatal(err)
	}
	got := changeList(env)
	for _, want := range []string{"install Flux v2.9.5", "serve git snapshot", "sync http://127.0.0.1:"} {
		if !strings.Contains(got, want) {
			t.Fatalf("first run lacks %q:\n%s", want, got)
		}
	}
	if _, err := l.client().CoreV1().Namespaces().Get(ctx, "from-git", metav1.GetOptions{}); err != nil {
		t.Fatalf("the object under ./infra of the snapshot is not in the cluster: %v", err)
	}
	snap := l.st.Outputs.GitSnapshot
	if snap.PID == 0 || l.st.Outputs.Flux.Revision != "main@sha1:"+snap.Hash {
		t.Fatalf("outputs: flux %+v snapshot %+v", l.st.Outputs.Flux, snap)
	}
	// Flux got there with the cluster's credential; nobody else gets in.
	if _, err := os.Stat(filepath.Join(l.cfg.Paths().StateDir, gitsnap.AuthFileName)); err != nil {
		t.Fatalf("no snapshot credential: %v", err)
	}
	resp, err := http.Get(snap.URL + "/info/refs?service=git-upload-pack")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("anonymous request to the snapshot server: %s, want 401", resp.Status)
	}
	if sec, err := l.client().CoreV1().Secrets("flux-system").Get(ctx, "flux-system", metav1.GetOptions{}); err != nil || len(sec.Data["password"]) < 40 || string(sec.Data["username"]) != "flux" {
		t.Fatalf("the GitRepository's Secret: %v", err)
	}
	if strings.Contains(l.out.String(), string(mustAuth(t, l).Password)) {
		t.Fatal("the snapshot password is in the stage's output")
	}

	// Converged: nothing applied, the same server reused.
	env, err = l.runStage(FluxStage{}, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := changeList(env); got != "" {
		t.Fatalf("re-run changed things:\n%s", got)
	}
	if l.st.Outputs.GitSnapshot.PID != snap.PID {
		t.Fatal("re-run replaced the snapshot server")
	}

	// An edit in the work tree: a new snapshot, and Flux applies it.
	os.WriteFile(filepath.Join(l.git, "infra", "kustomization.yaml"), []byte("resources: [namespace.yaml, second.yaml]\n"), 0o644)
	os.WriteFile(filepath.Join(l.git, "infra", "second.yaml"), []byte("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: from-git-2\n"), 0o644)
	env, err = l.runStage(FluxStage{}, false)
	if err != nil {
		t.Fatal(err)
	}
	hashAfterEdit := l.st.Outputs.GitSnapshot.Hash
	if got := changeList(env); !strings.Contains(got, "serve git snapshot") || !strings.Contains(got, "ask Flux to fetch") || strings.Contains(got, "install Flux") {
		t.Fatalf("after an edit:\n%s", got)
	}
	if _, err := l.client().CoreV1().Namespaces().Get(ctx, "from-git-2", metav1.GetOptions{}); err != nil {
		t.Fatalf("the edit was not applied: %v", err)
	}

	// A Flux the Flux Operator manages (a FluxInstance on the cluster) is
	// never overwritten: the stage is refused as a user error, changing
	// nothing, even with an edit waiting to be served. The CRD is a
	// stand-in with the operator's group, version, kind and plural (the
	// stage only lists the kind).
	addFluxInstance(t, l)
	os.WriteFile(filepath.Join(l.git, "infra", "second.yaml"), []byte("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: from-git-3\n"), 0o644)
	for _, dry := range []bool{true, false} {
		env, err = l.runStage(FluxStage{}, dry)
		if err == nil || !config.IsUserError(err) || !strings.Contains(err.Error(), "managed by the Flux Operator (FluxInstance flux-system/flux)") {
			t.Fatalf("the flux stage over an operator-managed Flux (dry run %v): %v", dry, err)
		}
		if got := changeList(env); got != "" {
			t.Fatalf("the refused stage (dry run %v) changed:\n%s", dry, got)
		}
	}
	if l.st.Outputs.GitSnapshot.Hash != hashAfterEdit {
		t.Fatal("the refused stage re-snapshotted the tree")
	}
}

// addFluxInstance creates the Flux Operator's FluxInstance kind and the
// instance flux-system/flux.
func addFluxInstance(t *testing.T, l *kubeLab) {
	t.Helper()
	ctx := context.Background()
	ext, err := apiextensionsclient.NewForConfig(l.kube.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "fluxinstances.fluxcd.controlplane.io"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "fluxcd.controlplane.io",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "fluxinstances", Singular: "fluxinstance", Kind: "FluxInstance", ListKind: "FluxInstanceList"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: new(true)}}}},
		},
	}
	if _, err := ext.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, crd, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(l.kube.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: "fluxcd.controlplane.io", Version: "v1", Resource: "fluxinstances"}
	inst := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "fluxcd.controlplane.io/v1", "kind": "FluxInstance",
		"metadata": map[string]any{"name": "flux", "namespace": "flux-system"},
		"spec":     map[string]any{"distribution": map[string]any{"version": "2.x", "registry": "ghcr.io/fluxcd"}},
	}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := dyn.Resource(gvr).Namespace("flux-system").Create(ctx, inst, metav1.CreateOptions{})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("creating the FluxInstance: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // until the new kind is served
	}
}

func mustAuth(t *testing.T, l *kubeLab) gitsnap.BasicAuth {
	t.Helper()
	a, err := gitsnap.ReadAuth(filepath.Join(l.cfg.Paths().StateDir, gitsnap.AuthFileName))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestFluxStageReplacesAnUnauthenticatedSnapshotServer: a snapshot server
// an older bootstrap left running without the credential serves the same
// tree at the same address; the flux stage must not adopt it (anyone on
// the LAN could clone) but replace it with one that requires the
// credential.
func TestFluxStageReplacesAnUnauthenticatedSnapshotServer(t *testing.T) {
	l := newFluxLab(t)
	ctx := context.Background()
	ls := l.cfg.Flux.LocalSnapshot
	old, err := gitsnap.Start(ctx, gitsnap.StartOptions{
		Flags:    gitsnap.ServeFlags{Repo: l.cfg.Resolve(ls.Source), Listen: ls.Listen, URL: ls.URL, Branch: l.cfg.Flux.Branch, Interval: ls.Refresh.D(), Anonymous: true},
		StateDir: l.cfg.Paths().StateDir, Log: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := http.Get(ls.URL + "/info/refs?service=git-upload-pack"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the old server should answer anyone: %v %v", resp, err)
	}
	if _, err := l.runStage(FluxStage{}, false); err != nil {
		t.Fatal(err)
	}
	if l.st.Outputs.GitSnapshot.PID == old.PID {
		t.Fatal("the flux stage adopted a snapshot server that requires no credential")
	}
	resp, err := http.Get(ls.URL + "/info/refs?service=git-upload-pack")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("after the flux stage an anonymous request gets %s, want 401", resp.Status)
	}
}

// newFluxLab is a kube lab with the Flux controllers whose snapshot server,
// started by the flux stage as a detached process, is stopped at the end.
func newFluxLab(t *testing.T) *kubeLab {
	l := newKubeLab(t, kubeLabOptions{flux: true})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		gitsnap.Stop(ctx, l.cfg.Paths().StateDir, 5*time.Second, zerolog.Nop())
	})
	return l
}

// TestFluxStageWaitsForTheRemoteHead: with a remote repository the stage
// lists the branch head (git ls-remote) and waits until Flux reports that
// commit, asking for a reconcile when Flux still serves an older one, as
// `flux bootstrap` does: a commit pushed since the last run is synced when
// the stage says so, not at the GitRepository's next interval. The remote
// is a git smart HTTP server over a real repository's work tree.
func TestFluxStageWaitsForTheRemoteHead(t *testing.T) {
	l := newFluxLab(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := "127.0.0.1:" + strconv.Itoa(freeLoopbackPort(t))
	srv, err := gitsnap.NewServer(ctx, gitsnap.ServerOptions{Build: gitsnap.BuildOptions{Dir: l.git, Branch: "main"}, URL: "http://" + addr + "/remote.git"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ctx, ln, nil)
	l.cfg.Flux.LocalSnapshot.Enabled = false
	l.cfg.Flux.Repo = srv.URL()
	// Flux would only look again after an hour by itself.
	l.cfg.Flux.Interval = config.Duration(time.Hour)

	if _, err := l.runStage(FluxStage{}, false); err != nil {
		t.Fatal(err)
	}
	first := srv.Snapshot().Revision()
	if got := l.st.Outputs.Flux.Revision; got != first {
		t.Fatalf("after the first run Flux is at %q, want the remote head %s", got, first)
	}

	// A commit pushed to the remote.
	os.WriteFile(filepath.Join(l.git, "infra", "kustomization.yaml"), []byte("resources: [namespace.yaml, pushed.yaml]\n"), 0o644)
	os.WriteFile(filepath.Join(l.git, "infra", "pushed.yaml"), []byte("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: pushed\n"), 0o644)
	snap, changed, err := srv.Refresh(ctx)
	if err != nil || !changed {
		t.Fatalf("refreshing the remote: %v (changed %v)", err, changed)
	}
	env, err := l.runStage(FluxStage{}, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.st.Outputs.Flux.Revision; got != snap.Revision() {
		t.Fatalf("after a push the stage reported Flux at %q, want the new head %s", got, snap.Revision())
	}
	if got := changeList(env); !strings.Contains(got, "ask Flux to fetch "+snap.Revision()) {
		t.Errorf("the stage did not ask Flux for the new head:\n%s", got)
	}
	if _, err := l.client().CoreV1().Namespaces().Get(ctx, "pushed", metav1.GetOptions{}); err != nil {
		t.Fatalf("the pushed commit was not applied: %v", err)
	}
}

// TestFluxStageReportsAControllerThatNeverRollsOut: the install's rollout
// is waited for beside the first sync, not before it; a controller that
// never rolls out must still fail the stage, named, although the sync pair
// gets Ready (the lab's controllers run as processes of their own). A
// quota of no pods in flux-system (the lab made the namespace for its
// controllers) keeps every Deployment at 0 available.
func TestFluxStageReportsAControllerThatNeverRollsOut(t *testing.T) {
	l := newFluxLab(t)
	ctx := context.Background()
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "no-pods", Namespace: FluxNamespace},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}}
	if _, err := l.client().CoreV1().ResourceQuotas(FluxNamespace).Create(ctx, quota, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	l.cfg.Flux.Timeout = config.Duration(5 * time.Second)
	_, err := l.runStage(FluxStage{}, false)
	if err == nil || !strings.Contains(err.Error(), "installing Flux: ") || !strings.Contains(err.Error(), "Deployment/flux-system/source-controller") {
		t.Fatalf("a Flux whose controllers cannot run: %v", err)
	}
}
