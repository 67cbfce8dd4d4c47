"""python/bench.py runs as its docstring says, from the source tree with
PYTHONPATH=$BUILD/python, and prints its figures (no timing is judged
here: the figures belong to the README, measured on a quiet machine)."""

import os
import subprocess
import sys

from conftest import ROOT


def test_bench_runs_and_prints_both_ratios(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    res = subprocess.run(
        [sys.executable, os.path.join(ROOT, "python", "bench.py"),
         "--preset", "tiny", "--context", "4096", "--steps", "2",
         "--budget", str(16 << 20), "--repeat", "1", "--dir",
         str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert out.startswith("page first touch")
    assert "attention tiny 4096 tokens: a step through Python" in out
    assert "scan 64 MiB, budget 16 MiB" in out and "x); runs C" in out
    assert out.count("load average") == 2
