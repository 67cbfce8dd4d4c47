#!/bin/bash
# t_plot.sh - kvpbench --plot: gnuplot draws what the run's table shows,
# into an SVG or a PNG by the file's ending; the scenarios' chart names
# each mode it ran, decode's its tokens/s and T_step panels, touch's a bar
# per mode that ran (mmap and preload, programs of their own, too),
# beside the others' chart when it ran with them.  kvpager run
# --plot draws the decode's timeline: its four series, a point per step,
# the faults and the warm-up.  A name that is neither, gnuplot missing
# from PATH and a folder that cannot be written are refused at start
# (exit 2, before any run), with a message that says so and a remedy, and
# leave no file.  Figures are not judged.
set -u
BUILD=${BUILD:-build}
B="$BUILD/bin/kvpbench"
K="$BUILD/bin/kvpager"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() {
	echo "FAIL: $*"
	fails=$((fails + 1))
}
[ -x "$B" ] && [ -x "$K" ] || { echo "skipped: $B or $K not built"; exit 77; }
# make installs gnuplot-nox with the other packages (the Makefile's deps)
command -v gnuplot >/dev/null || { echo "FAIL: gnuplot not on PATH (apt-get install gnuplot-nox)"; exit 1; }

# The scenarios: a small file, one run of each mode, an SVG.
"$B" --budget 8M stream random --threads 1 --repeat 1 --ref-depth 0 \
	--modes raw,mmap,kvpager-copy --quiet --dir "$tmp" \
	--plot "$tmp/runs.svg" >"$tmp/out" 2>&1 || fail "kvpbench --plot exit $?: $(cat "$tmp/out")"
if [ -s "$tmp/runs.svg" ]; then
	grep -q '<svg' "$tmp/runs.svg" || fail "runs.svg is not an SVG"
	for want in kvpager-copy 'raw (io_uring O_DIRECT)' 'mmap (cold)' \
		'stream 2M, 1 thr' 'random 64K, 1 thr' GB/s; do
		grep -qF "$want" "$tmp/runs.svg" || fail "runs.svg does not show '$want'"
	done
else
	fail "kvpbench --plot made no $tmp/runs.svg"
fi
[ -e "$tmp/runs.svg.tmp" ] && fail "runs.svg.tmp left behind"

# decode, an SVG and a PNG.
dec="$B decode --preset tiny --short --modes ram,kvpager --quiet"
$dec --plot "$tmp/decode.svg" >"$tmp/out" 2>&1 || fail "decode --plot exit $?: $(cat "$tmp/out")"
for want in tokens/s T_step 'max(T_compute, T_load)' ram kvpager; do
	grep -qF "$want" "$tmp/decode.svg" 2>/dev/null ||
		fail "decode.svg does not show '$want'"
done
$dec --plot "$tmp/decode.png" >"$tmp/out" 2>&1 || fail "decode --plot png exit $?: $(cat "$tmp/out")"
[ "$(head -c 4 "$tmp/decode.png" 2>/dev/null | od -An -c | tr -d ' ')" = '211PNG' ] ||
	fail "decode.png is not a PNG"

# touch: a bar for every mode its table shows run, the mmap and preload
# lines (programs of their own) included; with another scenario, its
# chart goes to FILE-touch.png beside FILE.
"$B" touch --budget 8M --touches 128 --threads 1 --quiet --dir "$tmp" \
	--plot "$tmp/touch.svg" >"$tmp/out" 2>&1 || fail "touch --plot exit $?: $(cat "$tmp/out")"
ran=0
for m in raw mmap kvpager preload; do
	grep -q "^random *ro *1 $m  *[0-9]" "$tmp/out" || continue # skipped
	grep -qF ">$m" "$tmp/touch.svg" 2>/dev/null || fail "touch.svg does not show $m"
	ran=$((ran + 1))
done
[ $ran -ge 3 ] || fail "touch ran $ran modes of 4: $(cat "$tmp/out")"
for want in '<svg' 'random touches' 'sequential touches' 'ro, 1 thr' \
	'rw, 1 thr' GB/s; do
	grep -qF "$want" "$tmp/touch.svg" 2>/dev/null || fail "touch.svg does not show '$want'"
done
"$B" stream touch --budget 8M --touches 128 --threads 1 --repeat 1 \
	--modes raw,mmap,kvpager-copy,preload --quiet --dir "$tmp" \
	--plot "$tmp/both.png" >"$tmp/out" 2>&1 ||
	fail "stream touch --plot exit $?: $(cat "$tmp/out")"
for f in both.png both-touch.png; do
	[ "$(head -c 4 "$tmp/$f" 2>/dev/null | od -An -c | tr -d ' ')" = '211PNG' ] ||
		fail "stream touch --plot made no PNG $f"
done

# kvpager run: the timeline of 7 steps, 2 of them warm-up.
run="$K run --preset tiny --context 1K --steps 7 --warmup 2 --quiet --path $tmp"
$run --plot "$tmp/run.svg" >"$tmp/out" 2>&1 || fail "kvpager run --plot exit $?: $(cat "$tmp/out")"
grep -q "tokens/s" "$tmp/out" || fail "kvpager run --plot printed no report: $(cat "$tmp/out")"
for want in '<svg' T_compute T_load T_step 'max(T_compute, T_load)' \
	'demand faults' 'warm-up (shaded)' 'decode step' 'kvpager run: tiny'; do
	grep -qF "$want" "$tmp/run.svg" 2>/dev/null ||
		fail "run.svg does not show '$want'"
done
# a dot per step on each of T_compute, T_load and T_step, and one in
# each of their keys (gnuplot's SVG: point type 7 is #gpPt6)
dots=$(grep -o "#gpPt6" "$tmp/run.svg" 2>/dev/null | wc -l)
[ "$dots" = $((3 * 7 + 3)) ] || fail "run.svg has $dots step dots, want $((3 * 7 + 3))"
[ -e "$tmp/run.svg.tmp" ] && fail "run.svg.tmp left behind"
echo "ok: the charts are drawn"

# Refused at start: exit 2, said, no file, nothing run (no table, no
# kvpager report).
refused() { # what want_in_message command...
	local what=$1 want=$2
	shift 2
	"$@" >"$tmp/bad" 2>&1
	rc=$?
	[ $rc = 2 ] || fail "$what: exit $rc, want 2"
	grep -qF -- "$want" "$tmp/bad" || fail "$what: the message does not say '$want': $(cat "$tmp/bad")"
	grep -q "^scenario\|^mode\|^phases\|^decode," "$tmp/bad" && fail "$what: it ran before refusing"
}
refused "--plot x.pdf" ".svg" "$B" stream --dir "$tmp" --plot "$tmp/x.pdf"
refused "decode --plot x.pdf" ".svg" $dec --plot "$tmp/x.pdf"
refused "--plot in a missing folder" "cannot write" \
	"$B" stream --dir "$tmp" --plot "$tmp/none/x.svg"
mkdir "$tmp/empty"
refused "--plot without gnuplot" "gnuplot-nox" \
	env PATH="$tmp/empty" "$B" stream --dir "$tmp" --plot "$tmp/x.svg"
refused "decode --plot without gnuplot" "gnuplot-nox" \
	env PATH="$tmp/empty" $dec --plot "$tmp/x.svg"
refused "run --plot x.pdf" ".svg" $run --plot "$tmp/x.pdf"
refused "run --plot in a missing folder" "cannot write" \
	$run --plot "$tmp/none/x.svg"
refused "run --plot without gnuplot" "gnuplot-nox" \
	env PATH="$tmp/empty" $run --plot "$tmp/x.svg"
ls "$tmp"/x.* >/dev/null 2>&1 && fail "a refused --plot left $(ls "$tmp"/x.*)"
echo "ok: bad --plot refused at start"

[ $fails = 0 ] || { echo "t_plot: $fails failure(s)"; exit 1; }
echo "t_plot: all passed"
