# tests/helpers/tap.sh - what the TAP-style shell tests share (sourced).
#
#   . "$(dirname "$0")/helpers/tap.sh"
#
# skip MSG           the last line "skipped: MSG", exit 77
# fail MSG           "FAIL: MSG", exit 1 (the test's cleanup trap runs)
# ok MSG             "ok N - MSG"
# expect RC PATTERN CMD...
#                    CMD exits RC and its output (stdout and stderr)
#                    matches the extended regular expression PATTERN
skip() {
	echo "skipped: $*"
	exit 77
}

fail() {
	echo "FAIL: $*"
	exit 1
}

tap_n=0
ok() {
	tap_n=$((tap_n + 1))
	echo "ok $tap_n - $*"
}

expect() {
	local rc=$1 pat=$2 out got
	shift 2
	out=$("$@" 2>&1)
	got=$?
	[ "$got" = "$rc" ] || fail "$* exited $got, not $rc: $out"
	echo "$out" | grep -q -E -- "$pat" || fail "$* printed '$out', not /$pat/"
	ok "$*"
}
