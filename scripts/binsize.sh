#!/usr/bin/env bash
# binsize.sh: what each Go module costs in the bootstrap binary.
#
# Builds the release binary twice: stripped (the size users download) and
# with symbols, whose `go tool nm -size` lists every symbol's bytes. Each
# symbol is charged to the package it belongs to, each package to its
# module (from `go list -deps`).
# Symbols of no package (linker-made tables) count as "(no package)"; the
# line tables (pclntab) are not symbols and are left out of the shares.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n ${BINSIZE_DIR:-} ]]; then
	out=$BINSIZE_DIR
else
	out=$(mktemp -d)
	trap 'rm -rf "$out"' EXIT
fi
top=${1:-25}
# The Makefile's build tags, the one place they are set.
tags=${TAGS:-$(sed -n 's/^TAGS := //p' Makefile)}
go build -tags "$tags" -trimpath -ldflags="-s -w" -o "$out/bootstrap" ./cmd/bootstrap
go build -tags "$tags" -trimpath -o "$out/bootstrap.syms" ./cmd/bootstrap
go list -tags "$tags" -deps -f '{{.ImportPath}} {{with .Module}}{{.Path}}{{else}}std{{end}}' ./cmd/bootstrap >"$out/pkgs"
# Code and read-only data, each symbol once (the "local." aliases repeat
# them); data and bss are left out (nm does not tell bss from data apart).
go tool nm -size "$out/bootstrap.syms" | awk '$3 ~ /^[TtRr]$/ && $4 !~ /^local\./' >"$out/nm"
stripped=$(stat -c %s "$out/bootstrap")
awk -v b="$stripped" 'BEGIN { printf "bootstrap (stripped): %.1f MiB\n", b / 1048576 }'
# The ELF sections, largest first: .gopclntab (line tables) and, if Go
# plugin support is linked, .dynsym/.dynstr stand out here.
readelf -S -W "$out/bootstrap" | sed -n 's/^ *\[ *[0-9]*\] //p' | while read -r name type _ _ size _; do
	[[ $name == .* && $type != NOBITS ]] && echo "$name $((16#$size))"
done | sort -k2 -rn | head -6 | awk '{ printf "  %-14s %7.1f MiB\n", $1, $2 / 1048576 }'
echo
awk -v top="$top" '
FNR == NR { mod[$1] = $2; next }
{
	size = $2; name = $4
	sub(/^(type:|go:itab\.|go:)/, "", name); sub(/^\*/, "", name)
	# The package is the name up to the first dot after its last slash.
	slash = 0
	for (i = 1; i <= length(name); i++) if (substr(name, i, 1) == "/") slash = i
	rest = substr(name, slash + 1); dot = index(rest, ".")
	pkg = dot ? substr(name, 1, slash + dot - 1) : ""
	m = "(no package)"
	while (pkg != "") {
		if (pkg in mod) { m = mod[pkg]; break }
		if (sub(/\/[^\/]*$/, "", pkg) == 0) break
	}
	bytes[m] += size; total += size
}
END {
	for (m in bytes) printf "%10.2f MiB  %5.1f%%  %s\n", bytes[m] / 1048576, 100 * bytes[m] / total, m | "sort -rn | head -" top
}' "$out/pkgs" "$out/nm"
