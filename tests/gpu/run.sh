#!/bin/bash
# tests/gpu/run.sh - the checks of `--device cuda` that need an NVIDIA GPU,
# as one script for whoever has one (make check has none: it runs the same
# host code on the emulated device).  From the repository root:
#
#   tests/gpu/run.sh [OUT] [MODEL]
#
# OUT (default build/gpu) gets every log and summary.txt; MODEL is a
# llama2.c checkpoint for the token check (default: shared/models/ or
# ../shared/models/stories260K.bin; random:tiny when neither is there).
# Exit 0: every check passed; 1: one failed (summary.txt says which);
# 77: no GPU here (the reason printed).  About 3-6 minutes on an H100/H200
# with the benchmarks at 32K context; SKIP_BENCH=1 leaves them out.
# KVP_GPU_PREBUILT=1 skips step 1 and runs what tests/gpu/prebuild.sh
# built elsewhere (for a GPU machine without the build's packages).
# CHECK_TIMEOUT (default 300) is how long one check may run: a hung
# check is killed and counted failed, the others still run.
#
#   1. build with nvcc for this GPU (-arch=native)
#   2. test_devpool on cuda: the kernel and the schedule against
#      lib/kv/attention.c, shapes of every preset (llama3-8b, qwen3-8b,
#      tiny), fp16, bf16, fp32, G = 1 .. 64, GQA 1 .. 8, relative error
#      under 1e-4 per (sequence, layer) output
#   3. test_kvcache_device on cuda: the cache's device path against the
#      CPU's outputs, every backend x predictor (exact, window, lowrank),
#      forks, copy on write, freed and reused blocks, tight pools; 1e-4
#   4. tokens: kvpbench decode --model with the exact predictor: every
#      device mode's tokens equal the CPU's (all-in-RAM exact) run's
#   5. kvpbench decode --device cuda, llama3-8b shape, 32K context: exact,
#      and lowrank with a device pool of a quarter of the KV
set -u
out=${1:-build/gpu}
model=${2:-}
export B=build out
mkdir -p "$out"
sum="$out/summary.txt"
: >"$sum"
fails=0
limit=${CHECK_TIMEOUT:-300} # seconds each check may take before it is killed

say() { echo "$*" | tee -a "$sum"; }
check() { # name, command...: run, log, pass/fail line
	local name=$1 rc t0
	shift
	t0=$(date +%s)
	if declare -F "$1" >/dev/null; then # a function: timeout needs a program
		timeout -k 10 "$limit" bash -c "$(declare -f "$1"); \"\$@\"" \
			"$name" "$@" >"$out/$name.log" 2>&1
	else
		timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
	fi
	rc=$?
	if [ $rc = 0 ]; then
		say "PASS $name ($(($(date +%s) - t0)) s)"
	elif [ $rc = 124 ] || [ $rc = 137 ]; then
		say "FAIL $name: still running after $limit s, killed ($out/$name.log):"
		tail -n 15 "$out/$name.log" | tee -a "$sum"
		fails=$((fails + 1))
	else
		say "FAIL $name: exit $rc ($out/$name.log):"
		tail -n 15 "$out/$name.log" | tee -a "$sum"
		fails=$((fails + 1))
	fi
	return $rc
}

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
	echo "tests/gpu/run.sh: no NVIDIA GPU here (nvidia-smi -L fails)"
	exit 77
fi
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
say "gpu: $(nvidia-smi -L | head -n 1)"
say "date: $(date -u +%FT%TZ), tree's commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

if [ "${KVP_GPU_PREBUILT:-0}" = 1 ]; then
	for f in bin/kvpbench bin/kvpager bin/kvp-probe lib/libkvpager-cuda.so \
		tests/test_devpool tests/test_kvcache_device; do
		[ -x $B/$f ] || [ -f $B/$f ] || {
			say "KVP_GPU_PREBUILT=1 but $B/$f is missing: run" \
				"tests/gpu/prebuild.sh first"
			exit 1
		}
	done
	[ -d $B/gpu-libs ] &&
		export LD_LIBRARY_PATH=$PWD/$B/gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	say "build: prebuilt from $(cat $B/gpu-commit 2>/dev/null || echo '?') ($(cuobjdump --list-elf $B/lib/libkvpager-cuda.so 2>/dev/null |
		grep -o 'sm_[0-9a-z]*' | sort -u | tr '\n' ' '))"
else
	check build make -j"$(nproc)" NVCCFLAGS="-O3 -arch=native" all \
		$B/tests/test_devpool $B/tests/test_kvcache_device || {
		say "the build failed: nothing else runs"
		exit 1
	}
fi
$B/bin/kvp-probe >"$out/probe.txt" 2>&1
say "$(grep -i 'first touch' "$out/probe.txt" | head -n 1)"
say "$(grep -i 'tlb flush' "$out/probe.txt" | head -n 1)"
if ! timeout -k 10 60 $B/bin/kvpager run --device cuda --preset tiny --context 64 \
	--predictor exact --steps 2 --quiet >"$out/device.log" 2>&1; then
	say "FAIL device: kvpager run --device cuda cannot run:"
	tee -a "$sum" <"$out/device.log"
	fails=$((fails + 1))
fi

export KVP_TEST_DEVICE=cuda
check kernel_vs_cpu $B/tests/test_devpool
check cache_vs_cpu $B/tests/test_kvcache_device
unset KVP_TEST_DEVICE

# 4. the model's tokens: the device modes agree with all-in-RAM exact
for m in "$model" shared/models/stories260K.bin ../shared/models/stories260K.bin; do
	[ -n "$m" ] && [ -f "$m" ] && { model=$m; break; }
done
[ -f "$model" ] || model=random:tiny
tokens_check() { # model, context, steps
	$B/bin/kvpbench decode --model "$1" --context "$2" --steps "$3" \
		--warmup 1 --predictor exact --device cuda --quiet --json \
		>"$out/tokens-$4.json" || return 1
	python3 - "$out/tokens-$4.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
dev = [r for r in rows if r["mode"].startswith("device-")]
for r in rows:
    print(r["mode"], "agreement", r["token_agreement"], "tokens/s",
          r["tokens_per_s"])
sys.exit(0 if len(dev) == 3 and all(r["token_agreement"] == 1.0
                                    for r in dev) else 1)
PY
}
check tokens_model tokens_check "$model" 448 64 model
check tokens_llama3 tokens_check random:llama3-8b 4096 16 llama3
grep -h agreement "$out"/tokens_*.log >>"$sum" 2>/dev/null

# 5. the benchmark (its figures go to the README)
if [ "${SKIP_BENCH:-0}" != 1 ]; then
	check bench_exact $B/bin/kvpbench decode --device cuda \
		--preset llama3-8b --context 32768 --predictor exact \
		--steps 6 --warmup 2 --quiet
	check bench_lowrank $B/bin/kvpbench decode --device cuda \
		--preset llama3-8b --context 32768 --predictor lowrank \
		--device-pool 1G --steps 12 --warmup 2 --quiet
	cat "$out/bench_exact.log" "$out/bench_lowrank.log" >>"$sum"
fi
say "$fails failed"
[ $fails = 0 ]
