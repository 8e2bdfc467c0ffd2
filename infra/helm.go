// Package infra installs the cluster's base infrastructure: the NFS dynamic
// provisioner (Helm) with its StorageClass as the only default, optional
// Cilium first, and the precheck probe of the NFS export.
package infra

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/cli"
	"helm.sh/helm/v3/pkg/downloader"
	"helm.sh/helm/v3/pkg/getter"
	"helm.sh/helm/v3/pkg/registry"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/releaseutil"
	"helm.sh/helm/v3/pkg/repo"
	"helm.sh/helm/v3/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/homelab/bootstrap/kube"
)

// Release is a chart to keep installed at a pinned version with given values.
type Release struct {
	Name      string
	Namespace string
	RepoURL   string
	Chart     string
	Version   string
	Values    map[string]any
	// Timeout bounds the install/upgrade and the wait for its Deployments.
	Timeout time.Duration
	// Essential marks a release the cluster cannot lose (the CNI): once
	// handed to Flux, pruning must never uninstall it.
	Essential bool
}

func (r Release) String() string {
	return fmt.Sprintf("%s@%s as release %s in %s", r.Chart, r.Version, r.Name, r.Namespace)
}

// Action is what Plan decided for a release.
type Action string

// Actions of a release plan.
const (
	ActionNone    Action = "none"
	ActionInstall Action = "install"
	ActionUpgrade Action = "upgrade"
	// ActionRecover clears a release a killed run left pending or failed
	// (rollback or uninstall), then installs or upgrades.
	ActionRecover Action = "recover"
)

// Plan is what Apply would do to a release, and why.
type Plan struct {
	Action Action
	// Reason is one line for the user ("values changed: nfs.path").
	Reason string
	// Deployed is the live release, nil when there is none.
	Deployed *release.Release
	// Recover says how a stuck release is cleared before the install/upgrade.
	Recover string
	// RollbackTo is the revision a stuck upgrade rolls back to (0: uninstall).
	RollbackTo int
}

// Helm runs chart operations against one cluster.
type Helm struct {
	getter   *memoryGetter
	log      zerolog.Logger
	settings *cli.EnvSettings
	cs       kubernetes.Interface
	// dyn reads Flux's HelmReleases (FluxOwner).
	dyn dynamic.Interface

	// archives keeps each downloaded chart archive (repo, chart, version)
	// for the life of the client: a stage renders a chart and then
	// installs it, and should fetch it once. Each use loads a fresh chart
	// from the bytes (an install mutates what it is given).
	mu       sync.Mutex
	archives map[string][]byte
}

// NewHelm returns a Helm client for the cluster behind kubeconfig (held
// in memory; source names it in errors). Chart repository indexes and
// downloads use Helm's usual cache directories (HELM_CACHE_HOME and
// friends).
func NewHelm(kubeconfig []byte, source string, log zerolog.Logger) (*Helm, error) {
	cs, rc, err := kube.ClientsetFrom(kubeconfig, source)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	settings := cli.New()
	getter, err := newMemoryGetter(kubeconfig, settings.BurstLimit, settings.QPS)
	if err != nil {
		return nil, fmt.Errorf("helm: kubeconfig %s: %w", source, err)
	}
	return &Helm{getter: getter, log: log, settings: settings, cs: cs, dyn: dyn}, nil
}

// Clientset returns the typed client the Helm wrapper also uses for waits.
func (h *Helm) Clientset() kubernetes.Interface { return h.cs }

func (h *Helm) config(namespace string) (*action.Configuration, error) {
	// Templates without a namespace land in the namespace of the
	// RESTClientGetter, not in Install.Namespace: set both.
	cfg := new(action.Configuration)
	logf := func(format string, v ...any) { h.log.Debug().Str("component", "helm").Msgf(format, v...) }
	if err := cfg.Init(h.getter.inNamespace(namespace), namespace, "secret", logf); err != nil {
		return nil, fmt.Errorf("helm: %w", err)
	}
	return cfg, nil
}

// Plan inspects the live release and decides, without changing anything.
// A deployed release with the same chart version and the same values is
// left alone: Helm would otherwise write a new revision on every run.
func (h *Helm) Plan(ctx context.Context, r Release) (Plan, error) {
	revs, err := h.history(r)
	if err != nil {
		return Plan{}, err
	}
	if len(revs) == 0 {
		return Plan{Action: ActionInstall, Reason: fmt.Sprintf("install %s", r)}, nil
	}
	last := revs[len(revs)-1]
	var lastDeployed *release.Release
	for _, rv := range revs {
		if rv.Info.Status == release.StatusDeployed || rv.Info.Status == release.StatusSuperseded {
			lastDeployed = rv
		}
	}
	switch st := last.Info.Status; {
	case st == release.StatusUninstalled:
		return Plan{Action: ActionInstall, Reason: fmt.Sprintf("reinstall %s (previously uninstalled)", r)}, nil
	case st == release.StatusUninstalling:
		// A run killed while it uninstalled a stuck release (below)
		// leaves it uninstalling with part of its objects deleted
		// (helm v3.22.0 pkg/action/uninstall.go records the status
		// before deleting; IsPending does not count it): finish the
		// uninstall, then install.
		p := Plan{Action: ActionRecover, Deployed: last}
		p.Recover = fmt.Sprintf("finish uninstalling release %s, left uninstalling at revision %d", r.Name, last.Version)
		p.Reason = p.Recover + ", then install or upgrade " + r.String()
		return p, nil
	case st.IsPending() || st == release.StatusFailed:
		p := Plan{Action: ActionRecover, Deployed: last}
		if lastDeployed != nil && lastDeployed.Version != last.Version {
			p.RollbackTo = lastDeployed.Version
			p.Recover = fmt.Sprintf("roll release %s back from revision %d (%s) to %d", r.Name, last.Version, st, lastDeployed.Version)
		} else {
			p.Recover = fmt.Sprintf("uninstall release %s stuck in %s at revision %d", r.Name, st, last.Version)
		}
		p.Reason = p.Recover + ", then install or upgrade " + r.String()
		return p, nil
	}
	var diffs []string
	if v := last.Chart.Metadata.Version; v != r.Version {
		diffs = append(diffs, fmt.Sprintf("chart %s → %s", v, r.Version))
	}
	if keys := diffValues(last.Config, r.Values); len(keys) > 0 {
		diffs = append(diffs, "values changed: "+strings.Join(keys, ", "))
	}
	if len(diffs) == 0 {
		return Plan{Action: ActionNone, Reason: fmt.Sprintf("release %s/%s revision %d already has %s@%s and these values", r.Namespace, r.Name, last.Version, r.Chart, r.Version), Deployed: last}, nil
	}
	return Plan{Action: ActionUpgrade, Reason: fmt.Sprintf("upgrade release %s/%s (%s)", r.Namespace, r.Name, strings.Join(diffs, "; ")), Deployed: last}, nil
}

// history returns the release's last 20 revisions, oldest first; none when
// it was never installed.
func (h *Helm) history(r Release) ([]*release.Release, error) {
	cfg, err := h.config(r.Namespace)
	if err != nil {
		return nil, err
	}
	hist := action.NewHistory(cfg)
	hist.Max = 20
	revs, err := hist.Run(r.Name)
	if errors.Is(err, driver.ErrReleaseNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading history of release %s/%s: %w", r.Namespace, r.Name, err)
	}
	releaseutil.SortByRevision(revs)
	return revs, nil
}

// lastRelease returns the release's newest revision, nil when there is
// none.
func (h *Helm) lastRelease(r Release) (*release.Release, error) {
	revs, err := h.history(r)
	if err != nil || len(revs) == 0 {
		return nil, err
	}
	return revs[len(revs)-1], nil
}

// Verify checks, without changing anything, a release someone else owns
// (a Flux HelmRelease): its newest revision is deployed and its
// Deployments are available (waited for up to r.Timeout, as after an
// install). It returns that revision.
func (h *Helm) Verify(ctx context.Context, r Release, owner Owner) (*release.Release, error) {
	last, err := h.lastRelease(r)
	switch {
	case err != nil:
		return nil, err
	case last == nil:
		return nil, fmt.Errorf("release %s/%s is not installed and %s manages it: Flux installs it (flux get helmreleases -n %s)", r.Namespace, r.Name, owner, owner.Namespace)
	case last.Info.Status != release.StatusDeployed:
		return nil, fmt.Errorf("release %s/%s revision %d is %s and %s manages it: see its status (flux get helmreleases -n %s)", r.Namespace, r.Name, last.Version, last.Info.Status, owner, owner.Namespace)
	}
	if err := h.waitDeployments(ctx, r, last); err != nil {
		return nil, err
	}
	return last, nil
}

// Apply carries out a plan: recover a stuck release, then install or
// upgrade, then wait until the release's Deployments are Available. It
// returns the release now deployed.
func (h *Helm) Apply(ctx context.Context, r Release, p Plan) (*release.Release, error) {
	if p.Action == ActionNone {
		return p.Deployed, nil
	}
	cfg, err := h.config(r.Namespace)
	if err != nil {
		return nil, err
	}
	if p.Action == ActionRecover {
		h.log.Warn().Str("release", r.Name).Msg(p.Recover)
		if p.RollbackTo > 0 {
			rb := action.NewRollback(cfg)
			rb.Version, rb.Timeout, rb.Wait = p.RollbackTo, r.Timeout, false
			if err := rb.Run(r.Name); err != nil {
				return nil, fmt.Errorf("%s: %w", p.Recover, err)
			}
		} else {
			un := action.NewUninstall(cfg)
			un.Timeout = r.Timeout
			if _, err := un.Run(r.Name); err != nil && !errors.Is(err, driver.ErrReleaseNotFound) {
				return nil, fmt.Errorf("%s: %w", p.Recover, err)
			}
		}
		// Decide afresh now the release is clean.
		if p, err = h.Plan(ctx, r); err != nil {
			return nil, err
		}
		if p.Action == ActionNone {
			return p.Deployed, h.waitDeployments(ctx, r, p.Deployed)
		}
	}
	ch, err := h.loadChart(r)
	if err != nil {
		return nil, err
	}
	var rel *release.Release
	switch p.Action {
	case ActionInstall:
		if err := h.ensureNamespace(ctx, r.Namespace); err != nil {
			return nil, err
		}
		in := action.NewInstall(cfg)
		in.ReleaseName, in.Namespace, in.Timeout = r.Name, r.Namespace, r.Timeout
		// A reinstall after an uninstall keeps the name's history.
		in.Replace = true
		in.DisableOpenAPIValidation = skipFieldValidationProbe
		rel, err = in.RunWithContext(ctx, ch, copyValues(r.Values))
	case ActionUpgrade:
		up := action.NewUpgrade(cfg)
		up.Namespace, up.Timeout, up.ResetValues, up.MaxHistory = r.Namespace, r.Timeout, true, 10
		up.DisableOpenAPIValidation = skipFieldValidationProbe
		rel, err = up.RunWithContext(ctx, r.Name, ch, copyValues(r.Values))
	default:
		return nil, fmt.Errorf("unexpected plan %s", p.Action)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", p.Action, r, err)
	}
	return rel, h.waitDeployments(ctx, r, rel)
}

// ensureNamespace creates the release's namespace as Helm's
// --create-namespace does (labelled name=<namespace>, helm v3.22.0
// pkg/action/install.go), which would validate it against the OpenAPI
// document of core/v1 whatever skipFieldValidationProbe says.
func (h *Helm) ensureNamespace(ctx context.Context, ns string) error {
	_, err := h.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"name": ns}}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", ns, err)
	}
	return nil
}

// skipFieldValidationProbe turns off Helm's OpenAPI validation, which on
// any Kubernetes this tool supports validates nothing: with it, helm's
// kube client asks kubectl's validator for the Strict directive (helm
// v3.22.0 pkg/kube/client.go Build), which first asks whether the server
// supports the fieldValidation parameter and, since every server from
// 1.27 on does, skips the client-side schema (kubectl v0.37.0
// pkg/validation/schema.go paramVerifyingSchema); helm never passes the
// parameter itself, so the server validates as it does without it. That
// question alone fetched and parsed the OpenAPI v3 document of every
// group version in the chart: 50 MB of allocation, the largest single
// cost of a run and its peak memory.
const skipFieldValidationProbe = true

// Render renders the release's chart with its values as Helm would install
// it on this cluster (client-side: nothing is sent to the API server) and
// returns the manifest.
func (h *Helm) Render(ctx context.Context, r Release) (string, error) {
	ch, err := h.loadChart(r)
	if err != nil {
		return "", err
	}
	in := action.NewInstall(&action.Configuration{})
	in.DryRun, in.ClientOnly, in.ReleaseName, in.Namespace = true, true, r.Name, r.Namespace
	if v, err := h.cs.Discovery().ServerVersion(); err == nil {
		in.KubeVersion = &chartutil.KubeVersion{Version: v.GitVersion, Major: v.Major, Minor: v.Minor}
	}
	rel, err := in.RunWithContext(ctx, ch, copyValues(r.Values))
	if err != nil {
		return "", fmt.Errorf("rendering %s: %w", r, err)
	}
	return rel.Manifest, nil
}

// loadChart downloads the pinned chart version from its repository. It
// resolves through the repository index directly, so a local directory
// that happens to carry the chart's name is never picked up instead.
func (h *Helm) loadChart(r Release) (*chart.Chart, error) {
	h.mu.Lock()
	archive, ok := h.archives[r.chartKey()]
	h.mu.Unlock()
	if !ok {
		var err error
		if archive, err = downloadChart(h.settings, r); err != nil {
			return nil, err
		}
		h.Preload(r, archive)
	}
	ch, err := loader.LoadArchive(bytes.NewReader(archive))
	if err != nil {
		return nil, fmt.Errorf("loading chart %s@%s: %w", r.Chart, r.Version, err)
	}
	if ch.Metadata.Version != r.Version {
		return nil, fmt.Errorf("repository served %s@%s for version %s", ch.Metadata.Name, ch.Metadata.Version, r.Version)
	}
	return ch, nil
}

// IsOCI reports whether a chart repository URL names an OCI registry
// (oci://host/path): charts are then artifacts <path>/<chart>:<version>,
// with no index.yaml.
func IsOCI(repoURL string) bool { return strings.HasPrefix(repoURL, registry.OCIScheme+"://") }

// chartKey names a chart archive: repository, chart, version.
func (r Release) chartKey() string { return r.RepoURL + "\x00" + r.Chart + "\x00" + r.Version }

// Preload hands the client a chart archive fetched earlier (FetchChart)
// for r's chart version, so that it is not downloaded again. The archive
// is still checked when loaded: a repository that served another version
// is refused as if it had been downloaded now.
func (h *Helm) Preload(r Release, archive []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.archives == nil {
		h.archives = map[string][]byte{}
	}
	h.archives[r.chartKey()] = archive
}

// FetchChart downloads the archive of r's pinned chart version as a Helm
// client would (Helm's usual repository settings and caches), without a
// cluster: the infra stage fetches its charts while the cluster comes up.
func FetchChart(r Release) ([]byte, error) { return downloadChart(cli.New(), r) }

// downloadChart fetches the archive of the pinned chart version.
func downloadChart(settings *cli.EnvSettings, r Release) ([]byte, error) {
	if IsOCI(r.RepoURL) {
		return pullOCIChart(settings, r)
	}
	getters := getter.All(settings)
	url, err := repo.FindChartInRepoURL(r.RepoURL, r.Chart, r.Version, "", "", "", getters)
	if err != nil {
		return nil, fmt.Errorf("finding chart %s@%s in %s: %w", r.Chart, r.Version, r.RepoURL, err)
	}
	dir, err := os.MkdirTemp("", "bootstrap-chart-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	dl := downloader.ChartDownloader{Out: io.Discard, Getters: getters, Verify: downloader.VerifyNever,
		RepositoryConfig: settings.RepositoryConfig, RepositoryCache: settings.RepositoryCache}
	path, _, err := dl.DownloadTo(url, r.Version, dir)
	if err != nil {
		return nil, fmt.Errorf("downloading chart %s@%s: %w", r.Chart, r.Version, err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading chart %s: %w", filepath.Base(path), err)
	}
	return b, nil
}

// pullOCIChart pulls <repo>/<chart>:<version> with Helm's registry client,
// as `helm pull oci://…` does (credentials from Helm's registry config;
// a registry that answers plain HTTP is used over HTTP, the v3 client's
// fallback).
func pullOCIChart(settings *cli.EnvSettings, r Release) ([]byte, error) {
	c, err := registry.NewClient(registry.ClientOptWriter(io.Discard), registry.ClientOptCredentialsFile(settings.RegistryConfig))
	if err != nil {
		return nil, fmt.Errorf("Helm registry client: %w", err)
	}
	ref := strings.TrimPrefix(strings.TrimSuffix(r.RepoURL, "/"), registry.OCIScheme+"://") + "/" + r.Chart + ":" + r.Version
	res, err := c.Pull(ref, registry.PullOptWithChart(true))
	if err != nil {
		return nil, fmt.Errorf("pulling chart %s@%s from %s: %w", r.Chart, r.Version, r.RepoURL, err)
	}
	return res.Chart.Data, nil
}

// waitDeployments waits for every Deployment in the release's manifest.
func (h *Helm) waitDeployments(ctx context.Context, r Release, rel *release.Release) error {
	if rel == nil {
		return nil
	}
	for _, d := range ManifestObjects(rel.Manifest, "Deployment") {
		ns := d.Namespace
		if ns == "" {
			ns = r.Namespace
		}
		if err := kube.WaitDeploymentAvailable(ctx, h.cs, ns, d.Name, r.Timeout, h.log); err != nil {
			return err
		}
	}
	return nil
}

// ManifestObject names one object of a rendered release manifest.
type ManifestObject struct {
	Kind, Name, Namespace string
}

// ManifestObjects lists the objects of kind in a release manifest.
func ManifestObjects(manifest, kind string) []ManifestObject {
	var out []ManifestObject
	for _, doc := range releaseutil.SplitManifests(manifest) {
		var m struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if yaml.Unmarshal([]byte(doc), &m) == nil && m.Kind == kind {
			out = append(out, ManifestObject{Kind: m.Kind, Name: m.Metadata.Name, Namespace: m.Metadata.Namespace})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// MergeValuesFile returns base with the YAML values file at path merged on
// top (the file wins), leaving base untouched.
func MergeValuesFile(base map[string]any, path string) (map[string]any, error) {
	if path == "" {
		return base, nil
	}
	user, err := chartutil.ReadValuesFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading values file %s: %w", path, err)
	}
	return chartutil.CoalesceTables(copyValues(user.AsMap()), copyValues(base)), nil
}

// normalize turns values into their JSON form so numbers and nested maps
// compare equal however they were built (int vs float64, map types).
func normalize(v map[string]any) map[string]any {
	b, _ := json.Marshal(v)
	out := map[string]any{}
	_ = json.Unmarshal(b, &out)
	return out
}

func copyValues(v map[string]any) map[string]any { return normalize(v) }

// diffValues lists the dotted keys whose values differ.
func diffValues(live, want map[string]any) []string {
	a, b := flatten(normalize(live), ""), flatten(normalize(want), "")
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	var out []string
	for k := range keys {
		if !reflect.DeepEqual(a[k], b[k]) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func flatten(m map[string]any, prefix string) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		key := prefix + k
		if sub, ok := v.(map[string]any); ok && len(sub) > 0 {
			for kk, vv := range flatten(sub, key+".") {
				out[kk] = vv
			}
			continue
		}
		out[key] = v
	}
	return out
}
