// Package ociregistry runs a real OCI registry in-process for the lab:
// distribution's own registry (github.com/distribution/distribution/v3,
// the code of the CNCF Distribution registry, the version Helm v3.22.0 tests
// its registry client with) on loopback, plain HTTP, in-memory storage,
// anonymous. Charts are pushed to it with Helm's own registry client, so
// what it serves is exactly what `helm push` would have stored.
package ociregistry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory" // the storage the lab uses
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/registry"
)

// Registry is a running registry.
type Registry struct {
	srv  *http.Server
	addr string
}

// Start serves a registry on a free loopback port until Close.
func Start() (*Registry, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	cfg := &configuration.Configuration{}
	cfg.Storage = configuration.Storage{"inmemory": configuration.Parameters{}}
	cfg.HTTP.Addr = ln.Addr().String()
	// Without a secret distribution generates one and warns; the lab is
	// one process.
	cfg.HTTP.Secret = "bootstrap-lab"
	cfg.Log.Level = "error"
	app := handlers.NewApp(context.Background(), cfg)
	r := &Registry{addr: ln.Addr().String(), srv: &http.Server{Handler: app, ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		if err := r.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Fprintf(os.Stderr, "lab OCI registry: %v\n", err)
		}
	}()
	return r, nil
}

// Close stops the registry.
func (r *Registry) Close() { _ = r.srv.Close() }

// Host is the registry's host:port.
func (r *Registry) Host() string { return r.addr }

// RepoURL is the oci:// chart repository URL for path ("charts"):
// oci://host:port/charts, as a HelmRepository of type oci and the infra
// stage's chartRepo name it.
func (r *Registry) RepoURL(path string) string {
	return "oci://" + r.addr + "/" + strings.Trim(path, "/")
}

// PushChart packages ch and pushes it under path as
// <host>/<path>/<name>:<version>, with Helm's registry client (plain HTTP).
func (r *Registry) PushChart(path string, ch *chart.Chart) error {
	dir, err := os.MkdirTemp("", "lab-oci-chart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	file, err := chartutil.Save(ch, dir)
	if err != nil {
		return err
	}
	return r.PushArchive(path, ch.Metadata.Name, ch.Metadata.Version, file)
}

// PushArchive pushes a packaged chart (.tgz) as <host>/<path>/<name>:<version>.
func (r *Registry) PushArchive(path, name, version, file string) error {
	data, err := os.ReadFile(filepath.Clean(file))
	if err != nil {
		return err
	}
	c, err := registry.NewClient(registry.ClientOptPlainHTTP(), registry.ClientOptWriter(io.Discard))
	if err != nil {
		return err
	}
	ref := fmt.Sprintf("%s/%s/%s:%s", r.addr, strings.Trim(path, "/"), name, version)
	if _, err := c.Push(data, ref); err != nil {
		return fmt.Errorf("pushing %s: %w", ref, err)
	}
	return nil
}
