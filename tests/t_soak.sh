#!/bin/bash
# t_soak.sh - tools/kvpsoak, short: one round of --churn (writers, a
# dropper and a thread mlocking and mprotecting single pages, over a
# copy-mode and a move-mode region of 64 KiB blocks: every word checked
# against a shadow) and a few rounds of the default check-and-rewrite run.
#
# Races, so a regression shows as a failure most runs, not every run:
# before 861eb5c and 3f88806, --churn found bad pages in its first or
# second round.  Not its 2 MiB rounds, which take longer, and where the
# zap walk's known misses show (the README).
# Needs $BUILD/bin/kvpsoak (run by tests/run-tests.sh).
set -u
BUILD=${BUILD:-build}
soak="$BUILD/bin/kvpsoak"

if [ ! -x "$soak" ] || [ ! -x "$BUILD/bin/kvp-probe" ]; then
	echo "t_soak: $soak or kvp-probe not built (run make BUILD=$BUILD first)"
	exit 77
fi
# an operand is refused before any round (before, `--churn x` ran the
# churn rounds for the default 300 seconds, x ignored): exit 2, why
out=$(timeout 20 "$soak" --churn x --seconds 1 2>&1)
rc=$?
if [ $rc != 2 ] || ! echo "$out" | grep -q "^kvpsoak: unexpected argument 'x'"; then
	echo "t_soak: kvpsoak --churn x: exit $rc, want 2: $out"
	echo "t_soak: 1 failed"
	exit 1
fi
if ! "$BUILD/bin/kvp-probe" 2>&1 | grep -q '^kvp-probe: the pager can run here'; then
	echo "t_soak: the pager cannot run here (kvp-probe says why)"
	exit 77
fi
fails=0
for args in "--churn --seconds 4" "--seconds 5 --service-threads 2"; do
	out=$("$soak" $args 2>&1)
	rc=$?
	echo "kvpsoak $args: exit $rc"
	echo "$out" | tail -20
	[ $rc = 0 ] || fails=$((fails + 1))
done
[ $fails = 0 ] && echo "t_soak: ok" || echo "t_soak: $fails failed"
exit $((fails > 0))
