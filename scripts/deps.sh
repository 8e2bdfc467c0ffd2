#!/usr/bin/env bash
# Checks for the system packages the tests and the demo need, and installs
# the missing ones with apt when it can (root on Debian/Ubuntu). Otherwise it
# stops at once and prints the exact command to run. Go itself is expected
# on PATH (README: Go 1.26).
#   git              the snapshot server and Flux tests use the real git CLI
#   openssh-client   the lab's SSH git server is tested with the real ssh client
#   nfs-ganesha, nfs-ganesha-vfs, rpcbind
#                    the real NFS server the NFS export probe is tested against
#   chromium, fonts-dejavu-core
#                    the postcheck's history page is rendered in a real
#                    browser (headless) and its screenshot checked
set -euo pipefail

packages=(git openssh-client nfs-ganesha nfs-ganesha-vfs rpcbind chromium fonts-dejavu-core)

installed() {
	if command -v dpkg-query >/dev/null; then
		dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
		return
	fi
	# Without dpkg, look for what each package provides.
	case $1 in
	git) command -v git >/dev/null ;;
	openssh-client) command -v ssh >/dev/null && command -v ssh-keygen >/dev/null ;;
	nfs-ganesha) command -v ganesha.nfsd >/dev/null ;;
	nfs-ganesha-vfs) compgen -G '/usr/lib*/**/ganesha/libfsalvfs.so' >/dev/null || compgen -G '/usr/lib*/ganesha/libfsalvfs.so' >/dev/null ;;
	rpcbind) command -v rpcbind >/dev/null || [[ -x /usr/sbin/rpcbind || -x /sbin/rpcbind ]] ;;
	chromium) command -v chromium >/dev/null ;;
	fonts-dejavu-core) compgen -G '/usr/share/fonts/**/DejaVuSans.ttf' >/dev/null || compgen -G '/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf' >/dev/null ;;
	esac
}

missing=()
for p in "${packages[@]}"; do
	installed "$p" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
	exit 0
fi

cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
	echo "deps: installing ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	$cmd -qq >/dev/null
	exit 0
fi
{
	echo "deps: missing system packages: ${missing[*]}"
	if command -v apt-get >/dev/null; then
		echo "deps: install them with:"
		echo "  sudo apt-get update && sudo $cmd"
	else
		echo "deps: this is not a Debian/Ubuntu system; install the equivalents of: ${missing[*]}"
	fi
} >&2
exit 1
