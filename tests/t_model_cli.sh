#!/bin/bash
# t_model_cli.sh - kvpager run --model: a random model runs and prints its
# tokens (text and JSON, the same greedy tokens twice), sampling follows
# --seed, and bad input gets a message naming what is wrong and exit 2.
# Needs no model file (random:tiny).
set -u
BUILD=${BUILD:-build}
kvp="$BUILD/bin/kvpager"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

run() { "$kvp" run --quiet --budget 2M "$@"; }

# expect RC PATTERN ARGS...: exit status RC and PATTERN in stdout+stderr
expect() {
	local rc=$1 pat=$2 got
	shift 2
	got=$(run "$@" 2>&1)
	local st=$?
	if [ $st != "$rc" ] || ! grep -q -- "$pat" <<<"$got"; then
		echo "FAIL: kvpager run $* -> exit $st (want $rc), output:"
		echo "$got" | sed 's/^/    /' | tail -n 5
		echo "    (wanted: $pat)"
		fail=1
	fi
}

m=random:tiny
expect 0 '^tokens: ' --model $m --context 40 --generate 8
a=$(run --model $m --context 40 --generate 8 --json | sed 's/.*"tokens":\(\[[^]]*\]\).*/\1/')
b=$(run --model $m --context 40 --generate 8 | sed -n 's/^tokens: //p' | tr ' ' ',')
[ "$a" = "[$b]" ] || { echo "FAIL: JSON tokens $a, text tokens $b"; fail=1; }
s1=$(run --model $m --context 40 --generate 8 --temperature 1 --seed 5 | grep '^tokens')
s2=$(run --model $m --context 40 --generate 8 --temperature 1 --seed 5 | grep '^tokens')
[ "$s1" = "$s2" ] || { echo "FAIL: sampling with one seed differs: $s1 / $s2"; fail=1; }
# A KV smaller than 2 MiB a layer goes in pager blocks of a layer's KV:
# a step reads nothing the budget holds (2 MiB blocks read 5 MiB a step,
# with a warning that the budget holds too few layers).
out=$(run --model $m --context 40 --generate 8 2>&1)
if grep -q 'warning' <<<"$out" ||
	! grep -q 'pager block 16.00 KiB' <<<"$out" ||
	! grep -q 'bytes read/step *0 B' <<<"$out"; then
	echo "FAIL: a small model's KV in whole-layer pager blocks:"
	grep -E 'warning|pager block|bytes read' <<<"$out" | sed 's/^/    /'
	fail=1
fi
printf '1, 2\n3 4\n' >"$tmp/prompt"
expect 0 '"prompt_tokens":4,' --model $m --prompt-tokens "@$tmp/prompt" --generate 2 --json
expect 2 "'x' is not a token id" --model $m --prompt-tokens 1,x --generate 2
expect 2 "'512' is not a token id of the model (0 .. 511)" --model $m --prompt-tokens 1,512 --generate 2
expect 2 "'-1' is not a token id" --model $m --prompt-tokens=-1 --generate 2
expect 2 "no token ids" --model $m --prompt-tokens , --generate 2
expect 2 "cannot read --prompt-tokens file '$tmp/none'" --model $m --prompt-tokens "@$tmp/none" --generate 2
expect 2 "cannot open model '$tmp/none'" --model "$tmp/none" --generate 2
expect 2 "unknown model 'random:nope'" --model random:nope --generate 2
expect 2 "temperature: 'hot' is not a number" --model $m --temperature hot
expect 2 "temperature: '-1' is not a number" --model $m --temperature -1
expect 2 "cannot open tokenizer '$tmp/none'" --model $m --context 4 --generate 2 --tokenizer "$tmp/none"
expect 2 "runs one sequence" --model $m --batch 2 --generate 2
printf 'x' >"$tmp/short.bin"
expect 2 "is truncated" --model "$tmp/short.bin" --generate 2
# A model's option without --model is refused, not ignored (before, the
# synthetic run went on: exit 0, nothing generated, nothing written).
for o in "--prompt-tokens 1,2" "--generate 4" "--temperature 0.5" \
	"--tokenizer $tmp/none" "--logits-out $tmp/logits" "--cache-salt s" \
	"--cache-model-id m" "--cache-key-file $tmp/key" \
	"--cache-capacity 1G" "--cache-dir $tmp/c" "--remote redis://127.0.0.1:1"; do
	expect 2 "^kvpager: ${o%% *} is for a model run (without --model the KV is synthetic): add --model$" \
		--preset tiny --context 40 --steps 2 $o
done
expect 2 "^kvpager: --prompt-tokens is for a model run" --preset tiny \
	--prompt-tokens 1,2 --generate 4 --temperature 0.5 --tokenizer /nonexistent \
	--logits-out "$tmp/logits" --cache-salt s
[ -e "$tmp/logits" ] || [ -e "$tmp/c" ] && { echo "FAIL: a refused run wrote a file"; fail=1; }
KVP_CACHE_DIR=$tmp/c expect 2 "^kvpager: KVP_CACHE_DIR stores a model's KV: add --model, or unset it" \
	--preset tiny --context 40 --steps 2
[ $fail = 0 ] && echo "kvpager run --model: all cases as expected"
exit $fail
