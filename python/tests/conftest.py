"""Shared fixtures.  Run by tests/t_python.sh with PYTHONPATH=$BUILD/python,
so that `import kvpager` is the package built next to its library."""

import os
import subprocess
import sys

import pytest

import kvpager

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(ROOT, os.environ.get("BUILD", "build"))
MODEL = os.path.join(ROOT, "..", "shared", "models", "stories260K.bin")


@pytest.fixture
def pager():
    """A pager with a small budget (4 MiB), so that regions of a few MiB
    evict and reload."""
    with kvpager.Pager(budget="4M", pool_prefault_bytes=0) as p:
        yield p


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """@code in a fresh interpreter with this one's import path."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, "-c", code], env=env,
                          capture_output=True, text=True, timeout=timeout)
