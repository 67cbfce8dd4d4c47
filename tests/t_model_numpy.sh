#!/bin/bash
# t_model_numpy.sh - the C forward pass (kvpager run --model, its KV through
# the pager under a budget that evicts) against an independent numpy one
# (python/kvpager/llama2_ref.py) on stories260K: a 100-token prompt, then
# the first 32 generated tokens must be the same, and every logit of them
# within 1e-3 of numpy's (both run in float32; the sums' order differs).
# Skips (77) without the model file or numpy.
set -u
BUILD=${BUILD:-build}
model=${KVP_MODEL_FILE:-../shared/models/stories260K.bin}
if [ ! -r "$model" ]; then
	echo "skipped: no model file $model (set KVP_MODEL_FILE)"
	exit 77
fi
if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
	echo "skipped: /usr/bin/python3 has no numpy (apt-get install python3-numpy)"
	exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prompt="1,$(seq -s, 20 4 412)"
"$BUILD/bin/kvpager" run --model "$model" --prompt-tokens "$prompt" \
	--generate 32 --block 1M --budget 2M --json --quiet \
	--logits-out "$tmp/logits" >"$tmp/out.json" || exit 1
PYTHONPATH=python /usr/bin/python3 - "$model" "$prompt" "$tmp/out.json" \
	"$tmp/logits" <<'PY' || exit 1
import json, sys
import numpy as np
from kvpager import llama2_ref

model, prompt, out, logits = sys.argv[1:]
prompt = [int(t) for t in prompt.split(",")]
c_tokens = json.load(open(out))["tokens"]
w = llama2_ref.Weights(model)
c_logits = np.fromfile(logits, dtype=np.float32).reshape(-1, w.cfg.vocab)
tokens, ref = llama2_ref.Model(w).generate(prompt, len(c_tokens))
diff = float(np.abs(c_logits - ref).max())
print("C   tokens:", c_tokens)
print("numpy     :", tokens)
print("largest logit difference %.3g (tolerance 1e-3)" % diff)
if tokens != c_tokens:
    sys.exit("the generated tokens differ")
if diff > 1e-3:
    sys.exit("logits differ by %g, over the 1e-3 tolerance" % diff)
PY
echo "C and numpy agree on 32 tokens"
