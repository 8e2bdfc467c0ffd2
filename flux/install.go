// Package flux installs Flux from a manifests source (the release download,
// a mirror, or a local tarball or directory for air-gapped hosts), points a
// GitRepository and a Kustomization at the cluster's repository, and waits
// until both are Ready at the expected revision.
package flux

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/fluxcd/flux2/v2/pkg/manifestgen/install"
	ssautil "github.com/fluxcd/pkg/ssa/utils"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/kustomize/kyaml/openapi"

	"github.com/homelab/bootstrap/internal/fsutil"
)

// ReleaseBaseURL is where Flux publishes manifests.tar.gz per version.
const ReleaseBaseURL = "https://github.com/fluxcd/flux2/releases"

// InstallOptions say which Flux to install and where its manifests come from.
type InstallOptions struct {
	// Version of Flux, e.g. v2.9.5.
	Version string
	// Manifests is "" for the release download, an http(s) URL of a
	// manifests.tar.gz mirror, or a local tarball or directory.
	Manifests string
	// Components to install, e.g. source-controller, kustomize-controller.
	Components []string
	// ClusterDomain is the cluster's DNS domain (Talos'
	// cluster.network.dnsDomain); the controllers reach
	// notification-controller at <svc>.<ns>.svc.<domain>. Empty:
	// cluster.local, flux2's default.
	ClusterDomain string
	Namespace     string
	// CacheDir, when set, keeps each rendering there under a hash of
	// everything it was rendered from (renderKey), so a later run with
	// the same manifests and options reads it instead of running
	// kustomize again: about 120 MB of allocation and 150 ms of CPU, the
	// largest memory peak of a converged re-run.
	CacheDir string
}

// Source describes where the manifests were taken from, for messages.
func (o InstallOptions) Source() string {
	if o.Manifests == "" {
		return fmt.Sprintf("%s/download/%s/manifests.tar.gz", ReleaseBaseURL, o.Version)
	}
	return o.Manifests
}

// InstallObjects renders Flux's install manifests with flux2's manifestgen
// and returns them as objects ready for server-side apply.
func InstallObjects(ctx context.Context, o InstallOptions) ([]*unstructured.Unstructured, error) {
	m, err := RenderInstall(ctx, o)
	if err != nil {
		return nil, err
	}
	return ParseInstall(m)
}

// ParseInstall reads rendered install manifests into objects.
func ParseInstall(manifests string) ([]*unstructured.Unstructured, error) {
	objs, err := ssautil.ReadObjects(strings.NewReader(manifests))
	if err != nil {
		return nil, fmt.Errorf("reading generated Flux manifests: %w", err)
	}
	return objs, nil
}

// RenderInstall renders Flux's install manifests with flux2's manifestgen,
// as multi-document YAML. Held as text they take a fraction of the memory
// of the objects they parse into.
func RenderInstall(ctx context.Context, o InstallOptions) (string, error) {
	base, err := os.MkdirTemp("", "bootstrap-flux-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(base)
	if err := fetchManifests(ctx, o, base); err != nil {
		return "", fmt.Errorf("Flux manifests from %s: %w", o.Source(), err)
	}
	var cached string
	if o.CacheDir != "" {
		key, err := renderKey(base, o)
		if err != nil {
			return "", err
		}
		cached = filepath.Join(o.CacheDir, key+".yaml")
		if b, err := os.ReadFile(cached); err == nil {
			return string(b), nil
		}
	}
	opts := install.MakeDefaultOptions()
	opts.Version = o.Version
	opts.Namespace = o.Namespace
	opts.Components = o.Components
	if o.ClusterDomain != "" {
		opts.ClusterDomain = o.ClusterDomain
	}
	// The manifests are already in base; an http BaseURL makes manifestgen
	// generate the kustomization over them instead of treating BaseURL as
	// a prebuilt directory.
	opts.BaseURL = ReleaseBaseURL
	opts.Timeout = time.Minute
	defer tightGC()()
	m, err := install.Generate(opts, base)
	// kustomize parses its built-in Kubernetes OpenAPI schema into a
	// package global and keeps it for the life of the process
	// (sigs.k8s.io/kustomize/kyaml v0.21.1 openapi/openapi.go globalSchema):
	// about 10 MiB of heap through the Helm install and Flux's apply,
	// which read none of it. It goes with the render; a later build
	// parses it again.
	openapi.ResetOpenAPI()
	if err != nil {
		return "", fmt.Errorf("generating Flux %s manifests: %w", o.Version, err)
	}
	if cached != "" {
		// The cache only saves work: one that cannot be written is
		// skipped, and the rendering is returned all the same.
		if os.MkdirAll(o.CacheDir, 0o755) == nil {
			_ = fsutil.WriteAtomic(cached, []byte(m.Content), 0o644)
		}
	}
	return m.Content, nil
}

// renderKey hashes what a rendering depends on: the manifest files, the
// options, and the versions of the code that renders (flux2's manifestgen
// and kustomize, from the binary's build information).
func renderKey(dir string, o InstallOptions) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "version=%s\nnamespace=%s\ndomain=%s\ncomponents=%s\n", o.Version, o.Namespace, o.ClusterDomain, strings.Join(o.Components, ","))
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if strings.HasPrefix(d.Path, "github.com/fluxcd/flux2") || strings.HasPrefix(d.Path, "sigs.k8s.io/kustomize") {
				fmt.Fprintf(h, "module=%s@%s\n", d.Path, d.Version)
			}
		}
	}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "file=%s %d\n", filepath.ToSlash(rel), len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// fetchManifests puts the release's manifest files (<component>.yaml,
// rbac.yaml, policies.yaml…) into dir.
func fetchManifests(ctx context.Context, o InstallOptions, dir string) error {
	src := o.Source()
	if strings.HasPrefix(src, "http://") || strings.HasPrefix(src, "https://") {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, src, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", src, resp.Status)
		}
		return untar(io.LimitReader(resp.Body, 64<<20), dir)
	}
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if !st.IsDir() {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		return untar(f, dir)
	}
	// A directory: copy its YAML files, because manifestgen writes into
	// the directory it is given and the user's copy must stay untouched.
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
}

// untar extracts the regular files of a gzipped tarball into dir, refusing
// paths that would escape it.
func untar(r io.Reader, dir string) error {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return err
	}
	tr := tar.NewReader(gz)
	n := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		name := filepath.Clean(h.Name)
		if filepath.IsAbs(name) || strings.HasPrefix(name, "..") {
			return fmt.Errorf("tarball entry %q escapes the extraction directory", h.Name)
		}
		var buf bytes.Buffer
		if _, err := io.Copy(&buf, io.LimitReader(tr, 32<<20)); err != nil {
			return err
		}
		dst := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(dst, buf.Bytes(), 0o644); err != nil {
			return err
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("the tarball holds no files")
	}
	return nil
}

// renderGCPercent is the GC target while kustomize builds the install: it
// allocates about 240 MB to build 2 MB of YAML (copies of every node at
// each transformer, the built-in OpenAPI schema parsed for the strategic
// merge patch), and at Go's default target a run's resident set peaked at
// that moment, 10 MiB above the rest of the run. The build takes a few
// tenths of a second of a background preparer's time.
const renderGCPercent = 20

var (
	gcMu     sync.Mutex
	gcTight  int // renders in flight
	gcBefore int // the target to restore when the last one ends
)

// tightGC lowers the process's GC target for a rendering and returns what
// restores it; overlapping renderings restore it when the last one ends.
func tightGC() (restore func()) {
	gcMu.Lock()
	defer gcMu.Unlock()
	if gcTight == 0 {
		gcBefore = debug.SetGCPercent(renderGCPercent)
	}
	gcTight++
	return func() {
		gcMu.Lock()
		defer gcMu.Unlock()
		if gcTight--; gcTight == 0 {
			debug.SetGCPercent(gcBefore)
		}
	}
}
