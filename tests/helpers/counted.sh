# tests/helpers/counted.sh - for shell tests that count failures and go on
# (sourced):
#
#   . "$(dirname "$0")/helpers/counted.sh"
#
# Sets -u, BUILD (build), fails (0) and tmp (a directory removed at exit).
# fail MSG        "FAIL: MSG", counted; the test goes on
# need FILE...    exit 77 unless each FILE is an executable, naming it
# finish NAME     "NAME: ok" and exit 0, or "NAME: N failure(s)" and exit 1
set -u
BUILD=${BUILD:-build}
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}

need() {
	local f
	for f; do
		[ -x "$f" ] || {
			echo "skipped: $f is not built (make BUILD=$BUILD)"
			exit 77
		}
	done
}

finish() {
	if [ "$fails" = 0 ]; then
		echo "$1: ok"
		exit 0
	fi
	echo "$1: $fails failure(s)"
	exit 1
}
