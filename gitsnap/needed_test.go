package gitsnap

import (
	"context"
	"errors"
	"strings"
	"testing"
)

const plainSecret = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\nstringData:\n  password: hunter2\n"

// neededTree is a Flux repository whose build reads files the guard
// withholds by every route Flux reads a tree: a kustomization's list, a
// directory Flux generates a kustomization for, a Flux Kustomization
// found in what is built, a Helm chart, and the kustomization itself.
func neededTree(t *testing.T) string {
	t.Helper()
	return gitWorkTree(t, map[string]string{
		"infra/kustomization.yaml": "resources: [app.yaml, db-secret.yaml, apps/, excluded.yaml]\n",
		"infra/app.yaml":           configMap,
		"infra/db-secret.yaml":     plainSecret,
		"infra/excluded.yaml":      configMap,
		"infra/apps/ks.yaml": "apiVersion: kustomize.toolkit.fluxcd.io/v1\nkind: Kustomization\nmetadata:\n  name: web\n  namespace: flux-system\n" +
			"spec:\n  path: ./apps/web\n  sourceRef:\n    kind: GitRepository\n    name: flux-system\n",
		"infra/apps/release.yaml": "apiVersion: helm.toolkit.fluxcd.io/v2\nkind: HelmRelease\nmetadata:\n  name: app\n" +
			"spec:\n  chart:\n    spec:\n      chart: ./charts/app\n      sourceRef:\n        kind: GitRepository\n        name: flux-system\n",
		"infra/apps/oci.yaml": "apiVersion: kustomize.toolkit.fluxcd.io/v1\nkind: Kustomization\nmetadata:\n  name: elsewhere\n" +
			"spec:\n  path: ./docs\n  sourceRef:\n    kind: OCIRepository\n    name: other\n",
		// Built through the Flux Kustomization web: no kustomization file,
		// so Flux applies every manifest below, and sub/ as a whole.
		"apps/web/secret.yaml":                plainSecret,
		"apps/web/sub/kustomization.yaml":     "resources: [cm.yaml]\nsecretGenerator:\n- name: gen\n  literals: [token=s3cr3tvalue]\n",
		"apps/web/sub/cm.yaml":                configMap,
		"apps/web/sub/not-listed-secret.yaml": plainSecret,
		// Not built by anything: withheld and named, not refused.
		"docs/secret.yaml": plainSecret,
		// A chart kept in git is built whole by source-controller for the
		// HelmRelease above; one nothing names is not built.
		"charts/unused/Chart.yaml":            "apiVersion: v2\nname: unused\nversion: 1.0.0\n",
		"charts/unused/templates/secret.yaml": plainSecret,
		"charts/app/Chart.yaml":               "apiVersion: v2\nname: app\nversion: 1.0.0\n",
		"charts/app/templates/literal.yaml":   "apiVersion: v1\nkind: Secret\ndata:\n  password: {{ \"hunter2\" | b64enc }}\n",
	})
}

// TestWithheldFilesTheBuildReadsRefuse: every withheld file is named with
// its rule; those the build reads say what reads them and refuse the
// snapshot with what to do; a configured exclude is named but the user's
// choice; ServePlaintext serves a plaintext Secret as git holds it.
func TestWithheldFilesTheBuildReadsRefuse(t *testing.T) {
	dir := neededTree(t)
	want := map[string]struct{ rule, neededBy string }{
		"apps/web/secret.yaml":                {RuleUnencryptedSecret, "a manifest under apps/web/, which the Flux Kustomization web (infra/apps/ks.yaml) builds"},
		"apps/web/sub/kustomization.yaml":     {RuleSecretGenerator, "the kustomization of apps/web/sub/"},
		"apps/web/sub/not-listed-secret.yaml": {RuleUnencryptedSecret, ""},
		"charts/app/templates/literal.yaml":   {RuleUnencryptedSecret, "a file of the Helm chart charts/app/, which source-controller builds for the HelmRelease app (infra/apps/release.yaml)"},
		"charts/unused/templates/secret.yaml": {RuleUnencryptedSecret, ""},
		"docs/secret.yaml":                    {RuleUnencryptedSecret, ""},
		"infra/db-secret.yaml":                {RuleUnencryptedSecret, "listed in infra/kustomization.yaml"},
		"infra/excluded.yaml":                 {RuleConfiguredExclude, "listed in infra/kustomization.yaml"},
	}
	// Served whole, every file is judged; served need-to-know (the
	// default), a file no build reads is not served at all, so only those
	// the build reads are withheld.
	var snap *Snapshot
	for _, whole := range []bool{true, false} {
		var err error
		snap, err = Build(context.Background(), BuildOptions{Dir: dir, FluxPath: "./infra", Excludes: []string{"infra/excluded.yaml"}, ServeWholeTree: whole})
		if err != nil {
			t.Fatal(err)
		}
		expect := 0
		for _, x := range want {
			if whole || x.neededBy != "" {
				expect++
			}
		}
		if len(snap.Withheld) != expect {
			t.Errorf("whole tree %v: Withheld = %v, want %d files", whole, snap.Withheld, expect)
		}
		for _, w := range snap.Withheld {
			x, ok := want[w.Path]
			switch {
			case !ok:
				t.Errorf("%s withheld (%s), not expected", w.Path, w.Rule)
			case !whole && x.neededBy == "":
				t.Errorf("need-to-know: %s withheld, but no build reads it: it is not served at all", w.Path)
			case w.Rule != x.rule:
				t.Errorf("%s withheld as %q, want %q", w.Path, w.Rule, x.rule)
			case x.neededBy == "" && w.NeededBy != "":
				t.Errorf("%s: NeededBy %q, want nothing (no build reads it)", w.Path, w.NeededBy)
			case !strings.HasPrefix(w.NeededBy, x.neededBy) || (x.neededBy != "" && w.NeededBy == ""):
				t.Errorf("%s: NeededBy %q, want it to start with %q", w.Path, w.NeededBy, x.neededBy)
			}
		}
		served, _, _ := snapshotFiles(t, snap)
		for _, p := range []string{"docs/secret.yaml", "apps/web/sub/not-listed-secret.yaml"} {
			if _, ok := served[p]; ok {
				t.Errorf("whole tree %v: %s served", whole, p)
			}
		}
		if _, ok := served["charts/unused/Chart.yaml"]; !whole && ok {
			t.Errorf("need-to-know: an unused chart is served")
		}
		if whole && snap.WholeTree == "" || !whole && (snap.WholeTree != "" || snap.Unread < 3) {
			t.Errorf("whole tree %v: WholeTree %q, Unread %d", whole, snap.WholeTree, snap.Unread)
		}
		for _, p := range []string{"infra/app.yaml", "apps/web/sub/cm.yaml", "charts/app/Chart.yaml"} {
			if _, ok := served[p]; !ok {
				t.Errorf("whole tree %v: %s, which the build reads, not served", whole, p)
			}
		}
	}
	err := snap.Refusal()
	var refusal *RefusalError
	if !errors.As(err, &refusal) {
		t.Fatalf("Refusal() = %v, want a RefusalError", err)
	}
	if len(refusal.Files) != 4 {
		t.Errorf("refused for %v, want the 4 withheld files the build reads (not the configured exclude)", refusal.Files)
	}
	for _, s := range []string{"infra/db-secret.yaml", "sops encrypt", "apps/web/sub/kustomization.yaml", "envs: [secret.sops.env]", "charts/app/templates/literal.yaml", "servePlaintext"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("refusal %q does not say %q", err, s)
		}
	}
	for _, s := range []string{"docs/secret.yaml", "not-listed", "hunter2", "s3cr3tvalue"} {
		if strings.Contains(err.Error(), s) {
			t.Errorf("refusal %q names %q", err, s)
		}
	}

	// Kept in plaintext on purpose: served as git holds it, refusing nothing
	// more than the generator and the chart's literal.
	snap, err = Build(context.Background(), BuildOptions{Dir: dir, FluxPath: "infra/", Excludes: []string{"infra/excluded.yaml"}, ServePlaintext: []string{"*secret.yaml"}})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.As(snap.Refusal(), &refusal) || len(refusal.Files) != 2 {
		t.Errorf("with servePlaintext: Refusal() = %v, want the generator and the chart's literal only", snap.Refusal())
	}

	// Without a Flux path the whole tree is what the build may read.
	snap, err = Build(context.Background(), BuildOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range snap.Withheld {
		if w.Path == "docs/secret.yaml" && w.NeededBy == "" {
			t.Errorf("without a Flux path, %s is not counted as read by the build", w.Path)
		}
	}
}

// TestServerRefusesASnapshotMissingWhatTheBuildReads: a server does not
// start on such a tree, and a refresh that would withhold a file the build
// reads keeps serving the previous snapshot.
func TestServerRefusesASnapshotMissingWhatTheBuildReads(t *testing.T) {
	dir := neededTree(t)
	opts := ServerOptions{Build: BuildOptions{Dir: dir, FluxPath: "./infra"}, URL: "http://127.0.0.1:1/homelab.git"}
	if _, err := NewServer(context.Background(), opts); err == nil || !strings.Contains(err.Error(), "infra/db-secret.yaml") {
		t.Fatalf("NewServer on a refusing tree: %v, want a refusal naming infra/db-secret.yaml", err)
	}
	// A tree that builds: the one above with its plaintext taken out.
	clean := t.TempDir()
	git(t, clean, "init", "-q", "-b", testRepoBranch)
	writeFile(t, clean, "infra/kustomization.yaml", "resources: [app.yaml]\n", 0o644)
	writeFile(t, clean, "infra/app.yaml", configMap, 0o644)
	opts.Build.Dir = clean
	srv, err := NewServer(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	served := srv.Snapshot().Hash
	writeFile(t, clean, "infra/kustomization.yaml", "resources: [app.yaml, db.yaml]\n", 0o644)
	writeFile(t, clean, "infra/db.yaml", plainSecret, 0o644)
	snap, changed, err := srv.Refresh(context.Background())
	if err == nil || changed || snap.Hash != served || !strings.Contains(err.Error(), "infra/db.yaml") {
		t.Errorf("Refresh with a needed plaintext Secret: changed %v, hash %s (was %s), err %v; want the old snapshot kept and the file named", changed, snap.Hash, served, err)
	}
}

// TestNeededFollowsWhatFluxReads: what source-controller leaves out of
// the artifact (.sourceignore, its defaults) is not read, so a withheld
// file there refuses nothing; a Flux Kustomization's spec.components, a
// chart's valuesFiles outside its directory and its file:// dependencies
// are read, so a withheld file there refuses the snapshot, named.
func TestNeededFollowsWhatFluxReads(t *testing.T) {
	dir := gitWorkTree(t, map[string]string{
		".sourceignore":                   "clusters/home/local-*.yaml\n",
		"clusters/home/flux.yaml":         configMap,
		"clusters/home/local-secret.yaml": plainSecret,
		"clusters/home/apps.yaml": "apiVersion: kustomize.toolkit.fluxcd.io/v1\nkind: Kustomization\nmetadata: {name: apps, namespace: flux-system}\n" +
			"spec:\n  path: ./apps\n  components: [../components/db]\n  sourceRef: {kind: GitRepository, name: flux-system}\n",
		"clusters/home/release.yaml": "apiVersion: helm.toolkit.fluxcd.io/v2\nkind: HelmRelease\nmetadata: {name: web}\n" +
			"spec:\n  chart:\n    spec:\n      chart: ./charts/web\n      valuesFiles: [./charts/web/values.yaml, ./values/web-home.yaml]\n      sourceRef: {kind: GitRepository, name: flux-system}\n",
		"apps/kustomization.yaml":             "resources: [cm.yaml]\n",
		"apps/cm.yaml":                        configMap,
		"components/db/kustomization.yaml":    "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nresources: [secret.yaml]\n",
		"components/db/secret.yaml":           plainSecret,
		"charts/web/Chart.yaml":               "apiVersion: v2\nname: web\nversion: 1.0.0\ndependencies:\n- name: common\n  version: 1.0.0\n  repository: file://../common\n",
		"charts/web/values.yaml":              "replicas: 1\n",
		"charts/common/Chart.yaml":            "apiVersion: v2\nname: common\nversion: 1.0.0\n",
		"charts/common/templates/secret.yaml": plainSecret,
		"values/web-home.yaml":                "password: {{ \"hunter2\" }}\napiVersion: v1\nkind: Secret\nstringData: {password: hunter2}\n",
	})
	snap, err := Build(context.Background(), BuildOptions{Dir: dir, FluxPath: "./clusters/home", ServeWholeTree: true})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"clusters/home/local-secret.yaml":     "",
		"components/db/secret.yaml":           "listed in components/db/kustomization.yaml",
		"charts/common/templates/secret.yaml": "a file of the Helm chart charts/common/",
		"values/web-home.yaml":                "a values file of the HelmRelease web",
	}
	got := map[string]string{}
	for _, w := range snap.Withheld {
		got[w.Path] = w.NeededBy
	}
	for p, by := range want {
		nb, ok := got[p]
		switch {
		case !ok:
			t.Errorf("%s not withheld; withheld: %v", p, snap.Withheld)
		case by == "" && nb != "":
			t.Errorf("%s: NeededBy %q, want nothing (.sourceignore leaves it out of the artifact)", p, nb)
		case by != "" && !strings.HasPrefix(nb, by):
			t.Errorf("%s: NeededBy %q, want it to start with %q", p, nb, by)
		}
	}
	err = snap.Refusal()
	for _, p := range []string{"components/db/secret.yaml", "charts/common/templates/secret.yaml", "values/web-home.yaml"} {
		if err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("Refusal() = %v, want it to name %s", err, p)
		}
	}
	if err != nil && strings.Contains(err.Error(), "local-secret") {
		t.Errorf("Refusal() names the .sourceignore'd file: %v", err)
	}
}

// TestNeedToKnowIsProvenByKustomize: a file kustomize reads that the
// reading of what the build needs left out (here the data of a builtin
// generator's config, which neededFiles does not open) refuses the
// snapshot, named with the build that read it; a Flux Kustomization path
// the cluster fills in (${...}) serves the whole tree and says why.
func TestNeedToKnowIsProvenByKustomize(t *testing.T) {
	dir := gitWorkTree(t, map[string]string{
		"infra/kustomization.yaml": "resources: [app.yaml]\ngenerators: [gen.yaml]\n",
		"infra/app.yaml":           configMap,
		"infra/gen.yaml":           "apiVersion: builtin\nkind: ConfigMapGenerator\nmetadata: {name: settings}\nfiles: [settings.ini]\n",
		"infra/settings.ini":       "level=info\n",
		"docs/notes.md":            "not built\n",
	})
	snap, err := Build(context.Background(), BuildOptions{Dir: dir, FluxPath: "./infra"})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Unproven != "" {
		t.Fatalf("Unproven = %q, want infra/ built", snap.Unproven)
	}
	var refusal *RefusalError
	if err := snap.Refusal(); !errors.As(err, &refusal) || len(refusal.Missed) != 1 || refusal.Missed[0].Path != "infra/settings.ini" || refusal.Missed[0].ReadBy != "infra" {
		t.Fatalf("Refusal() = %v, want infra/settings.ini missed, read by infra", err)
	} else if !strings.Contains(err.Error(), "infra/settings.ini") || !strings.Contains(err.Error(), "serve") {
		t.Errorf("refusal %q does not name the file and the way out", err)
	}
	// Served whole, nothing is missed.
	whole, err := Build(context.Background(), BuildOptions{Dir: dir, FluxPath: "./infra", ServeWholeTree: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := whole.Refusal(); err != nil || len(whole.Missed) != 0 {
		t.Errorf("whole tree: Refusal() = %v, Missed %v", err, whole.Missed)
	}

	// A path the cluster substitutes cannot be followed: the whole tree.
	writeFile(t, dir, "infra/ks.yaml", "apiVersion: kustomize.toolkit.fluxcd.io/v1\nkind: Kustomization\nmetadata: {name: apps, namespace: flux-system}\n"+
		"spec:\n  path: ./clusters/${CLUSTER}\n  sourceRef: {kind: GitRepository, name: flux-system}\n", 0o644)
	writeFile(t, dir, "infra/kustomization.yaml", "resources: [app.yaml, ks.yaml]\n", 0o644)
	snap, err = Build(context.Background(), BuildOptions{Dir: dir, FluxPath: "./infra"})
	if err != nil {
		t.Fatal(err)
	}
	files, _, _ := snapshotFiles(t, snap)
	if _, ok := files["docs/notes.md"]; !ok || !strings.Contains(snap.WholeTree, "${CLUSTER}") || snap.Unread != 0 {
		t.Errorf("substituted path: WholeTree %q, Unread %d, docs served %v; want the whole tree and the path named", snap.WholeTree, snap.Unread, ok)
	}
}
