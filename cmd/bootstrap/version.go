package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// VersionCmd is `bootstrap version`.
type VersionCmd struct{}

// Run prints the version and the versions of the libraries that speak to
// Proxmox, Talos, Kubernetes, Helm and Flux.
func (VersionCmd) Run(a *App) error {
	fmt.Fprintf(a.Stdout, "bootstrap %s (%s, %s/%s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return nil
	}
	want := []struct{ label, path string }{
		{"talos machinery", "github.com/siderolabs/talos/pkg/machinery"},
		{"proxmox-api-go", "github.com/Telmate/proxmox-api-go"},
		{"client-go", "k8s.io/client-go"},
		{"helm", "helm.sh/helm/v3"},
		{"flux", "github.com/fluxcd/flux2/v2"},
		{"go-git", "github.com/go-git/go-git/v5"},
	}
	for _, w := range want {
		for _, d := range info.Deps {
			if d.Path == w.path {
				fmt.Fprintf(a.Stdout, "  %-16s %s\n", w.label, d.Version)
			}
		}
	}
	return nil
}
