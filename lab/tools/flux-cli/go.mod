// Pins the flux CLI at the Flux distribution the product installs (the
// root go.mod's github.com/fluxcd/flux2/v2; build.sh refuses a mismatch),
// for the e2e tests that read the installed Flux with flux check/get/tree.
// cmd/flux embeds manifests its release generates (kustomize over remote
// bases): build.sh builds it from a copy of the module with a placeholder
// there, which only flux install/bootstrap read.
module github.com/homelab/bootstrap/lab/tools/flux-cli

go 1.26.1

require github.com/fluxcd/flux2/v2 v2.9.5
