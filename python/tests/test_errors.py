"""Errors cross cleanly: a failing store surfaces as KvpagerError(EIO), a
poisoned block is SIGBUS in a subprocess (never a hang), and a binding
that disagrees with the C headers refuses to import."""

import errno
import signal

import numpy as np
import pytest

import kvpager
from kvpager import KvpagerError

from conftest import run_python

MiB = 1 << 20


def test_error_carries_errno_and_library_text():
    e = KvpagerError(-errno.ENOSPC, "kvp_store_file_temp", "1 GiB in /x")
    assert isinstance(e, OSError)
    assert e.errno == errno.ENOSPC
    assert e.strerror == kvpager.strerror(errno.ENOSPC)
    assert "backing store is full" in e.strerror
    assert str(e).startswith("kvp_store_file_temp: 1 GiB in /x: no space")
    assert str(e).endswith("[ENOSPC]")


def test_failed_prefetch_raises_eio_and_poisons(pager):
    with kvpager.Store.memory(MiB) as inner, \
            kvpager.Store.faulty(inner, read_fail=(0, 4096)) as bad:
        with pager.region(MiB, block_bytes=4096, store=bad,
                          from_store=True, name="bad") as r:
            with r.prefetch([0, 1]) as pf:
                with pytest.raises(KvpagerError) as e:
                    pf.wait(timeout=60)
            assert e.value.errno == errno.EIO
            assert e.value.call == "kvp_prefetch_wait"
            assert r.block_info(0)["state"] == "poisoned"
            assert r.block_info(1)["state"] == "resident"
            assert pager.stats()["read_errors_total"] >= 1


def test_failed_write_back_raises_eio_on_close(pager):
    with kvpager.Store.memory(MiB) as inner, \
            kvpager.Store.faulty(inner, write_errno=errno.EIO) as bad:
        r = pager.region(MiB, block_bytes=4096, store=bad)
        a = r.array()
        a[:] = 1
        del a
        with pytest.raises(KvpagerError) as e:
            r.close()
        assert e.value.errno == errno.EIO
        with pytest.raises(KvpagerError):
            r.array()  # closed anyway, as the C contract says


def test_poisoned_block_is_sigbus_not_a_hang():
    """Touching a poisoned block through numpy kills the process with
    SIGBUS, like any access from C; the parent sees it, nothing hangs."""
    code = """
import kvpager
with kvpager.Pager(budget="4M", pool_prefault_bytes=0) as p, \\
        kvpager.Store.memory(1 << 20) as inner, \\
        kvpager.Store.faulty(inner, read_fail=(0, 4096)) as bad:
    r = p.region(1 << 20, block_bytes=4096, store=bad, from_store=True)
    a = r.array()
    print("block 1:", a[4096], flush=True)
    print("block 0:", a[0], flush=True)
    print("not reached", flush=True)
"""
    res = run_python(code, timeout=120)
    assert res.returncode == -signal.SIGBUS, res.stdout + res.stderr
    assert "block 1: 0" in res.stdout
    assert "not reached" not in res.stdout


def test_layout_mismatch_refuses_import(monkeypatch):
    from kvpager import _abi, _native
    size, offsets = _abi.LAYOUT["kvp_region_opts"]
    monkeypatch.setitem(_abi.LAYOUT, "kvp_region_opts", (size + 8, offsets))
    with pytest.raises(ImportError) as e:
        _native.check_layouts()
    assert "kvp_region_opts" in str(e.value)


def test_missing_library_is_a_clear_import_error():
    """The package imports without the library (its pure-numpy modules need
    none); the first use of the binding says what was tried."""
    code = "import os; os.environ['KVPAGER_LIBRARY'] = '/nonexistent.so'\n" \
           "import kvpager\nprint('imported', flush=True)\nkvpager.Pager"
    res = run_python(code)
    assert res.stdout == "imported\n"
    assert res.returncode == 1
    assert "ImportError: cannot load libkvpager: tried /nonexistent.so " \
        "(absent)" in res.stderr


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_handles_refuse_copy_and_pickle(how):
    """A copy of a Region (or Pager, Store...) would share its C object
    and free it under the original when collected: the original's next
    array read then crashed the interpreter.  Run in a subprocess so that
    a crash fails the test instead of ending the run."""
    code = f"""
import copy, pickle
import numpy as np
import kvpager
fn = {{"copy": copy.copy, "deepcopy": copy.deepcopy,
      "pickle": pickle.dumps}}["{how}"]
p = kvpager.Pager(budget="4M", pool_prefault_bytes=0)
st = kvpager.Store.memory(1 << 20)
r = p.region(1 << 20, block_bytes=4096)
a = r.array(np.uint32); a[:] = 7; del a
with r.prefetch([0]) as pf:
    objs = [p, st, r, pf]
    for o in objs:
        try:
            c = fn(o)
            del c
        except TypeError as e:
            print("refused:", e)
a = r.array(np.uint32)
print("read", int(a[::1024].sum()), flush=True)
del a
r.close(); st.close(); p.close()
print("closed")
"""
    res = run_python(code, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("refused: cannot ") == 4, res.stdout
    assert "cannot pickle a Region: it owns a C object" in res.stdout or \
        "cannot copy a Region: it owns a C object" in res.stdout
    assert "read 1792\nclosed" in res.stdout
