#!/bin/bash
# run-tests.sh - run every test binary with a timeout.
#
# Runs $BUILD/tests/test_* and tests/t_*.sh, each under `timeout`
# (KVP_TEST_TIMEOUT seconds, default 600).  Exit 0 is passed, 77 skipped
# (the test's last line of output says why), anything else failed, and the
# log of a failed test is printed.  Ends with "N passed, N failed, N skipped"
# and exits non-zero if any test failed.  Arguments, if given, are name
# filters (substrings).
set -u
BUILD=${BUILD:-build}
TIMEOUT=${KVP_TEST_TIMEOUT:-600}
export BUILD
logdir="$BUILD/test-logs"
mkdir -p "$logdir"

tests=()
for t in "$BUILD"/tests/test_* tests/t_*.sh; do
	[ -f "$t" ] && [ -x "$t" ] || continue
	case "$t" in *.o|*.d) continue ;; esac
	if [ $# -gt 0 ]; then
		keep=0
		for f in "$@"; do case "$t" in *"$f"*) keep=1 ;; esac; done
		[ $keep = 1 ] || continue
	fi
	tests+=("$t")
done

passed=0 failed=0 skipped=0
failed_names=()
for t in "${tests[@]}"; do
	name=$(basename "$t")
	log="$logdir/$name.log"
	start=$(date +%s.%N)
	timeout -k 10 "$TIMEOUT" "$t" >"$log" 2>&1
	rc=$?
	secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
	case $rc in
	0)
		passed=$((passed + 1))
		printf 'PASS  %-28s %6ss\n' "$name" "$secs"
		;;
	77)
		skipped=$((skipped + 1))
		reason=$(grep -v '^[[:space:]]*$' "$log" | tail -n 1)
		printf 'SKIP  %-28s %s\n' "$name" "${reason:-no reason given}"
		;;
	*)
		failed=$((failed + 1))
		failed_names+=("$name")
		if [ $rc = 124 ] || [ $rc = 137 ]; then
			printf 'FAIL  %-28s timed out after %ss\n' "$name" "$TIMEOUT"
		else
			printf 'FAIL  %-28s exit %d\n' "$name" "$rc"
		fi
		sed 's/^/    | /' "$log" | tail -n 60
		;;
	esac
done

echo
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ $failed = 0 ] && [ $((passed + skipped)) -gt 0 ]
