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


def prefix_hit(res):
    line = [ln for ln in res.stderr.splitlines()
            if ln.startswith("prefix:")][0]
    return int(line.split()[1])


def test_paged_engine_reuses_its_prefix_cache(tmp_path):
    """The second run reads the prompt's chunks that the first stored and
    generates the same tokens."""
    need_model()
    args = ("--prompt-tokens", PROMPT, "--generate", "16", "--cache-dir",
            str(tmp_path / "cache"))
    first = run_example(*args)
    second = run_example(*args)
    assert prefix_hit(first) == 0
    assert prefix_hit(second) == 96  # 6 chunks of 16; the 7th holds the last
    assert tokens_of(second) == tokens_of(first)


def test_two_instances_share_a_prefix_through_redis(tmp_path, redis):
    """Instance A fills Redis; instance B, with an empty directory of its
    own, fetches the prompt's chunks from there."""
    need_model()
    args = ("--prompt-tokens", PROMPT, "--generate", "16", "--remote",
            redis)
    a = run_example(*args, "--cache-dir", str(tmp_path / "a"))
    b = run_example(*args, "--cache-dir", str(tmp_path / "b"))
    assert prefix_hit(a) == 0 and prefix_hit(b) == 96
    assert tokens_of(b) == tokens_of(a)


def c_run(*args):
    """kvpager run --model on PROMPT: its JSON report, or a skip when the
    tool has no --model."""
    c = subprocess.run(
        [os.path.join(BUILD, "bin", "kvpager"), "run", "--model", MODEL,
         "--prompt-tokens", PROMPT, *args, "--json", "--quiet"],
        capture_output=True, text=True, timeout=600)
    if c.returncode != 0 and "--model" in c.stderr:
        pytest.skip("kvpager run has no --model here")
    assert c.returncode == 0, c.stderr
    return json.loads(c.stdout)


def test_python_reads_the_chunks_kvpager_run_stored(tmp_path):
    """The keys and the payload format are the C tools': a PrefixCache
    with kvpager run's geometry (fp32, G = 4, chunks of 64) finds the
    chunk it stored, its KV blocks in the KV cache's format, holding the
    K and V numpy computes."""
    need_model()
    import numpy as np

    import kvpager
    from kvpager import llama2_ref
    c_run("--generate", "4", "--cache-dir", str(tmp_path))
    w = llama2_ref.Weights(MODEL)
    c = w.cfg
    g = kvpager.KVGeometry(layers=c.layers, q_heads=c.heads,
                           kv_heads=c.kv_heads, head_dim=c.head_dim,
                           dtype="fp32", block_tokens=4)
    prompt = [int(t) for t in PROMPT.split(",")]
    with kvpager.PrefixCache(str(tmp_path), geometry=g, model_file=MODEL,
                             chunk_tokens=64) as px:
        assert px.set_prompt(prompt) == 1
        assert px.cached_chunks() == 1
        buf = px.chunk_array()
        assert px.get(0, buf)
        assert px.in_blocks  # G = 4 divides 64: the KV blocks' format
        k, v = px.chunk_kv(buf)  # [layers, 16 blocks, kv_heads, 4, dim]
    m = llama2_ref.Model(w, capacity=64)
    m.prefill(prompt[:64])

    def tokens_major(a):  # [layers, 64 tokens, kv_heads, head_dim]
        return a.transpose(0, 1, 3, 2, 4).reshape(m.kv.k.shape)

    np.testing.assert_allclose(tokens_major(k), m.kv.k, rtol=1e-3,
                               atol=1e-4)
    np.testing.assert_allclose(tokens_major(v), m.kv.v, rtol=1e-3,
                               atol=1e-4)


def test_kvpager_run_reads_the_chunks_python_stored(tmp_path):
    need_model()
    py = run_example("--prompt-tokens", PROMPT, "--generate", "16",
                     "--cache-dir", str(tmp_path), "--block-tokens", "4",
                     "--chunk-tokens", "64")
    c = c_run("--generate", "16", "--cache-dir", str(tmp_path))
    assert c["prefix_hit_tokens"] == 64
    assert c["tokens"] == tokens_of(py)
