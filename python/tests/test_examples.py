"""python/examples/llama2_paged.py: the real model's forward pass in numpy
with its KV paged by kvpager generates the C main job's tokens."""

import json
import os
import subprocess
import sys

import pytest

from conftest import BUILD, MODEL, ROOT

PROMPT = "1," + ",".join(str(t) for t in range(20, 413, 4))  # 100 tokens
GENERATE = 32


def need_model():
    if not os.path.exists(MODEL):
        pytest.skip(f"no model file {MODEL}")
    try:
        from kvpager import llama2_ref  # noqa: F401 (the model's module)
    except ImportError:
        pytest.skip("kvpager.llama2_ref (the real-model issue) is absent")


def run_example(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "python", "examples",
                                      "llama2_paged.py"), MODEL, *args],
        capture_output=True, text=True, env=env, timeout=600)


def tokens_of(res):
    assert res.returncode == 0, res.stderr
    line = [ln for ln in res.stdout.splitlines()
            if ln.startswith("tokens:")][0]
    return [int(t) for t in line.split()[1:]]


def test_paged_engine_matches_the_c_main_job():
    need_model()
    res = run_example("--prompt-tokens", PROMPT, "--generate",
                      str(GENERATE), "--budget", "2M")
    got = tokens_of(res)
    assert len(got) == GENERATE
    assert "evictions" in res.stderr  # it paged: 5 MiB of layers, 2 MiB
    c = subprocess.run(
        [os.path.join(BUILD, "bin", "kvpager"), "run", "--model", MODEL,
         "--prompt-tokens", PROMPT, "--generate", str(GENERATE), "--block",
         "1M", "--budget", "2M", "--json", "--quiet"],
        capture_output=True, text=True, timeout=600)
    if c.returncode != 0 and "--model" in c.stderr:
        pytest.skip("kvpager run has no --model here: "
                    + c.stderr.strip().splitlines()[0])
    assert c.returncode == 0, c.stderr
    assert got == json.loads(c.stdout)["tokens"]


def test_paged_engine_matches_numpy_all_in_ram():
    need_model()
    from kvpager import llama2_ref
    w = llama2_ref.Weights(MODEL)
    prompt = [int(t) for t in PROMPT.split(",")][:40]
    want, _ = llama2_ref.Model(w).generate(prompt, 16)
    got = tokens_of(run_example("--prompt-tokens",
                                ",".join(map(str, prompt)), "--generate",
                                "16"))
    assert got == want
