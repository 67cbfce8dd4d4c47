#!/bin/bash
# t_tier.sh - `kvpbench tier`: one short run with its own redis-server and
# 3-master cluster gives a JSON line per block size with every tier's
# rate and the model's recompute rate (the rates are not judged: speed
# belongs to benchmarks), every
# value it fetched was right (exit 0), bad options are refused with exit
# 2, and a run killed with SIGKILL takes its servers with it.
#
# Needs $BUILD/bin/kvpbench and redis-server (the build installs it).
. "$(dirname "$0")/helpers/counted.sh"
B="$BUILD/bin/kvpbench"
need "$B"
command -v redis-server >/dev/null ||
	{ echo "t_tier: redis-server not found (apt-get install redis-server)"; exit 77; }

"$B" tier --sizes 16K,64K --repeat 1 --batch 16 --json --dir "$tmp" \
	--model random:tiny --recompute-tokens 64 >"$tmp/json" 2>"$tmp/err"
rc=$?
cat "$tmp/json" "$tmp/err"
[ $rc = 0 ] || fail "kvpbench tier exit $rc"
/usr/bin/python3 - "$tmp/json" <<'PY' || fail "tier lines do not keep their promises"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
sizes = sorted(r["block_bytes"] for r in rows if r.get("scenario") == "tier")
assert sizes == [16384, 65536], sizes
for r in rows:
    for f in ("ram_gb_per_s", "cache_dir_gb_per_s", "redis_gb_per_s", "redis_cluster_gb_per_s",
              "redis_benchmark_get_p_gb_per_s",
              "redis_benchmark_get_c50_gb_per_s", "redis_vs_benchmark",
              "recompute_gb_per_s", "redis_vs_recompute"):
        assert r[f] > 0, (f, r)
PY

for bad in "--sizes 0" "--sizes 12" "--batch 0" "--repeat 99" "--nosuch" "extra" \
	"--recompute-tokens 0"; do
	# shellcheck disable=SC2086
	"$B" tier $bad >"$tmp/bad" 2>&1
	rc=$?
	[ $rc = 2 ] || fail "kvpbench tier $bad: exit $rc, want 2"
	grep -q . "$tmp/bad" || fail "kvpbench tier $bad: no message"
done

# SIGKILL mid-run: its servers die with it (PR_SET_PDEATHSIG).
# Its servers' folders go in $tmp, which the trap removes.
TMPDIR="$tmp" "$B" tier --sizes 1M --repeat 15 >/dev/null 2>&1 &
pid=$!
for _ in $(seq 100); do
	[ "$(pgrep -P $pid -c redis-server)" -ge 4 ] && break
	sleep 0.1
done
kids=$(pgrep -P $pid redis-server | tr '\n' ' ')
[ -n "$kids" ] || fail "no redis-server children seen"
kill -9 $pid
wait $pid 2>/dev/null
# gone, or a zombie waiting for its new parent to reap it
alive() {
	local st
	st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
	case "$st" in Z*) return 1 ;; esac
}
for k in $kids; do
	for _ in $(seq 50); do alive "$k" || break; sleep 0.1; done
	alive "$k" && fail "redis-server $k outlived kvpbench"
done

finish t_tier
