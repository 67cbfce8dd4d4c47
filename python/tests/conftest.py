"""Shared fixtures.  Run by tests/t_python.sh with PYTHONPATH=$BUILD/python,
so that `import kvpager` is the package built next to its library."""

import os
import random
import shutil
import socket
import subprocess
import sys
import time

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


def port_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port():
    """From 20000..29999, below the kernel's ephemeral range (no client
    takes it meanwhile), as tests/helpers/redis_fx.c picks them."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(1000):
        p = rng.randrange(20000, 30000)
        if port_free(p):
            return p
    pytest.fail("no free loopback port in 20000..29999")


def ping(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture
def redis(tmp_path):
    """A redis-server of this test's own: its URL; killed at the end."""
    exe = shutil.which("redis-server")
    if not exe:
        pytest.skip("redis-server not found (make installs it: apt-get "
                    "install redis-server)")
    for _ in range(5):  # a port taken between the check and the bind
        port = free_port()
        d = tmp_path / f"redis-{port}"
        d.mkdir()
        srv = subprocess.Popen(
            [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir",
             str(d), "--save", "", "--appendonly", "no",
             "--protected-mode", "no", "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120  # a loaded machine
        while srv.poll() is None and time.monotonic() < deadline and \
                not ping(port):
            time.sleep(0.05)
        if srv.poll() is None and ping(port):
            break
        srv.kill()
        srv.wait()
    else:
        pytest.fail("redis-server would not start")
    # generous limits: under load a slow reply must not be taken for a
    # dead server (a miss), which would fail a test that expects a hit
    yield (f"redis://127.0.0.1:{port}?timeout_ms=30000&"
           f"connect_timeout_ms=30000")
    srv.kill()
    srv.wait()
