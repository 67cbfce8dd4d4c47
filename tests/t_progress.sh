#!/bin/bash
# t_progress.sh - progress of long phases (lib/cli/progress.h) as the
# tools show it: a bar on a terminal (script(1) gives one), no carriage
# returns when stderr is a file (a line every few seconds instead, which
# these short runs do not reach), and nothing with --quiet.  Covered:
# kvpager run (with --model too: its prefill's tokens), kvpbench decode,
# kvpbench's fill and the runs of its stream, random and touch scenarios
# (each mode's own bar, touch's preload child's too), and kvpbench tier
# (a bar per block size; when redis-server is there).
set -u
BUILD=${BUILD:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp
fails=0
fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}
for t in kvpbench kvpager; do
	[ -x "$BUILD/bin/$t" ] || { echo "skipped: $BUILD/bin/$t not built"; exit 77; }
done
dec="$BUILD/bin/kvpbench decode --preset tiny --short --modes ram,kvpager"
run="$BUILD/bin/kvpager run --preset tiny --context 4096 --steps 20"
mdl="$BUILD/bin/kvpager run --model random:tiny --context 600 --generate 4"
fill="$BUILD/bin/kvpbench --short --modes raw --repeat 1 stream"
rnd="$BUILD/bin/kvpbench --budget 8M --modes raw,kvpager-copy --repeat 1 --threads 1 --ref-depth 0 random"
tch="$BUILD/bin/kvpbench touch --budget 8M --touches 128 --threads 1 --modes raw,kvpager"
tier="$BUILD/bin/kvpbench tier --short --no-cluster"
# touch's preload line runs a child program: its bar comes from the
# child's progress lines (skipped in sanitizer builds: no shim there).
tchp="$BUILD/bin/kvpbench touch --budget 8M --touches 4096 --threads 1 --modes preload"
cmds=("$dec" "$run" "$mdl" "$fill" "$rnd" "$tch")
command -v redis-server >/dev/null && cmds+=("$tier")
$tchp --quiet 2>/dev/null | grep -q "preload *[0-9]" && cmds+=("$tchp")

for cmd in "${cmds[@]}"; do
	$cmd >/dev/null 2>"$tmp/err" || fail "$cmd failed: $(cat "$tmp/err")"
	grep -q $'\r' "$tmp/err" && fail "$cmd: a bar on a stderr that is a file"
	$cmd --quiet >/dev/null 2>"$tmp/err" || fail "$cmd --quiet failed"
	grep -v "warning" "$tmp/err" | grep -q . &&
		fail "$cmd --quiet said: $(cat "$tmp/err")"
done
echo "ok: no bar off a terminal, nothing with --quiet"

# The bars each command must finish: its phases, by name.
declare -A bars=(
	["$dec"]="decode"
	["$run"]="decode"
	["$mdl"]="prefill|decode"
	["$fill"]="fill|stream raw"
	["$rnd"]="random raw|random kvpager-copy"
	["$tch"]="touch raw|touch kvpager"
	["$tier"]="tier 65536-byte blocks"
	["$tchp"]="touch preload"
)
if command -v script >/dev/null; then
	for cmd in "${cmds[@]}"; do
		script -qec "$cmd >/dev/null" /dev/null >"$tmp/tty" 2>&1 ||
			fail "$cmd on a terminal failed"
		IFS='|' read -ra want <<<"${bars[$cmd]}"
		for w in "${want[@]}"; do
			tr '\r' '\n' <"$tmp/tty" |
				grep -qE "$w +\[#{30}\] 100%" ||
				fail "$cmd: no finished '$w' bar on a terminal: $(tr '\r' '\n' <"$tmp/tty" | tail -3)"
		done
	done
	echo "ok: a bar on a terminal"
fi
[ $fails = 0 ] || exit 1
echo "t_progress: all passed"
