#!/bin/bash
# t_kvpager.sh - the main job, `kvpager run`, as a user meets it.
#
# Covered: what the messages of bad values say (t_edge_values.sh runs
# every option over the edge values), the low-rank rank limit and
# --rank reaching the run, KVP_<KV TUNABLE> variables applied at start and
# an option winning over its variable, the warning of a budget under what
# layer-ahead prefetch holds, the prefetch counters adding up, progress
# lines when stderr is not a terminal, the KV tunables changed on a
# running decode (tunable file, apply, kvpctl set) and the ones that cannot
# change, and SIGINT / SIGTERM on a run with its view mounted: the report
# of the steps done, the view unmounted and the registry entry removed.
set -u
BUILD=${BUILD:-build}
K=$BUILD/bin/kvpager

. "$(dirname "$0")/helpers/tap.sh"
[ -x "$K" ] || skip "$K is not built (make BUILD=$BUILD)"

tmp=$(mktemp -d /tmp/kvp-run-XXXXXX)
export KVP_RUNTIME_DIR=$tmp/reg
export TMPDIR=$tmp
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
	wait 2>/dev/null
	fusermount3 -u -z "$tmp/m" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT

# json FIELD TEXT: the value of "FIELD": in one JSON line
json() {
	echo "$2" | sed -n "s/.*\"$1\":\"\{0,1\}\([^,\"}]*\).*/\1/p"
}

# A short run that can start here at all (userfaultfd, a backing file).
out=$("$K" run --preset tiny --context 256 --steps 2 --quiet 2>&1) ||
	{
		echo "$out" | grep -q -i -E 'userfaultfd|permission' &&
			skip "the pager cannot start here: $out"
		fail "a plain tiny run failed: $out"
	}
ok "a plain tiny run"

# Edge values: t_edge_values.sh runs every numeric option over the common
# table; here the messages say what is accepted, and a value is not cut to
# 32 bits (before, --steps 4294967297 ran one step).
expect 2 "^kvpager: --steps: '4294967297' is out of range; accepted: 1\.\.4294967295" \
	"$K" run --preset tiny --context 256 --steps 4294967297
expect 2 "^kvpager: --batch: '4294967298' is out of range; accepted: 1\.\.65536" \
	"$K" run --preset tiny --context 256 --batch 4294967298
expect 2 "^kvpager: --depth: '17' is out of range; accepted: 0\.\.16" \
	"$K" run --preset tiny --context 256 --depth 17
expect 2 "^kvpager: --predictor: '1' is not one of the choices; accepted: exact window lowrank" \
	"$K" run --preset tiny --context 256 --predictor 1
expect 2 "^kvpager: --warmup 4 leaves no step to measure" "$K" run \
	--preset tiny --context 256 --steps 4 --warmup 4
expect 2 "^kvpager: --depth 2: preset tiny has 2 layers" "$K" run \
	--preset tiny --context 256 --steps 2 --depth 2
expect 2 "^kvpager: KVP_RAM_BUDGET_BYTES=16383P: '16383P' is out of range; accepted: 2M\.\.1P \(fix or unset" \
	env KVP_RAM_BUDGET_BYTES=16383P "$K" run --preset tiny --context 256
# an option wins over a bad variable only by being valid itself: the
# variable is still named, not blamed for the option's value
out=$("$K" run --preset tiny --context 256 --budget 16383P 2>&1)
echo "$out" | grep -q KVP_ && fail "--budget 16383P blamed a variable: $out"
ok "--budget 16383P names the option, no variable"

# A misspelt KVP_ variable is named with the one meant (before, it was
# ignored without a word: the budget stayed the default), the run goes on.
out=$(KVP_RAM_BUDGET_BYTE=512M "$K" run --preset tiny --context 256 \
	--steps 2 --quiet 2>&1 >/dev/null) || fail "KVP_RAM_BUDGET_BYTE: exit $?"
echo "$out" | grep -q "^kvpager: warning: KVP_RAM_BUDGET_BYTE is not a variable kvpager reads: ignored (did you mean KVP_RAM_BUDGET_BYTES?)" ||
	fail "KVP_RAM_BUDGET_BYTE=512M: not named: $out"
ok "a misspelt KVP_ variable is named with the nearest"
# and none that something reads is: every name the sources read (empty:
# unset to them), a tunable's with a valid value
src=$(dirname "$0")/..
read_vars=$( (grep -rhoE '"KVP_[A-Z0-9_]+"' "$src/lib" "$src/tools" --include=*.c;
	grep -rhoE 'getenv\("KVP_[A-Z0-9_]+"' "$src/tests" --include=*.c;
	grep -rhoE '\$\{?KVP_[A-Z0-9_]+' "$src/tests" --include=*.sh) |
	grep -oE 'KVP_[A-Z0-9_]+' | sort -u)
[ "$(echo "$read_vars" | wc -l)" -gt 20 ] || fail "too few names found: $read_vars"
vars=(KVP_RAM_BUDGET_BYTES=64M)
for v in $read_vars; do
	lc=${v#KVP_}
	grep -q "X(${lc,,}," "$src/pager/config.h" "$src/lib/kv/kv_tunables.h" ||
		vars+=("$v=")
done
out=$(env "${vars[@]}" "$K" run --preset tiny --context 256 --steps 2 \
	--quiet 2>&1 >/dev/null) || fail "the variables read: exit $?: $out"
echo "$out" | grep "is not a variable" && fail "a variable read is called unknown"
ok "no variable that kvpager reads is called unknown"

# The low-rank rank limit (the default cut to it quietly, a rank asked
# for refused), and --rank reaching the run.
out=$("$K" run --preset tiny --context 256 --steps 3 --predictor lowrank \
	--json --quiet) || fail "lowrank at the default rank: $out"
[ "$(json lowrank_rank "$out")" = 32 ] ||
	fail "the default rank not cut to tiny's 32: $out"
expect 2 "rank 128 is over this shape's limit of 32 .*: set --rank to 4\.\.32" \
	"$K" run --preset tiny --context 256 --predictor lowrank --rank 128
expect 2 "rank 64 is over this shape's limit of 32 .*of model random:tiny" \
	"$K" run --model random:tiny --context 64 --predictor lowrank --rank 64
expect 2 "rank 64 is over this shape's limit of 32 .*: set KVP_LOWRANK_RANK to 4\.\.32" \
	env KVP_LOWRANK_RANK=64 "$K" run --preset tiny --context 256 \
	--predictor lowrank
out=$("$K" run --preset tiny --context 1K --steps 3 --predictor lowrank \
	--rank 16 --json --quiet) || fail "lowrank --rank 16: $out"
[ "$(json lowrank_rank "$out")" = 16 ] || fail "--rank 16 ran as: $out"
[ "$(json predictor "$out")" = lowrank ] || fail "not lowrank: $out"
ok "--rank 16 reaches the run"

# KVP_<KV TUNABLE> variables apply at start; an option wins.
out=$(KVP_PREDICTOR=window KVP_PREDICT_BUDGET_TOKENS=64 "$K" run \
	--preset tiny --context 1K --steps 3 --json --quiet) ||
	fail "KVP_PREDICTOR=window: $out"
[ "$(json predictor "$out")" = window ] || fail "KVP_PREDICTOR=window ignored: $out"
[ "$(json predict_budget_tokens "$out")" = 64 ] ||
	fail "KVP_PREDICT_BUDGET_TOKENS=64 ignored: $out"
ok "KVP_PREDICTOR=window and KVP_PREDICT_BUDGET_TOKENS=64 used"
out=$(KVP_PREDICTOR=window "$K" run --preset tiny --context 1K --steps 3 \
	--predictor exact --json --quiet 2>/dev/null) || fail "--predictor exact: $out"
[ "$(json predictor "$out")" = exact ] || fail "the variable beat the option: $out"
ok "--predictor exact wins over KVP_PREDICTOR=window"
out=$(KVP_PREFETCH_DEPTH_LAYERS=0 "$K" run --preset tiny --context 1K \
	--steps 3 --json --quiet 2>/dev/null) || fail "KVP_PREFETCH_DEPTH_LAYERS=0: $out"
[ "$(json prefetch_depth_layers "$out")" = 0 ] &&
	[ "$(json prefetch_asked "$out")" = 0 ] ||
	fail "KVP_PREFETCH_DEPTH_LAYERS=0 still prefetched: $out"
ok "KVP_PREFETCH_DEPTH_LAYERS=0 turns prefetch off"

# A budget under the layers prefetch holds at once: a warning with the
# budget that would do; none when the budget holds them.
expect 0 "warning: the RAM budget of 2.00 MiB is under the 2 layers.*--budget 5M or more" \
	"$K" run --preset tiny --context 8K --steps 2 --quiet
out=$("$K" run --preset tiny --context 8K --steps 2 --budget 5M --quiet 2>&1 >/dev/null)
[ -z "$out" ] || fail "warned with a budget that holds the layers: $out"
ok "no warning at --budget 5M"

# --ram counts all the cache's RAM from the decode on: the RAM line's
# total is what was asked; too little for the metadata is refused with
# the parts named.
out=$("$K" run --preset tiny --context 4096 --predictor lowrank --rank 16 \
	--steps 4 --ram 3M --quiet 2>&1) || fail "--ram 3M: $out"
echo "$out" | grep -q "RAM  *3.00 MiB in all" ||
	fail "--ram 3M: the RAM line is not 3 MiB in all: $out"
ok "--ram 3M holds the cache in 3 MiB"
# ... to the last step: the low-rank keys grow by a token a step, and the
# fit at the decode's start leaves them what the steps will add (before,
# 64 steps ended 2560 bytes over, a model's 32 steps 2304).
for args in "--preset tiny --context 4096 --steps 64" \
	"--model random:tiny --context 448 --generate 32"; do
	out=$("$K" run $args --predictor lowrank --ram 8M --json --quiet \
		2>&1) || fail "--ram 8M $args: $out"
	total=$(json ram_total_bytes "$out")
	[ -n "$total" ] && [ "$total" -le $((8 << 20)) ] ||
		fail "--ram 8M $args: ram_total_bytes $total is over 8388608"
done
ok "--ram 8M: the total at the last step is within it"
expect 1 "^kvpager: --ram 2.00 MiB leaves no frames: predictor metadata .*smaller --rank" \
	"$K" run --preset tiny --context 4096 --predictor lowrank --rank 16 \
	--steps 4 --ram 2M --quiet
# ... and names the parts as counted (before: staging 2.00 MiB, the
# prefill's area, which the fit gives back, not the 4 KiB counted) and
# the least --ram that runs, which does
err=$("$K" run --preset tiny --context 4096 --predictor lowrank --rank 16 \
	--steps 4 --ram 2M --quiet 2>&1 >/dev/null)
echo "$err" | grep -q "staging 4.00 KiB.*; they and the 2.00 MiB of frames the pager needs take at least [0-9]* bytes" ||
	fail "--ram 2M: the parts or the least --ram not said: $err"
least=$(echo "$err" | sed -n 's/.*take at least \([0-9]*\) bytes.*/\1/p')
"$K" run --preset tiny --context 4096 --predictor lowrank --rank 16 \
	--steps 4 --ram "$least" --quiet >/dev/null 2>&1 ||
	fail "--ram $least, the least said: exit $?"
"$K" run --preset tiny --context 4096 --predictor lowrank --rank 16 \
	--steps 4 --ram $((least - 1)) --quiet >/dev/null 2>&1
[ $? = 1 ] || fail "--ram $((least - 1)), under the least said, ran"
ok "--ram too small: the parts as counted, and the least that runs"

# The prefetch counters add up: asked = resident already + loaded, and
# loaded = hit + late + wasted + open (blocks whose use falls outside the
# measured steps), open no larger than what one step asks.
for args in "--budget 64M" "--predictor lowrank --rank 16" \
	"--predictor lowrank --rank 16 --budget 3M" ""; do
	out=$("$K" run --preset tiny --context 8K --steps 12 --json --quiet \
		$args 2>/dev/null) || fail "run $args: $out"
	asked=$(json prefetch_asked "$out")
	loaded=$(json prefetch_issued "$out")
	sum=$(($(json prefetch_hit "$out") + $(json prefetch_late "$out") + \
		$(json prefetch_wasted "$out") + $(json prefetch_open "$out")))
	open=$(json prefetch_open "$out")
	[ "$loaded" -le "$asked" ] && [ "$sum" = "$loaded" ] &&
		[ "${open#-}" -le $((asked / 10 + 1)) ] ||
		fail "prefetch counters of '$args' do not add up: $out"
	ok "prefetch counters add up ($args: asked $asked, loaded $loaded, open $open)"
done
out=$("$K" run --preset tiny --context 8K --steps 6 --quiet 2>/dev/null)
echo "$out" | grep -q -E "asked [0-9]+ blocks: [0-9]+ resident or loading already, [0-9]+ loaded" ||
	fail "the report does not break the prefetch down: $out"
ok "the report breaks the prefetch down"

# Interrupted runs: with the view mounted, SIGINT or SIGTERM during the
# decode prints the report of the steps done, unmounts the view and
# removes the registry entry.  Job control gives the background run a
# SIGINT that is not ignored.
[ -c /dev/fuse ] && command -v fusermount3 >/dev/null ||
	skip "no /dev/fuse or fusermount3: the interrupted-run cases need the view"
set -m
K=$(realpath "$K")
KCTL=$(realpath "$BUILD/bin/kvpctl")
# wait_for PATTERN FILE PID: FILE gets a line matching PATTERN within 60 s
wait_for() {
	local i
	for i in $(seq 600); do
		grep -q -E -- "$1" "$2" && return 0
		kill -0 "$3" 2>/dev/null || fail "the run ended: $(cat "$2")"
		sleep 0.1
	done
	fail "no /$1/ in 60 s: $(cat "$2")"
}

# KV tunables on a running decode: the view shows the values in use
# (KVP_PREDICTOR=window), and a tunable file, `apply` and `kvpctl set`
# change them for the steps that follow; what cannot change says so.
mkdir -p "$tmp/m"
KVP_PREDICTOR=window KVP_FUSE_MOUNT=$tmp/m "$K" run --preset tiny \
	--context 32K --steps 1000000 --budget 32M --json >"$tmp/out" 2>"$tmp/err" &
pid=$!
pids+=("$pid")
wait_for '^kvpager: decode [0-9]*/1000000 steps' "$tmp/err" "$pid"
[ "$(cat "$tmp/m/tunables/predictor")" = "exact [window] lowrank" ] ||
	fail "the view shows predictor $(cat "$tmp/m/tunables/predictor"), not window"
ok "the view shows KVP_PREDICTOR=window in use"
echo exact >"$tmp/m/tunables/predictor" || fail "writing predictor failed"
wait_for '^kvpager: from step [0-9]+: predictor exact, prefetch depth 1' "$tmp/err" "$pid"
ok "predictor window -> exact through tunables/predictor, taken up by the decode"
"$KCTL" set prefetch_depth_layers=0 predict_budget_tokens=64 ||
	fail "kvpctl set prefetch_depth_layers=0 failed"
wait_for '^kvpager: from step [0-9]+: predictor exact, prefetch depth 0, budget tokens 64' "$tmp/err" "$pid"
ok "kvpctl set prefetch_depth_layers=0 predict_budget_tokens=64 taken up"
printf 'predictor = window\n' >"$tmp/m/apply" || fail "apply failed"
wait_for '^kvpager: from step [0-9]+: predictor window, prefetch depth 0' "$tmp/err" "$pid"
ok "apply 'predictor = window' taken up"
echo lowrank >"$tmp/m/tunables/predictor" 2>/dev/null &&
	fail "lowrank accepted on a run that keeps no low-rank keys"
grep -q "predictor lowrank: .*start it with --predictor lowrank" "$tmp/err" ||
	fail "no reason for refusing lowrank: $(cat "$tmp/err")"
out=$("$KCTL" set predictor=lowrank 2>&1) &&
	fail "kvpctl set predictor=lowrank accepted on a run without low-rank keys"
grep -q "start it with --predictor lowrank" <<<"$out" ||
	fail "kvpctl set predictor=lowrank gave no reason: $out"
[ "$(cat "$tmp/m/tunables/predictor")" = "exact [window] lowrank" ] ||
	fail "a refused lowrank changed the view: $(cat "$tmp/m/tunables/predictor")"
ok "lowrank refused with the reason, nothing changed"
out=$("$KCTL" set lowrank_rank=16 2>&1) && fail "lowrank_rank changed on a running decode"
echo "$out" | grep -q "lowrank_rank cannot change on a running pager" ||
	fail "lowrank_rank's refusal does not say why: $out"
ok "lowrank_rank says it cannot change at run time"
kill -INT "$pid"
wait "$pid"
out=$(cat "$tmp/out")
[ "$(json predictor "$out")" = window ] &&
	[ "$(json predictor_at_start "$out")" = window ] &&
	[ "$(json kv_config_changes "$out")" = 3 ] &&
	[ "$(json prefetch_depth_layers "$out")" = 0 ] &&
	[ "$(json predict_budget_tokens "$out")" = 64 ] ||
	fail "the report does not show the config in use: $out"
ok "the report shows the config in use and 3 changes"

for sig in INT TERM; do
	# Files of its own: the run started in the background may not have
	# truncated a shared one yet when wait_for first reads it.
	mkdir -p "$tmp/m"
	KVP_FUSE_MOUNT=$tmp/m "$K" run --preset tiny --context 32K \
		--steps 1000000 >"$tmp/out.$sig" 2>"$tmp/err.$sig" &
	pid=$!
	pids+=("$pid")
	# decoding, and the progress line of a stderr that is no terminal
	wait_for '^kvpager: decode [0-9]*/1000000 steps' "$tmp/err.$sig" "$pid"
	ok "progress lines on a stderr that is not a terminal"
	mountpoint -q "$tmp/m" ||
		fail "the view is not mounted at $tmp/m: $(cat "$tmp/err.$sig"; grep " $tmp/m " /proc/self/mountinfo)"
	[ -f "$tmp/reg/$pid" ] || fail "no registry entry $tmp/reg/$pid: $(ls "$tmp/reg")"
	kill -$sig "$pid"
	wait "$pid"
	rc=$?
	want=$((128 + $(kill -l $sig)))
	[ "$rc" = "$want" ] || fail "SIG$sig: exit $rc, not $want: $(cat "$tmp/err.$sig")"
	grep -q "interrupted after [0-9]* of 1000000 decode steps" "$tmp/err.$sig" ||
		fail "SIG$sig: no word of the interruption: $(cat "$tmp/err.$sig")"
	grep -q "tokens/s" "$tmp/out.$sig" || fail "SIG$sig: no report: $(cat "$tmp/out.$sig")"
	mountpoint -q "$tmp/m" && fail "SIG$sig left the view mounted"
	[ -e "$tmp/reg/$pid" ] && fail "SIG$sig left the registry entry"
	ok "SIG$sig: report, view unmounted, registry entry gone"
done
echo "all $tap_n passed"
