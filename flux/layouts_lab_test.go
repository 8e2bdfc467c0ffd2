package flux

import (
	"context"
	"maps"
	"net"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/homelab/bootstrap/gitsnap"
	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
	"github.com/homelab/bootstrap/sops"
)

// layoutDBPassword is the value Flux substitutes for ${DB_PASSWORD}.
const layoutDBPassword = "substituted-by-flux"

// layout is one repository layout Flux users keep, under layouts/<name>/,
// and the ConfigMaps and Secrets the cluster must end up with from it
// (name → the keys of their data), whichever source serves it.
type layout struct {
	name  string
	files map[string]string
	// sealed are files written with the sops CLI from the plaintext given
	// ("<path>": "<plaintext>|<sops encrypt flags>").
	sealed map[string][2]string
	want   map[string][]string
}

// layouts are the shapes the snapshot guard once withheld although they
// hold no secret: a Helm chart kept in git whose templates render a
// Secret, post-build substitution, SOPS everywhere (a mixed secrets.yaml,
// an empty value sops leaves unencrypted, an encrypted generator input),
// generators with placeholder literals, documentation showing a Secret,
// nested kustomizations and a .sourceignore.
var layouts = []layout{
	{
		name: "chart",
		files: map[string]string{
			"charts/app/Chart.yaml":  "apiVersion: v2\nname: app\nversion: 1.0.0\n",
			"charts/app/values.yaml": "password: \"\"\ngreeting: hello\n",
			"charts/app/templates/secret.yaml": "{{- if .Values.password }}\napiVersion: v1\nkind: Secret\nmetadata:\n  name: {{ .Release.Name }}-db\n" +
				"data:\n  password: {{ .Values.password | b64enc }}\n{{- end }}\n",
			"charts/app/templates/configmap.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-settings\ndata:\n  greeting: {{ .Values.greeting | quote }}\n",
			"layouts/chart/release.yaml": "apiVersion: helm.toolkit.fluxcd.io/v2\nkind: HelmRelease\nmetadata:\n  name: app\nspec:\n  interval: 10m\n" +
				"  chart:\n    spec:\n      chart: ./charts/app\n      sourceRef:\n        kind: GitRepository\n        name: ${SOURCE}\n        namespace: flux-system\n" +
				"  values:\n    password: ${DB_PASSWORD}\n",
		},
		want: map[string][]string{"Secret/app-db": {"password"}, "ConfigMap/app-settings": {"greeting"}},
	},
	{
		name: "substitute",
		files: map[string]string{
			"layouts/substitute/secret.yaml": "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\nstringData:\n  password: ${DB_PASSWORD}\n  url: postgres://app:${DB_PASSWORD}@db:5432/app\n",
			"layouts/substitute/config.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: db-config\ndata:\n  host: db\n",
		},
		want: map[string][]string{"Secret/db": {"password", "url"}, "ConfigMap/db-config": {"host"}},
	},
	{
		name: "sops",
		files: map[string]string{
			"layouts/sops/kustomization.yaml": "resources: [secrets.yaml, empty.sops.yaml]\n",
		},
		sealed: map[string][2]string{
			// Joined below with a plain ConfigMap: one SOPS document and one
			// plain document in one secrets.yaml.
			"layouts/sops/secrets.yaml": {"apiVersion: v1\nkind: Secret\nmetadata:\n  name: api\nstringData:\n  token: sealed-api-token\n", "--encrypted-regex ^(data|stringData)$"},
			// sops leaves an empty value unencrypted.
			"layouts/sops/empty.sops.yaml": {"apiVersion: v1\nkind: Secret\nmetadata:\n  name: optional\nstringData:\n  token: sealed-optional-token\n  unset: \"\"\n", "--encrypted-regex ^(data|stringData)$"},
		},
		want: map[string][]string{"Secret/api": {"token"}, "Secret/optional": {"token", "unset"}, "ConfigMap/beside-sops": {"note"}},
	},
	{
		name: "generators",
		files: map[string]string{
			"layouts/generators/kustomization.yaml": "secretGenerator:\n- name: gen\n  envs: [creds.sops.env]\n  literals:\n  - url=postgres://app:${DB_PASSWORD}@db/app\n  - optional=\n" +
				"  options: {disableNameSuffixHash: true}\nconfigMapGenerator:\n- name: gen-settings\n  literals: [mode=lab]\n  options: {disableNameSuffixHash: true}\n",
		},
		sealed: map[string][2]string{
			"layouts/generators/creds.sops.env": {"USER=app\nPASSWORD=sealed-generator-password\n", "--input-type dotenv --output-type dotenv"},
		},
		want: map[string][]string{"Secret/gen": {"PASSWORD", "USER", "optional", "url"}, "ConfigMap/gen-settings": {"mode"}},
	},
	{
		name: "nested",
		files: map[string]string{
			"layouts/nested/kustomization.yaml":      "resources: [base/]\nnamePrefix: nested-\n",
			"layouts/nested/base/kustomization.yaml": "resources: [cm.yaml]\n",
			"layouts/nested/base/cm.yaml":            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  level: base\n",
			"layouts/nested/README.md": "# Secrets here\n\nKeep them encrypted:\n\n```yaml\napiVersion: v1\nkind: Secret\nmetadata:\n  name: example\n" +
				"stringData:\n  password: hunter2\n```\n",
		},
		want: map[string][]string{"ConfigMap/nested-cm": {"level"}},
	},
	{
		name: "ignored",
		files: map[string]string{
			"layouts/ignored/.sourceignore":  "skip/\n",
			"layouts/ignored/cm.yaml":        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kept\ndata:\n  a: b\n",
			"layouts/ignored/skip/cm.yaml":   "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: skipped\ndata:\n  a: b\n",
			"layouts/ignored/docs/notes.txt": "not a manifest\n",
		},
		want: map[string][]string{"ConfigMap/kept": {"a"}},
	},
	{
		// What the build reads beyond its own directory: a kustomize
		// component, a chart's values file outside the chart and its
		// file:// dependency; and a plaintext Secret the root .sourceignore
		// leaves out of the artifact (withheld, refusing nothing).
		name: "reach",
		files: map[string]string{
			// No kustomization file in layouts/ignored/: Flux would apply
			// every manifest there, but for the root .sourceignore.
			".sourceignore":                       "layouts/ignored/local-*.yaml\n",
			"layouts/ignored/local-secret.yaml":   "apiVersion: v1\nkind: Secret\nmetadata:\n  name: local\nstringData:\n  password: local-only\n",
			"layouts/reach/kustomization.yaml":    "resources: [release.yaml]\ncomponents: [../../components/extra]\n",
			"components/extra/kustomization.yaml": "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nresources: [cm.yaml]\n",
			"components/extra/cm.yaml":            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: extra\ndata:\n  a: b\n",
			"charts/web/Chart.yaml":               "apiVersion: v2\nname: web\nversion: 1.0.0\ndependencies:\n- name: common\n  version: 1.0.0\n  repository: file://../common\n",
			"charts/web/values.yaml":              "greeting: default\n",
			"charts/web/templates/cm.yaml":        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-settings\ndata:\n  greeting: {{ .Values.greeting | quote }}\n",
			"charts/common/Chart.yaml":            "apiVersion: v2\nname: common\nversion: 1.0.0\n",
			"charts/common/templates/cm.yaml":     "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-common\ndata:\n  from: common\n",
			"values/web-home.yaml":                "greeting: from-values-file\n",
			"layouts/reach/release.yaml": "apiVersion: helm.toolkit.fluxcd.io/v2\nkind: HelmRelease\nmetadata:\n  name: web\nspec:\n  interval: 10m\n" +
				"  chart:\n    spec:\n      chart: ./charts/web\n      valuesFiles: [./charts/web/values.yaml, ./values/web-home.yaml]\n" +
				"      sourceRef:\n        kind: GitRepository\n        name: ${SOURCE}\n        namespace: flux-system\n",
		},
		want: map[string][]string{"ConfigMap/extra": {"a"}, "ConfigMap/web-settings": {"greeting"}, "ConfigMap/web-common": {"from"}},
	},
}

// sourceIgnoredSecret is the one file the layouts' snapshot withholds:
// source-controller leaves it out of the artifact (.sourceignore), so no
// build reads it.
const sourceIgnoredSecret = "layouts/ignored/local-secret.yaml"

// TestSnapshotBuildsWhatGitBuilds serves one commit twice, as the
// snapshot (gitsnap) and as a bare repository through `git http-backend`,
// and lets the lab's real source-controller, kustomize-controller and
// helm-controller build every layout from both: the objects each source
// yields are equal, and each layout's expected objects are there. A clone
// of the snapshot with the git CLI holds every file of the commit.
func TestSnapshotBuildsWhatGitBuilds(t *testing.T) {
	lab := fluxLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bins := kubetest.Binaries(t)
	identity, recipient, err := sops.GenerateIdentity()
	if err != nil {
		t.Fatal(err)
	}

	repo := t.TempDir()
	gitCmd(t, repo, "init", "-q", "-b", "main")
	for _, l := range layouts {
		for p, c := range l.files {
			writeTreeFile(t, repo, p, c)
		}
		for p, s := range l.sealed {
			plain := filepath.Join(t.TempDir(), filepath.Base(p))
			if err := os.WriteFile(plain, []byte(s[0]), 0o600); err != nil {
				t.Fatal(err)
			}
			args := append([]string{"encrypt", "--age", recipient}, strings.Fields(s[1])...)
			out, err := exec.Command(bins.Path("sops"), append(args, plain)...).Output()
			if err != nil {
				t.Fatalf("sops %v: %v", args, err)
			}
			if p == "layouts/sops/secrets.yaml" {
				out = append(out, []byte("---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: beside-sops\ndata:\n  note: plain\n")...)
			}
			writeTreeFile(t, repo, p, string(out))
		}
	}
	gitCmd(t, repo, "add", ".")
	gitCmd(t, repo, "-c", "user.name=lab", "-c", "user.email=lab@example.invalid", "commit", "-q", "-m", "layouts")

	// The plain git remote: the same commit, served by git itself.
	bare := filepath.Join(t.TempDir(), "homelab.git")
	gitCmd(t, "", "clone", "-q", "--bare", repo, bare)
	execPath := strings.TrimSpace(gitCmd(t, "", "--exec-path"))
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	backend := &cgi.Handler{Path: filepath.Join(execPath, "git-http-backend"), Env: []string{"GIT_PROJECT_ROOT=" + filepath.Dir(bare), "GIT_HTTP_EXPORT_ALL=1"}}
	gs := &http.Server{Handler: backend, ReadHeaderTimeout: 10 * time.Second}
	go gs.Serve(gl)
	t.Cleanup(func() { gs.Close() })
	gitURL := "http://" + gl.Addr().String() + "/homelab.git"

	// The snapshot of the work tree, with the cluster's credential.
	snap, err := gitsnap.Build(ctx, gitsnap.BuildOptions{Dir: repo, Branch: "main", FluxPath: "./layouts"})
	if err != nil {
		t.Fatal(err)
	}
	// Need-to-know: the snapshot serves what the layouts' builds read;
	// sourceIgnoredSecret, which no build reads, is not served at all
	// (not withheld: never judged). That the controllers build the same
	// objects from it as from git, below, is what proves the set enough.
	if len(snap.Withheld) != 0 || snap.WholeTree != "" || snap.Unread == 0 || snap.Unproven != "" || snap.Refusal() != nil {
		t.Fatalf("the snapshot withholds %s, scope %s, refusal %v: want need-to-know, proven, nothing withheld", snap.WithheldList(), snap.Scope(), snap.Refusal())
	}
	head := strings.TrimSpace(gitCmd(t, repo, "rev-parse", "HEAD"))
	auth, _, err := gitsnap.EnsureAuth(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	snapURL := "http://" + sl.Addr().String() + "/homelab.git"
	srv, err := gitsnap.NewServer(ctx, gitsnap.ServerOptions{Build: gitsnap.BuildOptions{Dir: repo, Branch: "main", FluxPath: "./layouts"}, URL: snapURL, Auth: &auth, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ctx, sl, nil)

	// The git CLI's clone of the snapshot holds files of the commit, as
	// the commit holds them, and not sourceIgnoredSecret.
	clone := filepath.Join(t.TempDir(), "clone")
	authURL := strings.Replace(snapURL, "http://", "http://"+auth.Username+":"+auth.Password+"@", 1)
	gitCmd(t, "", "clone", "-q", authURL, clone)
	got := lsFiles(t, clone, "HEAD")
	if len(got) != snap.Files || slices.Contains(got, sourceIgnoredSecret) {
		t.Errorf("git clone of the snapshot holds %v; want %d files without %s", got, snap.Files, sourceIgnoredSecret)
	}
	for _, p := range got {
		if a, b := gitCmd(t, clone, "show", "HEAD:"+p), gitCmd(t, repo, "show", head+":"+p); a != b {
			t.Errorf("%s: the snapshot serves %q, the commit holds %q", p, a, b)
		}
	}

	c, err := NewClient(lab.RESTConfig(), kubetest.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	sources := map[string]string{"snap": snapURL, "git": gitURL}
	decryption, err := DecryptionSecret(DecryptionSecretName, "flux-system", []byte(identity+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	snapAuth, err := AuthSecret("snap-auth", "flux-system", Credentials{Username: auth.Username, Token: auth.Password})
	if err != nil {
		t.Fatal(err)
	}
	objs := []*unstructured.Unstructured{decryption, snapAuth}
	for src, url := range sources {
		spec := map[string]any{"interval": "1m", "url": url, "ref": map[string]any{"branch": "main"}}
		if src == "snap" {
			spec["secretRef"] = map[string]any{"name": "snap-auth"}
		}
		objs = append(objs, systemObject("source.toolkit.fluxcd.io/v1", "GitRepository", src, spec))
		for _, l := range layouts {
			ns := src + "-" + l.name
			if _, err := lab.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			objs = append(objs, systemObject("kustomize.toolkit.fluxcd.io/v1", "Kustomization", ns, map[string]any{
				"interval": "1m", "path": "./layouts/" + l.name, "prune": true, "targetNamespace": ns,
				"sourceRef":  map[string]any{"kind": "GitRepository", "name": src},
				"decryption": map[string]any{"provider": "sops", "secretRef": map[string]any{"name": DecryptionSecretName}},
				"postBuild":  map[string]any{"substitute": map[string]any{"SOURCE": src, "DB_PASSWORD": layoutDBPassword}},
			}))
		}
	}
	if _, err := c.Apply(ctx, objs, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitAllReady(ctx, 3*time.Minute); err != nil {
		t.Fatal(err)
	}

	for _, l := range layouts {
		fromSnap, fromGit := builtObjects(t, ctx, lab, "snap-"+l.name), builtObjects(t, ctx, lab, "git-"+l.name)
		if !maps.EqualFunc(fromSnap, fromGit, maps.Equal) {
			t.Errorf("layout %s: the snapshot built %v, git %v", l.name, keysOf(fromSnap), keysOf(fromGit))
			for k, v := range fromGit {
				if !maps.Equal(fromSnap[k], v) {
					t.Errorf("layout %s: %s differs", l.name, k)
				}
			}
		}
		t.Logf("layout %s: both sources built %v", l.name, keysOf(fromGit))
		for obj, keys := range l.want {
			if got := slices.Sorted(maps.Keys(fromSnap[obj])); !slices.Equal(got, keys) {
				t.Errorf("layout %s: %s holds %v, want %v", l.name, obj, got, keys)
			}
		}
	}
	// Decrypted and substituted as Flux does it, from both sources alike.
	if got := string(builtObjects(t, ctx, lab, "snap-substitute")["Secret/db"]["password"]); got != layoutDBPassword {
		t.Errorf("substituted password = %q", got)
	}
	if got := string(builtObjects(t, ctx, lab, "snap-sops")["Secret/api"]["token"]); got != "sealed-api-token" {
		t.Errorf("decrypted token = %q", got)
	}
	// The values file outside the chart was read, from both sources.
	if got := builtObjects(t, ctx, lab, "snap-reach")["ConfigMap/web-settings"]["greeting"]; got != "from-values-file" {
		t.Errorf("greeting = %q, want the values file's", got)
	}
}

// builtObjects reads the ConfigMaps and Secrets of namespace ns, keyed by
// kind/name, with their data; what the API server or Helm adds on its own
// (the root CA ConfigMap, Helm's release records) is left out.
func builtObjects(t *testing.T, ctx context.Context, lab *kube.Cluster, ns string) map[string]map[string]string {
	t.Helper()
	out := map[string]map[string]string{}
	cms, err := lab.Client().CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range cms.Items {
		if cm.Name != "kube-root-ca.crt" {
			out["ConfigMap/"+cm.Name] = cm.Data
		}
	}
	secrets, err := lab.Client().CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range secrets.Items {
		if s.Type == "helm.sh/release.v1" {
			continue
		}
		data := map[string]string{}
		for k, v := range s.Data {
			data[k] = string(v)
		}
		out["Secret/"+s.Name] = data
	}
	return out
}

func keysOf[V any](m map[string]V) []string {
	ks := slices.Collect(maps.Keys(m))
	sort.Strings(ks)
	return ks
}

// systemObject is a namespaced flux-system object of the given kind and spec.
func systemObject(apiVersion, kind, name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": apiVersion, "kind": kind,
		"metadata": map[string]any{"name": name, "namespace": "flux-system"},
		"spec":     spec,
	}}
}

func writeTreeFile(t *testing.T, root, rel, content string) {
	t.Helper()
	p := filepath.Join(root, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// gitCmd runs the git CLI (in dir, unless empty) and returns its output.
func gitCmd(t *testing.T, dir string, args ...string) string {
	t.Helper()
	if dir != "" {
		args = append([]string{"-C", dir}, args...)
	}
	out, err := exec.Command("git", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// lsFiles lists the files of a commit with the git CLI.
func lsFiles(t *testing.T, repo, rev string) []string {
	t.Helper()
	files := strings.Fields(gitCmd(t, repo, "ls-tree", "-r", "--name-only", rev))
	sort.Strings(files)
	return files
}
