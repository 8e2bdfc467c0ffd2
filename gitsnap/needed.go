package gitsnap

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	gogit "github.com/go-git/go-git/v5"
	"github.com/go-git/go-git/v5/plumbing/format/gitignore"
	"go.yaml.in/yaml/v3"
)

// What the cluster builds from the snapshot, so that a withheld file the
// build reads is refused instead of silently missing. Flux reads a tree
// this way:
//   - kustomize-controller builds each Flux Kustomization's spec.path: with
//     a kustomization file there, kustomize reads it and everything it
//     lists; without one, fluxcd/pkg/kustomize v1.35.6
//     kustomize_generator.go (findOrGenerateKustomization, scanManifests)
//     generates one listing every .yaml/.yml file below, and each
//     subdirectory holding a kustomization file as a whole;
//   - the objects built may be further Flux Kustomizations, whose paths are
//     built the same way;
//   - source-controller builds a Helm chart kept in git from its directory
//     (every file of the chart) for a HelmRelease whose
//     spec.chart.spec.sourceRef is a GitRepository, or a HelmChart's
//     spec.chart, among the objects built.
// The starting paths are flux.path (the flux-system Kustomization); a tree
// served without one starts at its root.

// buildReads is what the cluster's build reads of a tree, as neededFiles
// judges it.
type buildReads struct {
	// why maps each candidate the build reads to why.
	why map[string]string
	// unknown says why what the build reads cannot be known from the tree
	// alone (a path made of a post-build variable, which the cluster fills
	// in); empty when it can.
	unknown []string
	// kustomizations are the directories built from a kustomization file:
	// kustomize itself decides what they read (proveReads checks it).
	kustomizations []string
	// remote names a kustomization that loads a remote base: kustomize
	// would fetch it, so its reads are not proven here.
	remote string
	// readable are the candidates the artifact holds (source-controller
	// leaves out what sourceIgnored matches).
	readable map[string]bool
}

// neededFiles judges what the cluster's build reads of the candidates.
// What source-controller leaves out of the artifact (sourceIgnored) is
// never read.
func neededFiles(root string, candidates []string, starts []string) *buildReads {
	n := &needs{root: root, files: map[string]bool{}, why: map[string]string{}, built: map[string]bool{}, charts: map[string]bool{}}
	ignored := sourceIgnored(root, candidates)
	for _, p := range candidates {
		if !ignored.Match(strings.Split(p, "/"), false) {
			n.list = append(n.list, p)
			n.files[p] = true
		}
	}
	if len(starts) == 0 {
		starts = []string{"."}
	}
	for _, s := range starts {
		n.build(cleanRel(s), "flux.path")
	}
	return &buildReads{why: n.why, unknown: n.unknown, kustomizations: n.kustomizations, remote: n.remote, readable: n.files}
}

type needs struct {
	root string
	// list is the candidates in order, files the same as a set.
	list  []string
	files map[string]bool
	why   map[string]string
	built map[string]bool
	// charts are the chart directories recorded.
	charts map[string]bool
	// unknown, kustomizations and remote: buildReads.
	unknown        []string
	kustomizations []string
	remote         string
}

// sourceIgnored is what source-controller leaves out of a GitRepository's
// artifact: fluxcd/pkg sourceignore (23cf50f) NewDefaultMatcher, i.e. the
// VCS, extension, CI and extra defaults (ExcludeVCS, ExcludeExt,
// ExcludeCI, ExcludeExtra: **/.sops.yaml among them) below the patterns
// of every .sourceignore file, each scoped to its directory
// (LoadIgnorePatterns).
func sourceIgnored(root string, candidates []string) gitignore.Matcher {
	var ps []gitignore.Pattern
	for _, list := range []string{".git/,.gitignore,.gitmodules,.gitattributes",
		"*.jpg,*.jpeg,*.gif,*.png,*.wmv,*.flv,*.tar.gz,*.zip",
		".github/,.circleci/,.travis.yml,.gitlab-ci.yml,appveyor.yml,.drone.yml,cloudbuild.yaml,codeship-services.yml,codeship-steps.yml",
		"**/.goreleaser.yml,**/.sops.yaml,**/.flux.yaml"} {
		for _, p := range strings.Split(list, ",") {
			ps = append(ps, gitignore.ParsePattern(p, nil))
		}
	}
	var files []string
	for _, p := range candidates {
		if path.Base(p) == ".sourceignore" {
			files = append(files, p)
		}
	}
	// Outer directories first, as LoadIgnorePatterns walks them.
	sort.SliceStable(files, func(i, j int) bool { return strings.Count(files[i], "/") < strings.Count(files[j], "/") })
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			continue
		}
		var domain []string
		if d := path.Dir(f); d != "." {
			domain = strings.Split(d, "/")
		}
		for _, line := range strings.Split(string(data), "\n") {
			if line = strings.TrimRight(line, "\r"); !strings.HasPrefix(line, "#") && strings.TrimSpace(line) != "" {
				ps = append(ps, gitignore.ParsePattern(line, domain))
			}
		}
	}
	return gitignore.NewMatcher(ps)
}

func (n *needs) need(p, why string) {
	if _, ok := n.why[p]; !ok {
		n.why[p] = why
	}
}

// cleanRel turns a repository path as Flux writes it (./infra, infra/)
// into a clean relative one ("." for the root).
func cleanRel(p string) string {
	return path.Clean(strings.TrimPrefix(filepath.ToSlash(p), "/"))
}

// kustomizationIn returns the kustomization file of dir, if any.
func (n *needs) kustomizationIn(dir string) string {
	for _, name := range []string{"kustomization.yaml", "kustomization.yml", "Kustomization"} {
		if p := path.Join(dir, name); n.files[p] {
			return p
		}
	}
	return ""
}

// isDir reports whether any candidate lies under dir.
func (n *needs) isDir(dir string) bool {
	if dir == "." {
		return true
	}
	for _, p := range n.list {
		if strings.HasPrefix(p, dir+"/") {
			return true
		}
	}
	return false
}

// build records what kustomize-controller reads to build dir.
func (n *needs) build(dir, by string) {
	if dir == ".." || strings.HasPrefix(dir, "../") || n.built[dir] {
		return
	}
	n.built[dir] = true
	if k := n.kustomizationIn(dir); k != "" {
		n.need(k, fmt.Sprintf("the kustomization of %s/, which %s builds", dir, by))
		n.kustomizations = append(n.kustomizations, dir)
		n.kustomization(k)
		return
	}
	// Flux's generator: every manifest below, and each subdirectory with
	// a kustomization of its own as a whole.
	var sub []string
	for _, p := range n.list {
		if dir != "." && !strings.HasPrefix(p, dir+"/") {
			continue
		}
		if k := n.nearestKustomization(dir, p); k != "" {
			if len(sub) == 0 || sub[len(sub)-1] != path.Dir(k) {
				sub = append(sub, path.Dir(k))
			}
			continue
		}
		if ext := path.Ext(p); ext == ".yaml" || ext == ".yml" {
			n.need(p, fmt.Sprintf("a manifest under %s/, which %s builds (no kustomization file there: Flux applies every .yaml under it)", dir, by))
			n.fluxObjects(p)
		}
	}
	for _, d := range sub {
		n.build(d, by)
	}
}

// nearestKustomization returns the kustomization file of the directory
// between dir (exclusive) and p's own directory (inclusive) closest to
// dir, if any: the generator stops descending there.
func (n *needs) nearestKustomization(dir, p string) string {
	rel := strings.TrimPrefix(p, dir+"/")
	if dir == "." {
		rel = p
	}
	parts := strings.Split(rel, "/")
	d := dir
	for _, c := range parts[:len(parts)-1] {
		d = path.Join(d, c)
		if k := n.kustomizationIn(d); k != "" {
			return k
		}
	}
	return ""
}

// remoteRef reports whether a kustomization entry names a remote base or
// file, which kustomize fetches (sigs.k8s.io/kustomize/api
// internal/git/repospec.go: URLs, scp-like git@ addresses, and the
// github.com/… shorthand with //path or ?ref=).
func remoteRef(entry string) bool {
	return strings.Contains(entry, "://") || strings.HasPrefix(entry, "git@") || strings.HasPrefix(entry, "github.com/") ||
		strings.HasPrefix(entry, "gitlab.com/") || strings.Contains(entry, "?ref=") || strings.Contains(entry, ".git//")
}

// kustomizationRefs is what a kustomization names (kustomize api v0.21
// types.Kustomization): resources and components (files or directories),
// and the files of patches, generators, CRDs and configurations.
type kustomizationRefs struct {
	Resources             []string `yaml:"resources"`
	Bases                 []string `yaml:"bases"`
	Components            []string `yaml:"components"`
	Crds                  []string `yaml:"crds"`
	Configurations        []string `yaml:"configurations"`
	Generators            []string `yaml:"generators"`
	Transformers          []string `yaml:"transformers"`
	Validators            []string `yaml:"validators"`
	PatchesStrategicMerge []string `yaml:"patchesStrategicMerge"`
	Patches               []struct {
		Path string `yaml:"path"`
	} `yaml:"patches"`
	PatchesJSON6902 []struct {
		Path string `yaml:"path"`
	} `yaml:"patchesJson6902"`
	Replacements []struct {
		Path string `yaml:"path"`
	} `yaml:"replacements"`
	OpenAPI struct {
		Path string `yaml:"path"`
	} `yaml:"openapi"`
	HelmCharts []struct {
		ValuesFile string `yaml:"valuesFile"`
	} `yaml:"helmCharts"`
	ConfigMapGenerator []generatorRefs `yaml:"configMapGenerator"`
	SecretGenerator    []generatorRefs `yaml:"secretGenerator"`
}

type generatorRefs struct {
	Files []string `yaml:"files"`
	Envs  []string `yaml:"envs"`
	Env   string   `yaml:"env"`
}

// kustomization records every file kustomization k names, and builds the
// directories it names. One that does not parse names nothing here
// (kustomize refuses it too, naming it).
func (n *needs) kustomization(k string) {
	data, err := os.ReadFile(filepath.Join(n.root, filepath.FromSlash(k)))
	if err != nil {
		return
	}
	var r kustomizationRefs
	if yaml.Unmarshal(data, &r) != nil {
		return
	}
	dir := path.Dir(k)
	by := fmt.Sprintf("listed in %s", k)
	ref := func(entry string, dirs bool) {
		entry = strings.TrimSpace(entry)
		if entry == "" || strings.Contains(entry, "\n") {
			return
		}
		if remoteRef(entry) {
			if n.remote == "" {
				n.remote = k
			}
			return
		}
		p := path.Clean(path.Join(dir, entry))
		switch {
		case n.files[p]:
			n.need(p, by)
			n.fluxObjects(p)
		case dirs && n.isDir(p):
			n.build(p, k)
		}
	}
	for _, list := range [][]string{r.Resources, r.Bases, r.Components} {
		for _, e := range list {
			ref(e, true)
		}
	}
	for _, list := range [][]string{r.Crds, r.Configurations, r.Generators, r.Transformers, r.Validators, r.PatchesStrategicMerge} {
		for _, e := range list {
			ref(e, false)
		}
	}
	for _, p := range r.Patches {
		ref(p.Path, false)
	}
	for _, p := range r.PatchesJSON6902 {
		ref(p.Path, false)
	}
	for _, p := range r.Replacements {
		ref(p.Path, false)
	}
	ref(r.OpenAPI.Path, false)
	for _, h := range r.HelmCharts {
		ref(h.ValuesFile, false)
	}
	for _, g := range append(r.ConfigMapGenerator, r.SecretGenerator...) {
		for _, f := range g.Files {
			// "[key=]path"
			if _, file, ok := strings.Cut(f, "="); ok {
				f = file
			}
			ref(f, false)
		}
		for _, e := range append(g.Envs, g.Env) {
			ref(e, false)
		}
	}
}

// fluxObjects follows the Flux objects manifest p declares that take their
// source from a GitRepository: once applied, kustomize-controller builds a
// Kustomization's path of the same tree, and source-controller a chart
// directory a HelmRelease or HelmChart names. A path made of a post-build
// variable is not known here.
func (n *needs) fluxObjects(p string) {
	if ext := path.Ext(p); ext != ".yaml" && ext != ".yml" {
		return
	}
	data, err := os.ReadFile(filepath.Join(n.root, filepath.FromSlash(p)))
	if err != nil || !strings.Contains(string(data), "toolkit.fluxcd.io") {
		return
	}
	for _, doc := range yamlDocs(data) {
		api, _ := doc["apiVersion"].(string)
		meta, _ := doc["metadata"].(map[string]any)
		name, _ := meta["name"].(string)
		spec, _ := doc["spec"].(map[string]any)
		switch {
		case doc["kind"] == "Kustomization" && strings.HasPrefix(api, "kustomize.toolkit.fluxcd.io/"):
			src, _ := spec["sourceRef"].(map[string]any)
			dir, _ := spec["path"].(string)
			switch {
			case src["kind"] != "GitRepository":
			case strings.Contains(dir, "${"):
				n.unknown = append(n.unknown, fmt.Sprintf("the Flux Kustomization %s (%s) builds path %q, which the cluster fills in", name, p, dir))
			default:
				by := fmt.Sprintf("the Flux Kustomization %s (%s)", name, p)
				n.build(cleanRel(dir), by)
				// spec.components are added to the build, relative to
				// spec.path (kustomize-controller api v1.9.5
				// kustomization_types.go Components; fluxcd/pkg/kustomize
				// v1.35.6 kustomize_generator.go adds them to the
				// kustomization it builds).
				comps, _ := spec["components"].([]any)
				for _, c := range comps {
					if c, ok := c.(string); ok && !strings.Contains(c, "://") {
						n.build(path.Clean(path.Join(cleanRel(dir), c)), "the components of "+by)
					}
				}
			}
		case doc["kind"] == "HelmRelease" && strings.HasPrefix(api, "helm.toolkit.fluxcd.io/"):
			chart, _ := spec["chart"].(map[string]any)
			cspec, _ := chart["spec"].(map[string]any)
			src, _ := cspec["sourceRef"].(map[string]any)
			dir, _ := cspec["chart"].(string)
			if src["kind"] == "GitRepository" {
				by := fmt.Sprintf("the HelmRelease %s (%s)", name, p)
				n.chart(cleanRel(dir), by)
				n.valuesFiles(cspec, by)
			}
		case doc["kind"] == "HelmChart" && strings.HasPrefix(api, "source.toolkit.fluxcd.io/"):
			src, _ := spec["sourceRef"].(map[string]any)
			dir, _ := spec["chart"].(string)
			if src["kind"] == "GitRepository" {
				by := fmt.Sprintf("the HelmChart %s (%s)", name, p)
				n.chart(cleanRel(dir), by)
				n.valuesFiles(spec, by)
			}
		}
	}
}

// chart records every file of the chart in dir: source-controller builds
// it whole, with the charts its Chart.yaml names as file:// dependencies
// (relative to the chart; source-controller v1.9.5's local builder
// resolves them inside the artifact).
func (n *needs) chart(dir, by string) {
	if strings.Contains(dir, "${") {
		n.unknown = append(n.unknown, fmt.Sprintf("%s builds the chart %q, which the cluster fills in", by, dir))
		return
	}
	if dir == ".." || strings.HasPrefix(dir, "../") || n.charts[dir] {
		return
	}
	n.charts[dir] = true
	for _, q := range n.list {
		if dir == "." || strings.HasPrefix(q, dir+"/") {
			n.need(q, fmt.Sprintf("a file of the Helm chart %s/, which source-controller builds for %s", dir, by))
		}
	}
	data, err := os.ReadFile(filepath.Join(n.root, filepath.FromSlash(path.Join(dir, "Chart.yaml"))))
	if err != nil {
		return
	}
	var c struct {
		Dependencies []struct {
			Repository string `yaml:"repository"`
		} `yaml:"dependencies"`
	}
	if yaml.Unmarshal(data, &c) != nil {
		return
	}
	for _, d := range c.Dependencies {
		if rel, ok := strings.CutPrefix(d.Repository, "file://"); ok {
			n.chart(path.Clean(path.Join(dir, rel)), fmt.Sprintf("a file:// dependency of the chart %s/ (%s)", dir, by))
		}
	}
}

// valuesFiles records the values files a chart is built with
// (spec.valuesFiles, paths from the source's root, which may lie outside
// the chart: source-controller merges them from the artifact's work
// directory).
func (n *needs) valuesFiles(spec map[string]any, by string) {
	list, _ := spec["valuesFiles"].([]any)
	for _, v := range list {
		if f, ok := v.(string); ok {
			if p := cleanRel(f); n.files[p] {
				n.need(p, "a values file of "+by)
			}
		}
	}
}

// BuildReads returns the files of the work tree holding dir (slash paths
// relative to its root, sorted) that the cluster's build reads from
// fluxPath, as the snapshot judges it (neededFiles over what git lists,
// minus what source-controller leaves out), and the work tree's root.
// Whatever a Kustomization the build applies decrypts is among them.
func BuildReads(ctx context.Context, dir, fluxPath string) (root string, files []string, err error) {
	repo, err := gogit.PlainOpenWithOptions(dir, &gogit.PlainOpenOptions{DetectDotGit: true, EnableDotGitCommonDir: true})
	if err != nil {
		return "", nil, fmt.Errorf("opening git repository at %s: %w", dir, err)
	}
	wt, err := repo.Worktree()
	if err != nil {
		return "", nil, fmt.Errorf("opening work tree of %s: %w", dir, err)
	}
	root = wt.Filesystem.Root()
	candidates, _, err := listCandidates(ctx, root)
	if err != nil {
		return "", nil, err
	}
	for p := range neededFiles(root, candidates, fluxStarts(fluxPath)).why {
		files = append(files, p)
	}
	sort.Strings(files)
	return root, files, nil
}
