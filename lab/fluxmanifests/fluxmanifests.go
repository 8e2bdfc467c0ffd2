// Package fluxmanifests builds and serves a Flux manifests.tar.gz laid out
// like a Flux release (<component>.yaml with CRDs and Deployment, rbac.yaml,
// policies.yaml) for the components the lab pins, so the flux stage
// installs Flux through its normal "manifests URL" setting without GitHub.
//
// It does what the Flux release does, from Go module sources: each pinned
// controller's config/crd and config/manager are built with kustomize, the
// Flux distribution's manifests/bases/<component> are built on top of them in
// place of the release download URLs, and manifests/rbac and
// manifests/policies are built as they are.
package fluxmanifests

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/homelab/bootstrap/internal/targz"
	"github.com/homelab/bootstrap/lab/kube"
)

// Components are the Flux controllers the lab pins and bundles: Flux's
// default set. notification-controller's CRDs are generated from its
// pinned API module (lab/tools/build.sh) and its Deployment is a stand-in
// (standin/notification-controller) that kwok runs without executing.
var Components = []string{"source-controller", "kustomize-controller", "helm-controller", "notification-controller"}

// standins holds config/manager stand-ins for controllers whose module
// the module proxy does not serve.
//
//go:embed all:standin
var standins embed.FS

// Sources says where the Flux distribution and the controllers' sources are.
type Sources struct {
	// Flux2Dir is the github.com/fluxcd/flux2/v2 module directory.
	Flux2Dir string
	// Flux2Version is its version, e.g. "v2.9.5".
	Flux2Version string
	// ControllerDirs maps a component name to its module directory.
	ControllerDirs map[string]string
	// ControllerVersions maps a component name to its pinned version.
	ControllerVersions map[string]string
}

// SourcesFromBinaries locates the sources recorded by lab/tools/build.sh.
func SourcesFromBinaries(ctx context.Context, b *kube.Binaries) (Sources, error) {
	const flux2 = "github.com/fluxcd/flux2/v2"
	s := Sources{Flux2Version: b.Modules[flux2].Version, ControllerDirs: map[string]string{}, ControllerVersions: map[string]string{}}
	if s.Flux2Version == "" {
		return s, fmt.Errorf("the lab build manifest names no %s (rebuild with `make lab-bins`): %w", flux2, kube.ErrNoBinaries)
	}
	var err error
	if s.Flux2Dir, err = b.ModuleDir(ctx, flux2); err != nil {
		return s, err
	}
	for _, c := range Components {
		mod := "github.com/fluxcd/" + c
		if s.ControllerDirs[c], err = b.ModuleDir(ctx, mod); err != nil {
			return s, err
		}
		s.ControllerVersions[c] = b.Modules[mod].Version
	}
	return s, nil
}

// releaseURL matches the release downloads a manifests/bases kustomization
// lists: .../<component>/releases/download/<version>/<component>.<kind>.yaml
var releaseURL = regexp.MustCompile(`^https://github\.com/fluxcd/([a-z-]+)/releases/download/(v[^/]+)/([a-z-]+)\.(crds|deployment)\.yaml$`)

// Build returns manifests.tar.gz for the pinned components.
func Build(src Sources) ([]byte, error) {
	work, err := os.MkdirTemp("", "bootstrap-lab-fluxmanifests-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)

	files := map[string][]byte{}
	for _, c := range Components {
		out, err := buildComponent(src, c, filepath.Join(work, c))
		if err != nil {
			return nil, fmt.Errorf("building %s.yaml: %w", c, err)
		}
		files[c+".yaml"] = out
	}
	for _, name := range []string{"rbac", "policies"} {
		out, err := kustomizeBuild(filepath.Join(src.Flux2Dir, "manifests", name))
		if err != nil {
			return nil, fmt.Errorf("building %s.yaml: %w", name, err)
		}
		files[name+".yaml"] = out
	}
	return targz.Pack(files, 0o644, time.Unix(0, 0))
}

// buildComponent builds manifests/bases/<c> of the Flux distribution with
// the release downloads replaced by the same files built from the pinned
// controller's config/ directory.
func buildComponent(src Sources, c, dir string) ([]byte, error) {
	ctrlDir, ok := src.ControllerDirs[c]
	if !ok {
		return nil, fmt.Errorf("no module directory for %s", c)
	}
	baseDir := filepath.Join(src.Flux2Dir, "manifests", "bases", c)
	entries, err := os.ReadDir(baseDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(baseDir, e.Name()))
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o600); err != nil {
			return nil, err
		}
	}
	kustomization, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var lines []string
	replaced := 0
	for _, line := range strings.Split(string(kustomization), "\n") {
		trimmed := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "- "))
		m := releaseURL.FindStringSubmatch(trimmed)
		if m == nil {
			lines = append(lines, line)
			continue
		}
		repo, version, kind := m[1], m[2], m[4]
		if repo != c || m[3] != c {
			return nil, fmt.Errorf("%s lists %s, not a %s release file", baseDir, trimmed, c)
		}
		if want := src.ControllerVersions[c]; want != "" && version != want {
			return nil, fmt.Errorf("Flux %s bundles %s %s but the lab pins %s", src.Flux2Version, c, version, want)
		}
		sub := "manager"
		if kind == "crds" {
			sub = "crd"
		}
		from := filepath.Join(ctrlDir, "config", sub)
		if _, err := os.Stat(from); errors.Is(err, os.ErrNotExist) && sub == "manager" {
			if from, err = writeStandin(c, filepath.Join(dir, "standin-manager")); err != nil {
				return nil, err
			}
		}
		out, err := kustomizeBuild(from)
		if err != nil {
			return nil, err
		}
		local := c + "." + kind + ".yaml"
		if err := os.WriteFile(filepath.Join(dir, local), out, 0o600); err != nil {
			return nil, err
		}
		lines = append(lines, strings.Replace(line, trimmed, local, 1))
		replaced++
	}
	if replaced != 2 {
		return nil, fmt.Errorf("%s: expected the crds and deployment release URLs, replaced %d", baseDir, replaced)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		return nil, err
	}
	return kustomizeBuild(dir)
}

// writeStandin writes the embedded config/manager stand-in of controller c
// into dir and returns dir.
func writeStandin(c, dir string) (string, error) {
	root := path.Join("standin", c)
	entries, err := fs.ReadDir(standins, root)
	if err != nil {
		return "", fmt.Errorf("%s has no config/manager and the lab no stand-in for it: %w", c, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	for _, e := range entries {
		data, err := fs.ReadFile(standins, path.Join(root, e.Name()))
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o600); err != nil {
			return "", err
		}
	}
	return dir, nil
}

func kustomizeBuild(dir string) ([]byte, error) {
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return m.AsYaml()
}

// Server serves a manifests tarball at the paths a Flux release has:
// <base>/download/<version>/manifests.tar.gz and
// <base>/latest/download/manifests.tar.gz.
type Server struct {
	baseURL string
	version string
	srv     *http.Server
	done    chan error

	mu        sync.Mutex
	downloads int
	closeOnce sync.Once
	closeErr  error
}

// ServeOptions configures Serve.
type ServeOptions struct {
	// Addr is the listen address (default 127.0.0.1:0).
	Addr string
	// Version is the release version served (the Flux distribution's).
	Version string
	// Tarball is the manifests.tar.gz content.
	Tarball []byte
	// Log receives one line per download.
	Log zerolog.Logger
}

// Serve serves the tarball until Close.
func Serve(opts ServeOptions) (*Server, error) {
	if opts.Version == "" || len(opts.Tarball) == 0 {
		return nil, errors.New("serving Flux manifests: version and tarball are required")
	}
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("Flux manifests server listening on %s: %w", addr, err)
	}
	s := &Server{baseURL: "http://" + l.Addr().String(), version: opts.Version, done: make(chan error, 1)}
	log := opts.Log.With().Str("component", "lab-flux-manifests").Logger()
	mux := http.NewServeMux()
	handler := func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.downloads++
		s.mu.Unlock()
		log.Debug().Str("path", r.URL.Path).Msg("manifests download")
		w.Header().Set("Content-Type", "application/gzip")
		http.ServeContent(w, r, "manifests.tar.gz", time.Unix(0, 0), bytes.NewReader(opts.Tarball))
	}
	mux.HandleFunc("GET /download/"+opts.Version+"/manifests.tar.gz", handler)
	mux.HandleFunc("GET /latest/download/manifests.tar.gz", handler)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { s.done <- s.srv.Serve(l) }()
	log.Info().Str("base_url", s.baseURL).Str("version", opts.Version).Msg("Flux manifests serving")
	return s, nil
}

// BaseURL is what Flux's install options take as BaseURL (the equivalent of
// https://github.com/fluxcd/flux2/releases).
func (s *Server) BaseURL() string { return s.baseURL }

// Version is the release version served.
func (s *Server) Version() string { return s.version }

// URL is the full tarball URL for the served version.
func (s *Server) URL() string { return s.baseURL + "/download/" + s.version + "/manifests.tar.gz" }

// Downloads counts tarball downloads.
func (s *Server) Downloads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.downloads
}

// Close stops serving.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if err := s.srv.Close(); err != nil {
			s.closeErr = fmt.Errorf("closing the Flux manifests server: %w", err)
		}
		<-s.done
	})
	return s.closeErr
}
