// Pins the Cilium source whose Helm chart (install/kubernetes/cilium) the
// lab's chart repository serves: the real chart, not a stand-in. Nothing is
// built from it.
module github.com/homelab/bootstrap/lab/tools/cilium

go 1.26.1

require github.com/cilium/cilium v1.20.2
