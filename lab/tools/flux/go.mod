// Pins the Flux source-controller and kustomize-controller the lab runs.
module github.com/homelab/bootstrap/lab/tools/flux

go 1.26.1

require (
	github.com/fluxcd/kustomize-controller v1.9.5
	github.com/fluxcd/source-controller v1.9.5
)

replace (
	// The versions the controllers' go.mod name are not all on the module proxy.
	github.com/fluxcd/pkg/artifact => github.com/fluxcd/pkg/artifact v0.18.1
	github.com/opencontainers/go-digest => github.com/opencontainers/go-digest v1.0.1-0.20220411205349-bde1400a84be
	gopkg.in/yaml.v3 => gopkg.in/yaml.v3 v3.0.1
	sigs.k8s.io/kustomize/api => sigs.k8s.io/kustomize/api v0.21.1
	sigs.k8s.io/kustomize/kyaml => sigs.k8s.io/kustomize/kyaml v0.21.1
)
