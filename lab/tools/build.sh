#!/usr/bin/env bash
# Builds the lab's binaries (etcd, etcdutl, kube-apiserver, kube-controller-manager,
# kube-scheduler and the same three of the previous Kubernetes minor, prefixed
# previous-, of the two minors a Kubernetes-first upgrade crosses, prefixed
# 1.30- and 1.31-, and of the newest minor Talos v1.14 runs, prefixed 1.37-; kwok, source-controller, kustomize-controller,
# helm-controller, controller-gen, versitygw (the S3 server of backup.s3), and
# the users' tools the e2e tests run: kubectl, age, age-keygen, sops, helm, flux,
# node_exporter) from the Go
# modules pinned under lab/tools/ into $BOOTSTRAP_LAB_BIN (default: .lab/bin at
# the repository root), and records where the pinned Cilium source is, whose
# real Helm chart the lab's chart repository serves. Builds nothing when the
# binaries are already built for the pinned versions.
#
# --demo builds only what a lab needs to run (make demo): the other
# Kubernetes minors, used only by the upgrade tests, and the CLIs, used only
# by e2e, are left for make test.
# Every module download starts at once, and the binaries build in two chains
# side by side (the Kubernetes control plane; everything else): one go build
# leaves a core idle while it links or waits on the network, and a second
# build fills it (README "Cold start" has the measured parts).
# Usage: build.sh [--demo] [bin dir]   (the argument wins over $BOOTSTRAP_LAB_BIN)
set -euo pipefail

set_name=all
if [[ ${1:-} == --demo ]]; then
	set_name=demo
	shift
fi

tools_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$tools_dir/../.." && pwd)
bin_dir=${1:-${BOOTSTRAP_LAB_BIN:-$repo_root/.lab/bin}}
# Every build below runs from its module's directory: a relative bin
# directory is made absolute against where this script was started, or the
# binaries land under lab/tools/<module>/ and every later lab started from
# elsewhere fails looking for them.
case $bin_dir in
/*) ;;
*) bin_dir=$PWD/$bin_dir ;;
esac
manifest=$bin_dir/manifest.json

export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
export GOFLAGS="-buildvcs=false"
export CGO_ENABLED=0

log() { printf 'lab-bins: %s\n' "$*" >&2; }

# mod_version <module dir> <module path> prints the version the module pins.
mod_version() { (cd "$tools_dir/$1" && go list -m -f '{{.Version}}' "$2"); }
# mod_dir <module dir> <module path> prints where the module's source is, downloading it if needed.
mod_dir() { (cd "$tools_dir/$1" && go mod download -json "$2" >/dev/null && go list -m -f '{{.Dir}}' "$2"); }

k8s_version=$(mod_version kubernetes k8s.io/kubernetes)
# The other Kubernetes builds, which only upgrade rehearsals start: the
# previous minor, and the minors a Kubernetes-first upgrade crosses (the
# last one the pinned Talos cannot run and its minimum: e2e
# TestKubernetesFirstUpgrade), and the newest minor Talos v1.14 runs (1.37:
# e2e TestPipelineAndKubernetesUpgradeOnTalos114). Build <name> is pinned by module dir
# kubernetes-<name>, its servers are prefixed <name>- and the manifest
# names it k8s.io/kubernetes@<name> (lab/kube Binaries.ServerBinary).
k8s_builds=(previous 1.30 1.31 1.37)
declare -A k8s_build_versions=()
for n in "${k8s_builds[@]}"; do
	k8s_build_versions[$n]=$(mod_version "kubernetes-$n" k8s.io/kubernetes)
done
# providerless leaves out the in-tree cloud providers, which Talos never
# selects (talos v1.13.3 internal/app/machined/pkg/controllers/k8s/
# control_plane.go sets --cloud-provider to external or not at all): 1.30's
# GCE provider alone brings 32 MB of generated compute API source. 1.31
# removed them all, so there the tag changes nothing.
declare -A k8s_build_tags=([1.30]=providerless [1.31]=providerless)
etcd_version=$(mod_version etcd go.etcd.io/etcd/server/v3)
kwok_version=$(mod_version kwok sigs.k8s.io/kwok)
source_controller_version=$(mod_version flux github.com/fluxcd/source-controller)
kustomize_controller_version=$(mod_version flux github.com/fluxcd/kustomize-controller)
helm_controller_version=$(mod_version helm-controller github.com/fluxcd/helm-controller)
notification_api_version=$(mod_version notification-controller github.com/fluxcd/notification-controller/api)
cilium_version=$(mod_version cilium github.com/cilium/cilium)
age_version=$(mod_version clients filippo.io/age)
sops_version=$(mod_version clients github.com/getsops/sops/v3)
helm_version=$(mod_version clients helm.sh/helm/v3)
node_exporter_version=$(mod_version node-exporter github.com/prometheus/node_exporter)
flux_cli_version=$(mod_version flux-cli github.com/fluxcd/flux2/v2)
# The Flux distribution whose manifests (manifests/ in its module) the lab
# bundles into a release-like manifests.tar.gz: the one the product uses.
flux2_version=$(cd "$repo_root" && go list -m -f '{{.Version}}' github.com/fluxcd/flux2/v2)
if [[ $flux_cli_version != "$flux2_version" ]]; then
	log "lab/tools/flux-cli pins flux2 $flux_cli_version but the product installs $flux2_version: pin the same version in both go.mod files"
	exit 1
fi

# k8s_ldflags <version>: without these the servers report
# "v0.0.0-master+$Format:%H$", which clients cannot parse.
k8s_ldflags() {
	local minor=${1#v1.}
	minor=${minor%%.*}
	echo "-X k8s.io/component-base/version.gitVersion=$1 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
}
k8s_ldflags=$(k8s_ldflags "$k8s_version")

# A binary's fingerprint covers everything that decides how it is built:
# the Go toolchain, its ldflags and the go.mod/go.sum of the module dir that
# pins it. A new pin in one module dir rebuilds only that dir's binaries.
# fingerprint <module dir> [ldflags]
fingerprint() {
	{
		go version
		echo "${2:-}"
		cat "$tools_dir/$1/go.mod" "$tools_dir/$1/go.sum"
	} | sha256sum | cut -d' ' -f1
}

# binary name → "module dir|package|ldflags[|build tags[|gcflags]]"
declare -A specs=(
	[etcd]="etcd|go.etcd.io/etcd/server/v3|"
	[etcdutl]="etcd|go.etcd.io/etcd/etcdutl/v3|"
	[kube-apiserver]="kubernetes|k8s.io/kubernetes/cmd/kube-apiserver|$k8s_ldflags"
	[kube-controller-manager]="kubernetes|k8s.io/kubernetes/cmd/kube-controller-manager|$k8s_ldflags"
	[kube-scheduler]="kubernetes|k8s.io/kubernetes/cmd/kube-scheduler|$k8s_ldflags"
	[kwok]="kwok|sigs.k8s.io/kwok/cmd/kwok|"
	[versitygw]="s3|github.com/versity/versitygw/cmd/versitygw|"
	[source-controller]="flux|github.com/fluxcd/source-controller|"
	[kustomize-controller]="flux|github.com/fluxcd/kustomize-controller|"
	[helm-controller]="helm-controller|github.com/fluxcd/helm-controller|"
	[controller-gen]="notification-controller|sigs.k8s.io/controller-tools/cmd/controller-gen|"
	[kubectl]="kubectl|k8s.io/kubernetes/cmd/kubectl|$k8s_ldflags"
	[age]="clients|filippo.io/age/cmd/age|"
	[age-keygen]="clients|filippo.io/age/cmd/age-keygen|"
	[sops]="clients|github.com/getsops/sops/v3/cmd/sops|"
	[helm]="clients|helm.sh/helm/v3/cmd/helm|"
	[node_exporter]="node-exporter|github.com/prometheus/node_exporter|-X github.com/prometheus/common/version.Version=${node_exporter_version#v}"
	[flux]="flux-cli|github.com/fluxcd/flux2/v2/cmd/flux|-X main.VERSION=${flux_cli_version#v}"
)
for n in "${k8s_builds[@]}"; do
	for server in kube-apiserver kube-controller-manager kube-scheduler; do
		specs[$n-$server]="kubernetes-$n|k8s.io/kubernetes/cmd/$server|$(k8s_ldflags "${k8s_build_versions[$n]}")|${k8s_build_tags[$n]:-}"
	done
done
# What a test runs for a moment (a command line tool, a server one test
# starts) is compiled without optimizations or inlining: it compiles about
# a quarter faster (1.31's kube-apiserver from an empty build cache on 2
# cores: 107 s against 141 s) and runs slower, which none of these tests
# waits on. Whatever the lab runs in every test (the pinned control plane,
# etcd, kwok, the Flux controllers) and whatever shares compiled packages
# with it (kubectl with the pinned servers, the previous minor's
# third-party packages with theirs) keeps the optimized build.
no_opt="-N -l"
for b in 1.30-kube-apiserver 1.30-kube-controller-manager 1.30-kube-scheduler \
	1.31-kube-apiserver 1.31-kube-controller-manager 1.31-kube-scheduler \
	1.37-kube-apiserver 1.37-kube-controller-manager 1.37-kube-scheduler \
	sops helm node_exporter flux versitygw controller-gen; do
	IFS='|' read -r mod pkg ldflags tags _ <<<"${specs[$b]}"
	specs[$b]="$mod|$pkg|$ldflags|$tags|$no_opt"
done
# The two build chains. The control plane's three commands share most of
# their packages, so after kube-apiserver the other two mostly link.
# controller-gen generates the notification-controller CRDs (below).
chain_kubernetes=(kube-apiserver kube-controller-manager kube-scheduler)
chain_rest=(etcd etcdutl kwok source-controller kustomize-controller helm-controller controller-gen versitygw)
tool_mods=(kubernetes etcd kwok flux helm-controller notification-controller cilium s3)
if [[ $set_name == all ]]; then
	# The users' own tools, which the e2e tests read the artifacts with
	# (e2e TestRealClients); a lab runs without them.
	chain_kubernetes+=(kubectl)
	chain_rest+=(age age-keygen sops helm node_exporter flux)
	tool_mods+=(clients kubectl node-exporter flux-cli)
fi
versions="kubernetes $k8s_version"
if [[ $set_name == all ]]; then
	for n in "${k8s_builds[@]}"; do
		tool_mods+=("kubernetes-$n")
		versions+=", ${k8s_build_versions[$n]}"
	done
	# 1.30 and 1.31 share few compiled packages with the other builds or
	# each other (6 min of builds on 2 cores): one goes at the end of each
	# chain, to keep the two about as long (measured: no change in the
	# cold total beyond noise against both at the end of one).
	chain_kubernetes+=(previous-kube-apiserver previous-kube-controller-manager previous-kube-scheduler)
	chain_kubernetes+=(1.30-kube-apiserver 1.30-kube-controller-manager 1.30-kube-scheduler)
	chain_rest+=(1.31-kube-apiserver 1.31-kube-controller-manager 1.31-kube-scheduler)
	chain_kubernetes+=(1.37-kube-apiserver 1.37-kube-controller-manager 1.37-kube-scheduler)
fi
binaries=("${chain_kubernetes[@]}" "${chain_rest[@]}")

# built <name> reports whether the binary is built for its fingerprint.
built() {
	local spec=${specs[$1]} stamp="$bin_dir/.$1.fingerprint"
	IFS='|' read -r mod _ ldflags tags gcflags <<<"$spec"
	[[ -x $bin_dir/$1 && -f $stamp && $(<"$stamp") == "$(fingerprint "$mod" "$(build_flags "$ldflags" "$tags" "$gcflags")")" ]]
}

# build_flags <ldflags> <tags> <gcflags>: what a fingerprint covers of a
# binary's flags (a binary without tags or gcflags keeps the fingerprint
# it had before either was a field).
build_flags() { echo "$1${2:+ tags=$2}${3:+ gcflags=$3}"; }

up_to_date() {
	[[ -f $manifest ]] || return 1
	for b in "${binaries[@]}"; do
		built "$b" || return 1
	done
}

mkdir -p "$bin_dir"
exec 9>"$bin_dir/.build.lock"
flock 9

if up_to_date; then
	log "up to date in $bin_dir ($set_name: $versions, etcd $etcd_version, kwok $kwok_version, flux controllers $source_controller_version/$kustomize_controller_version/$helm_controller_version)"
	fresh=1
else
	fresh=0
	rm -f "$manifest"
fi

# build <name>: builds one binary unless it is built for its fingerprint
# (stamped beside it), so an interrupted build resumes where it stopped.
build() {
	local start=$SECONDS stamp="$bin_dir/.$1.fingerprint" mod pkg ldflags tags gcflags
	IFS='|' read -r mod pkg ldflags tags gcflags <<<"${specs[$1]}"
	if built "$1"; then
		log "$1 already built"
		return
	fi
	log "building $1 ($pkg)"
	if [[ $1 == flux ]]; then
		build_flux_cli "$ldflags" "$gcflags"
	else
		# versitygw's only cgo is RDMA transport the lab does not use:
		# static, it is 58 instead of 80 MB and half the memory.
		local cgo=${CGO_ENABLED:-1}
		[[ $1 == versitygw ]] && cgo=0
		(cd "$tools_dir/$mod" && CGO_ENABLED=$cgo go build -trimpath -tags "$tags" ${gcflags:+-gcflags "all=$gcflags"} -ldflags "-s -w $ldflags" -o "$bin_dir/.$1.tmp" "$pkg")
	fi
	mv -f "$bin_dir/.$1.tmp" "$bin_dir/$1"
	fingerprint "$mod" "$(build_flags "$ldflags" "$tags" "$gcflags")" >"$stamp"
	log "built $1 in $((SECONDS - start))s"
}

# build_flux_cli <ldflags> <gcflags>: cmd/flux embeds manifests/*.yaml, which Flux's
# release generates with kustomize from remote bases (manifests/scripts/
# bundle.sh) and the module does not carry, so go build of the module
# fails. It is built from a copy of the module (its own main module, so its
# go.mod's replace applies) with one placeholder there: only flux install
# and bootstrap read them, and the tests do neither (docs/lab.md).
build_flux_cli() {
	local src work
	src=$(mod_dir flux-cli github.com/fluxcd/flux2/v2)
	work=$(mktemp -d)
	cp -r "$src" "$work/flux2"
	chmod -R u+w "$work/flux2"
	mkdir -p "$work/flux2/cmd/flux/manifests"
	printf '# placeholder: the lab builds flux without its generated install manifests\n' >"$work/flux2/cmd/flux/manifests/placeholder.yaml"
	local status=0
	(cd "$work/flux2" && go build -trimpath ${2:+-gcflags "all=$2"} -ldflags "-s -w $1" -o "$bin_dir/.flux.tmp" ./cmd/flux) || status=$?
	rm -rf "$work"
	return "$status"
}

# chain <name>...: builds the binaries one after the other.
chain() {
	local b
	for b in "$@"; do
		build "$b"
	done
}

total_start=$SECONDS
if [[ $fresh == 0 ]]; then
	# Every module the builds need, fetched at once: go build would fetch
	# them one package graph at a time, waiting on the network in between.
	for mod in "${tool_mods[@]}"; do
		(cd "$tools_dir/$mod" && go mod download) &
	done
	(cd "$repo_root" && go mod download) &
	wait
	log "modules downloaded in $((SECONDS - total_start))s"
	chain "${chain_kubernetes[@]}" &
	kubernetes_pid=$!
	chain "${chain_rest[@]}" &
	rest_pid=$!
	status=0
	wait "$kubernetes_pid" || status=$?
	wait "$rest_pid" || status=$?
	if [[ $status != 0 ]]; then
		log "a build failed (above); what was built is kept and a re-run resumes"
		exit "$status"
	fi
fi

# lab/kube reads the kwok Stage files and the Flux CRDs and config from these
# module directories at lab start.
kwok_dir=$(mod_dir kwok sigs.k8s.io/kwok)
source_controller_dir=$(mod_dir flux github.com/fluxcd/source-controller)
kustomize_controller_dir=$(mod_dir flux github.com/fluxcd/kustomize-controller)
helm_controller_dir=$(mod_dir helm-controller github.com/fluxcd/helm-controller)
# notification-controller's own module is not on the module proxy: its CRDs
# are generated from its API module by the controller-gen its Makefile pins
# (CONTROLLER_GEN_VERSION, crd:crdVersions=v1), as its release does. The
# API module is copied first: controller-gen loads it as a main module.
notification_dir=$bin_dir/notification-controller
notification_api_dir=$(mod_dir notification-controller github.com/fluxcd/notification-controller/api)
if [[ ! -f $notification_dir/.fingerprint || $(<"$notification_dir/.fingerprint") != "$(fingerprint notification-controller)" ]]; then
	log "generating the notification-controller $notification_api_version CRDs"
	work=$(mktemp -d)
	cp -r "$notification_api_dir" "$work/api"
	chmod -R u+w "$work/api"
	rm -rf "$notification_dir.tmp"
	mkdir -p "$notification_dir.tmp/config/crd/bases"
	(cd "$work/api" && "$bin_dir/controller-gen" crd:crdVersions=v1 paths=./... output:crd:artifacts:config="$notification_dir.tmp/config/crd/bases")
	rm -rf "$work"
	# The resource list of the controller's config/crd/kustomization.yaml.
	printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- bases/notification.toolkit.fluxcd.io_providers.yaml\n- bases/notification.toolkit.fluxcd.io_alerts.yaml\n- bases/notification.toolkit.fluxcd.io_receivers.yaml\n' >"$notification_dir.tmp/config/crd/kustomization.yaml"
	fingerprint notification-controller >"$notification_dir.tmp/.fingerprint"
	rm -rf "$notification_dir"
	mv "$notification_dir.tmp" "$notification_dir"
fi
# The Cilium source is only read (its chart); the manifest is rewritten on
# every run so a new pin here needs no rebuild of the binaries.
cilium_dir=$(mod_dir cilium github.com/cilium/cilium)
flux2_dir=$(cd "$repo_root" && go mod download -json github.com/fluxcd/flux2/v2 >/dev/null && go list -m -f '{{.Dir}}' github.com/fluxcd/flux2/v2)

cat >"$manifest.tmp" <<EOF
{
  "modules": {
    "k8s.io/kubernetes": {"version": "$k8s_version"},
$(for n in "${k8s_builds[@]}"; do printf '    "k8s.io/kubernetes@%s": {"version": "%s"},\n' "$n" "${k8s_build_versions[$n]}"; done)
    "go.etcd.io/etcd/server/v3": {"version": "$etcd_version"},
    "sigs.k8s.io/kwok": {"version": "$kwok_version", "dir": "$kwok_dir"},
    "github.com/fluxcd/source-controller": {"version": "$source_controller_version", "dir": "$source_controller_dir"},
    "github.com/fluxcd/kustomize-controller": {"version": "$kustomize_controller_version", "dir": "$kustomize_controller_dir"},
    "github.com/fluxcd/helm-controller": {"version": "$helm_controller_version", "dir": "$helm_controller_dir"},
    "github.com/fluxcd/notification-controller": {"version": "$notification_api_version", "dir": "$notification_dir"},
    "github.com/fluxcd/flux2/v2": {"version": "$flux2_version", "dir": "$flux2_dir"},
    "github.com/cilium/cilium": {"version": "$cilium_version", "dir": "$cilium_dir"},
    "k8s.io/kubernetes/cmd/kubectl": {"version": "$k8s_version"},
    "filippo.io/age": {"version": "$age_version"},
    "github.com/getsops/sops/v3": {"version": "$sops_version"},
    "helm.sh/helm/v3": {"version": "$helm_version"},
    "github.com/prometheus/node_exporter": {"version": "$node_exporter_version"},
    "github.com/fluxcd/flux2/v2/cmd/flux": {"version": "$flux_cli_version"}
  }
}
EOF
mv -f "$manifest.tmp" "$manifest"
if [[ $fresh == 0 ]]; then
	log "all built in $((SECONDS - total_start))s into $bin_dir (cilium chart $cilium_version from $cilium_dir)"
fi
