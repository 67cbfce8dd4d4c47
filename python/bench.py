#!/usr/bin/python3
"""bench.py - what the Python binding costs against C, side by side.

    make && PYTHONPATH=build/python /usr/bin/python3 python/bench.py [--short]

Two figures, each a ratio of C and Python measured in this one
invocation, side by side:

  attention  a decode step over one sequence of --context tokens (exact
             predictor, synthetic KV, all in RAM: the compute bound) of
             --preset: KVCache.step timed in Python against the same
             call's time measured in C, means over --steps calls; and
             Attention() over one layer's KV in a numpy array against the
             bare kvp_attn_decode, alternately (A B B A), medians of
             --steps x 4 calls each.
             Target: Python at most 1.1x C.
  scan       a region four times the budget read from a file store, one
             word per 4 KiB page, block by block: `kvpbench stream
             --modes kvpager-move` (C) against the same through a numpy
             view (Python), in GB/s, interleaved, medians of --repeat
             runs.  Target: at least 0.9x C.

Prints kvp-probe's `page first touch` line first: in a guest, absolute
figures depend on it; and the load average (1, 5, 15 minutes) beside
each figure, since the machine is shared.
"""

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, "..", os.environ.get("BUILD", "build"))
# Python puts this script's folder first on the path, and python/kvpager
# there is the package's sources without the _abi.py the build makes: the
# built package (PYTHONPATH=build/python) is the one to import.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != HERE]

import kvpager  # noqa: E402
from kvpager import _native  # noqa: E402


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def tool(name):
    return os.path.join(BUILD, "bin", name)


def kvpbench(*args):
    """The JSON lines of one kvpbench run."""
    res = subprocess.run([tool("kvpbench"), *args, "--json", "--quiet"],
                         capture_output=True, text=True, check=True)
    return [json.loads(line) for line in res.stdout.splitlines()
            if line.startswith("{")]


def attention(a):
    """The binding's overhead on attention, against the C call itself, in
    this process, call by call (a loaded machine's drift cancels out).

    step: KVCache.step with the SynthSource (all in C) timed around the
    Python call, against the step's own time measured in C (t_step_s).
    layer: Attention() over one layer's KV, against kvp_attn_decode
    called with the same arguments prepared once (a bare ctypes call, a
    microsecond), alternately."""
    g = kvpager.KVGeometry.preset(a.preset)
    with kvpager.SynthSource(g, seed=1) as syn, \
            kvpager.KVCache(g, capacity_tokens=a.context + a.steps + 8,
                            backend="ram", predictor="exact") as c:
        s = c.new_sequence()
        c.prefill(s, a.context - 1, syn)
        out = np.empty((1, g.layers, g.q_heads, g.head_dim), np.float32)
        c.step(s, syn, out=out)  # warm-up
        py = cc = 0.0
        for _ in range(a.steps):
            t0 = time.perf_counter()
            c.step(s, syn, out=out)
            py += time.perf_counter() - t0
            cc += c.step_stats["t_step_s"]
    nblocks = a.context // g.block_tokens
    kv = np.empty((nblocks, g.block_stride), dtype=np.uint8)
    vals = kv.view(g.np_dtype)
    vals[:] = np.random.default_rng(1).standard_normal(
        vals.shape, dtype=np.float32).astype(g.np_dtype)
    q = np.random.default_rng(2).standard_normal((g.q_heads, g.head_dim),
                                                 dtype=np.float32)
    o = np.empty_like(q)
    lib = _native.lib
    ptrs = kv.ctypes.data + np.arange(nblocks, dtype=np.uintp) * \
        np.uintp(g.block_stride)
    blocks = _native.AttnBlocks(_native.address(ptrs), None, nblocks)
    geo = g.c()
    with kvpager.Attention(g) as attn:
        args = (ctypes.byref(geo), ctypes.byref(blocks),
                _native.address(q), _native.address(o), attn._h)
        attn(kv, q, out=o)
        lpy, lc = [], []
        for i in range(a.steps * 4):
            # A B B A: the call that goes first alternates, so that a
            # loaded scheduler's way with the first (or the second) call
            # of a pair falls on each as often.
            for bare in (True, False) if i % 2 else (False, True):
                t0 = time.perf_counter()
                if bare:
                    lib.kvp_attn_decode(*args)
                else:
                    attn(kv, q, out=o)
                (lc if bare else lpy).append(time.perf_counter() - t0)
    # medians: a call that the load preempted is an outlier, not a cost
    return (py / a.steps, cc / a.steps, statistics.median(lpy),
            statistics.median(lc))


def write_file(path, size):
    """A backing file of @size bytes that is not a hole (a pattern)."""
    chunk = np.arange(1 << 20, dtype=np.uint64).view(np.uint8)
    with open(path, "wb") as f:
        for _ in range(size // chunk.nbytes):
            f.write(chunk)


def scan_c(a):
    r = kvpbench("stream", "--modes", "kvpager-move", "--budget",
                 str(a.budget), "--block", str(a.block), "--repeat", "1",
                 "--dir", a.dir)[0]
    return r["gb_per_s"]


def scan_py(a, path):
    """kvpbench's stream through numpy: the same pager settings (budget,
    move, a read-ahead window of 16 blocks), a region over the file, one
    word per 4 KiB page read, block by block.  Opening is not timed."""
    size = 4 * a.budget
    with kvpager.Pager(budget=a.budget, install_mode="move",
                       readahead_bytes=16 * a.block) as p, \
            kvpager.Store.file(path, create=False) as st:
        with p.region(size, block_bytes=a.block, store=st,
                      from_store=True) as r:
            words = r.array(np.uint64)
            per_block = a.block // 8
            total = np.uint64(0)
            t0 = time.perf_counter()
            for b in range(size // a.block):
                total += words[b * per_block:(b + 1) * per_block:512].sum()
            dt = time.perf_counter() - t0
            assert r.stats()["bytes_read_total"] >= size
            del words
    return size / dt / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--budget", type=int, default=256 << 20)
    ap.add_argument("--block", type=int, default=2 << 20)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp"))
    ap.add_argument("--short", action="store_true",
                    help="context 8192, budget 64M")
    ap.add_argument("--only", choices=["attention", "scan"])
    a = ap.parse_args()
    if a.short:
        a.context, a.budget = 8192, 64 << 20
    probe = subprocess.run([tool("kvp-probe")], capture_output=True,
                           text=True).stdout
    print(next((ln for ln in probe.splitlines()
                if ln.startswith("page first touch")), "no probe line"))
    print(f"attention code path: {kvpager.simd_name()}")
    if a.only != "scan":
        py, cc, lpy, lc = attention(a)
        print(f"attention {a.preset} {a.context} tokens: a step through "
              f"Python {py * 1e3:.2f} ms, the C call {cc * 1e3:.2f} ms "
              f"({py / cc:.3f}x); one layer (medians), Attention() "
              f"{lpy * 1e3:.2f} ms, bare kvp_attn_decode {lc * 1e3:.2f} ms "
              f"({lpy / lc:.3f}x); {load()}")
    if a.only != "attention":
        with tempfile.NamedTemporaryFile(dir=a.dir) as f:
            write_file(f.name, 4 * a.budget)
            c, py = [], []
            for _ in range(a.repeat):
                c.append(scan_c(a))
                py.append(scan_py(a, f.name))
        cg, pg = statistics.median(c), statistics.median(py)
        print(f"scan {4 * a.budget >> 20} MiB, budget {a.budget >> 20} MiB, "
              f"blocks {a.block >> 10} KiB: C {cg:.3f} GB/s, Python "
              f"{pg:.3f} GB/s ({pg / cg:.3f}x); runs C "
              f"{' '.join(f'{x:.3f}' for x in c)}, Python "
              f"{' '.join(f'{x:.3f}' for x in py)}; {load()}")


if __name__ == "__main__":
    sys.exit(main())
