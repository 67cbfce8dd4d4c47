#!/bin/bash
# t_device.sh - --device on the command line, where there is no GPU (here
# and in CI): `kvpager run --device cuda` and `kvpbench decode --device
# cuda` stop before any work with a message naming what is missing (no
# libkvpager-cuda.so: built without nvcc; no CUDA driver; no device), an
# unknown device is refused, and the emulated device (--device emu) runs
# the whole device path and reports it (text and JSON fields).  On a
# machine with a GPU the cuda refusals are not asserted (tests/gpu/run.sh
# is for it).
#
# Needs $BUILD/bin/kvpager and kvpbench (run by tests/run-tests.sh).
. "$(dirname "$0")/helpers/counted.sh"
K="$BUILD/bin/kvpager"
B="$BUILD/bin/kvpbench"
need "$K" "$B"
command -v python3 >/dev/null || { echo "t_device: python3 not found"; exit 77; }
run="--preset tiny --predictor exact --context 300 --steps 3 --quiet --path $tmp"

# refused RC PATTERN WHAT CMD...: CMD exits RC with PATTERN (grep) on
# stderr, and prints nothing on stdout
refused() {
	local rc=$1 pat=$2 what=$3 got
	shift 3
	"$@" >"$tmp/out" 2>"$tmp/err"
	got=$?
	cat "$tmp/err"
	[ $got = "$rc" ] || fail "$what: exit $got, not $rc"
	grep -q -- "$pat" "$tmp/err" || fail "$what: no clear reason"
	[ -s "$tmp/out" ] && fail "$what printed a report"
}

# cuda where there is none: exit 1, the reason, nothing run
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
	echo "t_device: a GPU is here: the cuda refusals are not checked"
else
	refused 1 "^kvpager: --device cuda: no CUDA \(driver\|device\)\|^kvpager: --device cuda: cannot load libkvpager-cuda.so" \
		"kvpager run --device cuda" $K run --device cuda $run
	refused 1 "^kvpbench decode: --device cuda: " \
		"kvpbench decode --device cuda" \
		$B decode --device cuda --preset tiny --quiet
fi
# a kvpager built without nvcc (no library where it looks)
KVP_CUDA_LIB=$tmp/none/libkvpager-cuda.so $K run --device cuda $run \
	>/dev/null 2>"$tmp/err"
rc=$?
cat "$tmp/err"
[ $rc = 1 ] || fail "without libkvpager-cuda.so: exit $rc"
grep -q "cannot load libkvpager-cuda.so.*built without nvcc" "$tmp/err" ||
	fail "without libkvpager-cuda.so: the message does not say so"

# a name that is no device is the command line's error: exit 2 (a device
# that is not here, above, exit 1); before, exit 1 for both
refused 2 "^kvpager: unknown device 'tpu' (cpu, cuda, emu)" "--device tpu" \
	$K run --device tpu $run
refused 2 "^kvpbench decode: unknown device 'tpu' (cpu, cuda, emu)" \
	"kvpbench decode --device tpu" $B decode --device tpu --preset tiny --quiet

# a pool that cannot hold one layer's chosen blocks: refused before the
# run with the smallest that holds them at every step (before, the first
# step failed with "Argument list too long"); that smallest runs
refused 2 "the smallest pool" "--device-pool 64K" \
	$K run --device emu $run --device-pool 64K
min=$(sed -n 's/.*the smallest pool that holds them at every step is \([0-9]*\) bytes ([0-9.]* [KMG]iB): give at least that.*/\1/p' "$tmp/err")
[ -n "$min" ] || fail "--device-pool 64K: no smallest pool named"
grep -q "decode step\|Argument list" "$tmp/err" && fail "--device-pool 64K ran a step"
$K run --device emu $run --device-pool $((min - 1)) >/dev/null 2>&1
[ $? = 2 ] || fail "--device-pool $((min - 1)): not refused"
$K run --device emu $run --device-pool "$min" >/dev/null 2>"$tmp/err" ||
	{ cat "$tmp/err"; fail "--device-pool $min (the smallest named): exit $?"; }
# that smallest is what this run's steps take, not the cache at capacity
# rounded up to whole pager blocks (before: 131072 bytes here, and 10 MiB
# for the default 32K context, whose steps take 8 MiB): the last step's
# 303 tokens fill 75 blocks of 1 KiB (the 76th, the rolling one, is sent
# apart)
[ "$min" = 76800 ] || fail "--device-pool: the smallest named is $min, not 76800"
$K run --device emu --preset tiny --predictor exact --steps 3 --quiet \
	--path "$tmp" --device-pool 9M >/dev/null 2>"$tmp/err"
rc=$?
[ $rc = 0 ] || { cat "$tmp/err"; fail "--device-pool 9M at 32K: exit $rc"; }
# no upper bound but 64 bits: said as one
$K run --device emu $run --device-pool 1K >/dev/null 2>"$tmp/err"
rc=$?
[ $rc = 2 ] && grep -q "^kvpager: --device-pool: '1K' is out of range; accepted: at least 4K$" "$tmp/err" ||
	fail "--device-pool 1K: exit $rc, $(cat "$tmp/err")"

# kvpbench decode makes the same check before any mode runs (before, its
# fed modes each failed their first step, "Argument list too long", and
# the rest ran), and the smallest it names runs
brun="--preset tiny --context 300 --steps 3 --device emu --quiet --path $tmp"
refused 2 "^kvpbench decode: --device-pool 8192 bytes cannot hold one layer's chosen blocks; the smallest pool that holds them at every step is 76800 bytes (75.00 KiB): give at least that" \
	"kvpbench decode --device-pool 8K" $B decode $brun --device-pool 8K
$B decode $brun --device-pool 76800 >/dev/null 2>"$tmp/err"
rc=$?
[ $rc = 0 ] || { cat "$tmp/err"; fail "kvpbench decode --device-pool 76800: exit $rc"; }

# the emulated device: the report's device line, the JSON's fields
$K run --device emu $run >"$tmp/out" 2>"$tmp/err" || fail "--device emu: exit $?"
grep -q "^  device emu (CPU emulation.*blocks reused [0-9]*, copied [1-9]" \
	"$tmp/out" || { cat "$tmp/out" "$tmp/err"; fail "--device emu: no device line"; }
$K run --device emu $run --json >"$tmp/json" 2>"$tmp/err" || fail "--json: exit $?"
$K run $run --json >"$tmp/cpu.json" 2>>"$tmp/err" || fail "cpu --json: exit $?"
$B decode --device emu --preset tiny --context 1000 --predictor window \
	--budget-tokens 64 --steps 4 --warmup 1 --quiet --json \
	>"$tmp/bench" 2>"$tmp/err" || { cat "$tmp/err"; fail "kvpbench decode --device emu: exit $?"; }
python3 - "$tmp/json" "$tmp/cpu.json" "$tmp/bench" <<'PY' || fail "JSON fields"
import json, sys
run = json.load(open(sys.argv[1]))
cpu = json.load(open(sys.argv[2]))
rows = [json.loads(l) for l in open(sys.argv[3]) if l.strip()]
bad = []
if not run["device"].startswith("emu"):
    bad.append("run device %r" % run["device"])
for f in ("device_pool_slots", "device_blocks_reused", "device_blocks_copied",
          "device_reuse_rate", "device_bytes_to_device", "device_t_stage_s",
          "device_overlap_misses"):
    if f not in run:
        bad.append("run lacks " + f)
if run.get("device_blocks_copied", 0) <= 0:
    bad.append("nothing copied to the device")
if cpu["device"] != "cpu":
    bad.append("a CPU run says device %r" % cpu["device"])
if abs(run["recall"] - 1) > 1e-6 or run["rel_error"] > 1e-4:
    bad.append("device output vs exact: recall %g rel_error %g"
               % (run["recall"], run["rel_error"]))
modes = [r["mode"] for r in rows]
if modes != ["device-all", "device-kvpager", "device-demand"]:
    bad.append("modes %r" % modes)
for r in rows:
    for f in ("ratio_vs_device", "t_gpu_s", "t_step_over_max_gpu_load",
              "device_reuse_rate", "device_mib_per_step",
              "staging_copy_s_per_step"):
        if f not in r:
            bad.append("%s lacks %s" % (r["mode"], f))
    if r["device"] != "emu":
        bad.append("%s: device %r" % (r["mode"], r["device"]))
if rows and abs(rows[0]["ratio_vs_device"] - 1) > 1e-9:
    bad.append("device-all's ratio_vs_device is not 1")
if rows and rows[0]["device_reuse_rate"] < 0.99:
    bad.append("device-all copied in the measured steps (reuse %g)"
               % rows[0]["device_reuse_rate"])
for b in bad:
    print("bad:", b)
sys.exit(1 if bad else 0)
PY

finish t_device
