package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// BinDirEnv overrides where the lab binaries are looked up (and built by
// lab/tools/build.sh).
const BinDirEnv = "BOOTSTRAP_LAB_BIN"

// ErrNoBinaries is wrapped by errors saying the lab binaries are not built.
var ErrNoBinaries = errors.New("lab binaries not built (run `make lab-bins` or lab/tools/build.sh)")

// Module paths recorded in the build manifest.
const (
	modKubernetes = "k8s.io/kubernetes"
	// modKubernetesPrevious is the previous minor's build (binaries
	// prefixed previous-).
	modKubernetesPrevious  = "k8s.io/kubernetes@previous"
	modEtcd                = "go.etcd.io/etcd/server/v3"
	modKwok                = "sigs.k8s.io/kwok"
	modSourceController    = "github.com/fluxcd/source-controller"
	modKustomizeController = "github.com/fluxcd/kustomize-controller"
	modHelmController      = "github.com/fluxcd/helm-controller"
	modCilium              = "github.com/cilium/cilium"
)

// binaryNames are the executables every lab needs (build.sh --demo builds
// these). The other Kubernetes minors' servers (prefixed previous-, 1.30-,
// 1.31-) are built only by a full build.sh (make lab-bins, make test): only
// upgrade rehearsals start them, and ServerBinary says when they are missing.
var binaryNames = []string{
	"etcd", "etcdutl", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
	"source-controller", "kustomize-controller", "helm-controller",
}

// Binaries is a directory of built lab binaries and the manifest build.sh
// wrote beside them.
type Binaries struct {
	// Dir holds the executables.
	Dir string
	// Modules maps a Go module path to its pinned version and, for modules
	// whose files the lab reads at start (kwok stages, Flux CRDs), its
	// directory in the module cache.
	Modules map[string]Module `json:"modules"`
}

// Module is one pinned Go module of the lab tools.
type Module struct {
	Version string `json:"version"`
	Dir     string `json:"dir,omitempty"`
}

// DefaultBinDir returns $BOOTSTRAP_LAB_BIN if set (made absolute: the lab
// starts its servers from other directories), else .lab/bin at the root of
// the repository containing the working directory.
func DefaultBinDir() (string, error) {
	if d := os.Getenv(BinDirEnv); d != "" {
		return filepath.Abs(d)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the lab binaries: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && modulePath(data) == "github.com/homelab/bootstrap" {
			return filepath.Join(dir, ".lab", "bin"), nil
		}
		if parent := filepath.Dir(dir); parent == dir {
			return "", fmt.Errorf("finding the lab binaries: no %s set and no bootstrap repository above %s: %w", BinDirEnv, wd, ErrNoBinaries)
		}
	}
}

// LoadBinaries checks that dir (DefaultBinDir when empty) holds every lab
// binary and a build manifest; the error wraps ErrNoBinaries when not.
func LoadBinaries(dir string) (*Binaries, error) {
	if dir == "" {
		d, err := DefaultBinDir()
		if err != nil {
			return nil, err
		}
		dir = d
	}
	data, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no manifest.json in %s: %w", dir, ErrNoBinaries)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the lab build manifest: %w", err)
	}
	b := &Binaries{Dir: dir}
	if err := json.Unmarshal(data, b); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", filepath.Join(dir, "manifest.json"), err)
	}
	for _, name := range binaryNames {
		if fi, err := os.Stat(b.Path(name)); err != nil || fi.Mode()&0o111 == 0 {
			return nil, fmt.Errorf("%s missing in %s: %w", name, dir, ErrNoBinaries)
		}
	}
	for _, m := range []string{modKubernetes, modKubernetesPrevious, modEtcd, modKwok, modSourceController, modKustomizeController, modHelmController, modCilium} {
		if b.Modules[m].Version == "" {
			return nil, fmt.Errorf("build manifest in %s names no version for %s: %w", dir, m, ErrNoBinaries)
		}
	}
	return b, nil
}

// Path returns the path of the named binary.
func (b *Binaries) Path(name string) string { return filepath.Join(b.Dir, name) }

// KubernetesVersion is the pinned version of the Kubernetes servers, e.g. "v1.36.1".
func (b *Binaries) KubernetesVersion() string { return b.Modules[modKubernetes].Version }

// PreviousKubernetesVersion is the version of the previous minor's
// servers, e.g. "v1.35.4".
func (b *Binaries) PreviousKubernetesVersion() string {
	return b.Modules[modKubernetesPrevious].Version
}

// ServerBinary returns the executable of a Kubernetes server
// (kube-apiserver, kube-controller-manager, kube-scheduler) for version and
// the version that build reports. The lab builds the pinned version, the
// previous minor and the minors a Kubernetes-first upgrade crosses (every
// k8s.io/kubernetes@<name> in the manifest, binaries prefixed <name>-); a
// version is served by the build of its minor, whatever its patch (the
// patch the build reports is what the server says). Empty: the pinned
// version. Another minor is an error naming the built ones.
func (b *Binaries) ServerBinary(name, version string) (path, runs string, err error) {
	if version == "" {
		return b.Path(name), b.KubernetesVersion(), nil
	}
	v := "v" + strings.TrimPrefix(version, "v")
	builds := b.kubernetesBuilds()
	var have []string
	for _, build := range builds {
		have = append(have, build.version)
		if minorOf(build.version) != "" && minorOf(build.version) == minorOf(v) {
			path := b.Path(build.prefix + name)
			if fi, err := os.Stat(path); err != nil || fi.Mode()&0o111 == 0 {
				return "", "", fmt.Errorf("%s %s: %s missing in %s (make lab-bins builds it; make demo leaves it out): %w", name, build.version, build.prefix+name, b.Dir, ErrNoBinaries)
			}
			return path, build.version, nil
		}
	}
	return "", "", fmt.Errorf("the lab builds %s %s, not %s (lab/tools/kubernetes* pin them)", name, strings.Join(have, ", "), v)
}

// kubernetesBuild is one Kubernetes version the lab builds servers of.
type kubernetesBuild struct{ prefix, version string }

// kubernetesBuilds lists the pinned build first, then the others the
// manifest names, by module key.
func (b *Binaries) kubernetesBuilds() []kubernetesBuild {
	out := []kubernetesBuild{{"", b.KubernetesVersion()}}
	var keys []string
	for k := range b.Modules {
		if strings.HasPrefix(k, modKubernetes+"@") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		out = append(out, kubernetesBuild{prefix: strings.TrimPrefix(k, modKubernetes+"@") + "-", version: b.Modules[k].Version})
	}
	return out
}

// minorOf returns "v1.36" of "v1.36.1" ("" when it is not a version).
func minorOf(v string) string {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return ""
	}
	return "v" + parts[0] + "." + parts[1]
}

// CiliumChart returns the directory of the real Cilium Helm chart
// (install/kubernetes/cilium) in the Cilium source the lab tools pin.
func (b *Binaries) CiliumChart(ctx context.Context) (string, error) {
	dir, err := b.ModuleDir(ctx, modCilium)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "install", "kubernetes", "cilium"), nil
}

// ModuleDir returns the source directory of a pinned module. When the module
// cache no longer holds it (it was cleaned since the build), it is
// downloaded again with `go mod download`.
func (b *Binaries) ModuleDir(ctx context.Context, module string) (string, error) {
	m, ok := b.Modules[module]
	if !ok {
		return "", fmt.Errorf("module %s is not pinned by the lab tools", module)
	}
	if m.Dir != "" {
		if _, err := os.Stat(m.Dir); err == nil {
			return m.Dir, nil
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", module+"@"+m.Version)
	cmd.Dir = os.TempDir()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("downloading %s@%s: %w: %s", module, m.Version, err, strings.TrimSpace(stderr.String()))
	}
	var info struct{ Dir string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		return "", fmt.Errorf("downloading %s@%s: no directory in `go mod download` output", module, m.Version)
	}
	return info.Dir, nil
}

// modulePath returns the module path a go.mod file declares.
func modulePath(gomod []byte) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}
