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
B=build
mkdir -p "$out"
sum="$out/summary.txt"
: >"$sum"
fails=0

say() { echo "$*" | tee -a "$sum"; }
check() { # name, command...: run, log, pass/fail line
	local name=$1 rc t0
	shift
	t0=$(date +%s)
	"$@" >"$out/$name.log" 2>&1
	rc=$?
	if [ $rc = 0 ]; then
		say "PASS $name ($(($(date +%s) - t0)) s)"
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
say "date: $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null)"

check build make -j"$(nproc)" NVCCFLAGS="-O3 -arch=native" all \
	$B/tests/test_devpool $B/tests/test_kvcache_device || {
	say "the build failed: nothing else runs"
	exit 1
}
$B/bin/kvp-probe >"$out/probe.txt" 2>&1
say "$(grep -i 'first touch' "$out/probe.txt" | head -n 1)"
say "$(grep -i 'tlb flush' "$out/probe.txt" | head -n 1)"
if ! $B/bin/kvpager run --device cuda --preset tiny --context 64 \
	--predictor exact --steps 2 --quiet >"$out/device.log" 2>&1; then
	say "FAIL device: kvpager run --device cuda cannot run:"
	tee -a "$sum" <"$out/device.log"
	exit 1
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
