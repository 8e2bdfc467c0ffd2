// Package chartrepo serves the lab's Helm chart repository (index.yaml and
// packaged charts over HTTP). It serves real charts where they can be had
// here (Options.Charts: the Cilium chart from the Cilium source the lab
// tools pin) and the project's stand-ins under charts/ for the rest: an
// nfs-subdir-external-provisioner chart that renders what upstream 4.0.18
// renders (docs/lab.md lists the differences).
package chartrepo

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/repo"
)

//go:embed all:charts
var chartSources embed.FS

// Options configures the chart repository server.
type Options struct {
	// Addr is the listen address (default 127.0.0.1:0).
	Addr string
	// Log receives one line per request.
	Log zerolog.Logger
	// Charts are chart directories served besides the stand-ins, such as
	// the real Cilium chart (kube.Binaries.CiliumChart).
	Charts []string
	// AlsoAs serves a stand-in chart (by name) at more versions than its
	// own, from the same templates and values, so a chart version bump can
	// be rolled out in the lab (docs/lab.md: the stand-in renders what its
	// own version renders at every version).
	AlsoAs map[string][]string
}

// Chart is one chart version the repository serves.
type Chart struct {
	Name    string
	Version string
}

// Repo is a running chart repository.
type Repo struct {
	dir    string
	url    string
	charts []Chart
	srv    *http.Server
	done   chan error
	log    zerolog.Logger

	mu       sync.Mutex
	requests map[string]int

	closeOnce sync.Once
	closeErr  error
}

// Start packages the lab charts into a temporary directory, indexes them
// for the server's URL and serves them until Close.
func Start(opts Options) (*Repo, error) {
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("chart repository listening on %s: %w", addr, err)
	}
	dir, err := os.MkdirTemp("", "bootstrap-lab-charts-*")
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("creating the chart repository dir: %w", err)
	}
	r := &Repo{dir: dir, url: "http://" + l.Addr().String(), log: opts.Log.With().Str("component", "lab-charts").Logger(), done: make(chan error, 1), requests: map[string]int{}}
	if r.charts, err = PackageVersions(dir, opts.AlsoAs, opts.Charts...); err != nil {
		l.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	idx, err := repo.IndexDirectory(dir, r.url)
	if err != nil {
		l.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("indexing the lab charts: %w", err)
	}
	idx.SortEntries()
	if err := idx.WriteFile(filepath.Join(dir, "index.yaml"), 0o644); err != nil {
		l.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("writing index.yaml: %w", err)
	}
	files := http.FileServer(http.Dir(dir))
	r.srv = &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			r.mu.Lock()
			r.requests[path.Clean(req.URL.Path)]++
			r.mu.Unlock()
			r.log.Debug().Str("path", req.URL.Path).Msg("chart repository request")
			files.ServeHTTP(w, req)
		}),
	}
	go func() { r.done <- r.srv.Serve(l) }()
	r.log.Info().Str("url", r.url).Msg("chart repository serving")
	return r, nil
}

// Package writes every stand-in chart under charts/, and the charts in the
// directories dirs, as <name>-<version>.tgz into outDir.
func Package(outDir string, dirs ...string) ([]Chart, error) {
	return PackageVersions(outDir, nil, dirs...)
}

// PackageVersions is Package that also writes the stand-ins named in alsoAs
// at each of the versions listed for them.
func PackageVersions(outDir string, alsoAs map[string][]string, dirs ...string) ([]Chart, error) {
	entries, err := fs.ReadDir(chartSources, "charts")
	if err != nil {
		return nil, fmt.Errorf("listing the lab charts: %w", err)
	}
	var charts []*chart.Chart
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		files, err := chartFiles(path.Join("charts", e.Name()))
		if err != nil {
			return nil, err
		}
		ch, err := loader.LoadFiles(files)
		if err != nil {
			return nil, fmt.Errorf("loading lab chart %s: %w", e.Name(), err)
		}
		charts = append(charts, ch)
		for _, v := range alsoAs[ch.Name()] {
			// A fresh load: Save writes the metadata it is given.
			again, err := loader.LoadFiles(files)
			if err != nil {
				return nil, err
			}
			again.Metadata.Version = v
			charts = append(charts, again)
		}
	}
	for _, d := range dirs {
		ch, err := loader.LoadDir(d)
		if err != nil {
			return nil, fmt.Errorf("loading chart %s: %w", d, err)
		}
		charts = append(charts, ch)
	}
	var out []Chart
	for _, ch := range charts {
		if err := ch.Validate(); err != nil {
			return nil, fmt.Errorf("lab chart %s: %w", ch.Name(), err)
		}
		if _, err := chartutil.Save(ch, outDir); err != nil {
			return nil, fmt.Errorf("packaging lab chart %s: %w", ch.Name(), err)
		}
		out = append(out, Chart{Name: ch.Metadata.Name, Version: ch.Metadata.Version})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Version < out[j].Version
	})
	return out, nil
}

func chartFiles(root string) ([]*loader.BufferedFile, error) {
	var files []*loader.BufferedFile
	err := fs.WalkDir(chartSources, root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := chartSources.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, &loader.BufferedFile{Name: strings.TrimPrefix(p, root+"/"), Data: data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading lab chart %s: %w", root, err)
	}
	return files, nil
}

// URL is the repository URL (what `helm repo add` takes).
func (r *Repo) URL() string { return r.url }

// Charts lists the chart versions served.
func (r *Repo) Charts() []Chart { return append([]Chart(nil), r.charts...) }

// Requests returns how often a path (e.g. "/index.yaml") was requested.
func (r *Repo) Requests(p string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.requests[path.Clean(p)]
}

// Close stops serving and removes the packaged charts.
func (r *Repo) Close() error {
	r.closeOnce.Do(func() {
		err := r.srv.Close()
		<-r.done
		if rerr := os.RemoveAll(r.dir); rerr != nil {
			err = errors.Join(err, rerr)
		}
		if err != nil {
			r.closeErr = fmt.Errorf("closing the chart repository: %w", err)
		}
	})
	return r.closeErr
}
