#!/usr/bin/env bash
# Fails when a tracked file is an executable binary or larger than 1 MB:
# nothing built belongs in git. Files that really need the size are listed
# in ALLOWED below, one path per line, with the reason.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

limit=$((1024 * 1024))
# path  # reason
ALLOWED=$(
	cat <<'LIST'
LIST
)

allowed() { grep -qxF "$1" <<<"$ALLOWED"; }

bad=0
while IFS= read -r -d '' f; do
	[[ -f $f ]] || continue # deleted in the work tree, not yet staged
	allowed "$f" && continue
	size=$(stat -c %s "$f")
	if ((size > limit)); then
		echo "lint-files: $f is $size bytes (over 1 MB): build it, do not commit it (or list it in scripts/lint-files.sh with the reason)" >&2
		bad=1
	fi
	magic=$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')
	case $magic in
	7f454c46 | cafebabe | feedface | feedfacf | cefaedfe | cffaedfe | 4d5a*)
		echo "lint-files: $f is an executable binary ($magic): nothing built belongs in git" >&2
		bad=1
		;;
	esac
done < <(git ls-files -z)
exit $bad
