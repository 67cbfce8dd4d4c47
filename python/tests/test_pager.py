"""Pager, Region, Store and Prefetch: data through numpy views, the budget,
hints, statistics, and every refusal as a KvpagerError with its errno."""

import errno
import os

import numpy as np
import pytest

import kvpager
from kvpager import KvpagerError
from conftest import run_python

MiB = 1 << 20


def test_region_round_trip_beyond_budget(pager):
    """16 MiB written through a numpy view under a 4 MiB budget: the dirty
    blocks are written back on eviction and read back intact."""
    with pager.region(16 * MiB, block_bytes=64 << 10, name="rt") as r:
        a = r.array(np.uint32)
        a[:] = np.arange(a.size, dtype=np.uint32) * 2654435761
        st = r.stats()
        assert st["evictions_dirty_total"] > 0
        assert pager.stats()["resident_bytes"] <= 4 * MiB
        assert np.array_equal(a, np.arange(a.size, dtype=np.uint32)
                              * 2654435761)
        assert r.stats()["demand_faults_total"] > st["demand_faults_total"]
        del a


def test_array_is_a_view_not_a_copy(pager):
    with pager.region(MiB, block_bytes=4096) as r:
        a = r.array(np.uint8)
        b = r.array(np.float64, shape=(2, 8), offset=4096)
        assert a.ctypes.data == r.addr
        assert b.ctypes.data == r.addr + 4096
        b[1, 0] = 1.5
        assert a[4096 + 64:4096 + 72].view(np.float64)[0] == 1.5
        del a, b


@pytest.mark.parametrize("shape,offset", [((MiB + 1,), 0), (None, -8),
                                          ((4,), 3)])
def test_array_outside_region_refused(pager, shape, offset):
    with pager.region(MiB, block_bytes=4096) as r:
        with pytest.raises(KvpagerError) as e:
            r.array(np.uint16 if offset == 3 else np.uint8, shape=shape,
                    offset=offset)
        assert e.value.errno == errno.EINVAL


def test_close_with_live_view_is_refused(pager):
    r = pager.region(MiB, block_bytes=4096, name="viewed")
    a = r.array()
    with pytest.raises(KvpagerError) as e:
        r.close()
    assert e.value.errno == errno.EBUSY and "viewed" in str(e.value)
    with pytest.raises(KvpagerError) as e:
        pager.close()
    assert e.value.errno == errno.EBUSY
    a[0] = 7  # still mapped: the refusal changed nothing
    assert r.array(shape=1)[0] == 7
    del a
    r.close()
    with pytest.raises(KvpagerError) as e:
        r.array()
    assert e.value.errno == errno.EBADF


def test_prefetch_wait_and_poll(pager):
    with pager.region(8 * MiB, block_bytes=256 << 10) as r:
        with r.prefetch(np.arange(8, dtype=np.uint64)) as pf:
            assert pf.wait(timeout=60) is True
            assert pf.done
        assert all(r.block_info(b)["state"] == "resident" for b in range(8))
        assert r.stats()["prefetch_issued_total"] >= 8


def test_prefetch_timeout_returns_false(pager):
    """A slow store: wait(0) says not done yet, a later wait completes."""
    with kvpager.Store.memory(MiB) as inner, \
            kvpager.Store.faulty(inner, delay_us=300_000) as slow:
        with pager.region(MiB, block_bytes=4096, store=slow,
                          from_store=True) as r:
            pf = r.prefetch([5])
            assert pf.wait(timeout=0) is False
            assert not pf.done
            assert pf.wait() is True
            pf.close()
            with pytest.raises(KvpagerError) as e:
                pf.wait()
            assert e.value.errno == errno.EBADF


@pytest.mark.parametrize("blocks", [[], [16], [-1]])
def test_prefetch_bad_blocks_refused(pager, blocks):
    with pager.region(MiB, block_bytes=64 << 10) as r:
        with pytest.raises(KvpagerError) as e:
            r.prefetch(blocks)
        assert e.value.errno == errno.EINVAL


def test_pin_and_advise(pager):
    with pager.region(2 * MiB, block_bytes=64 << 10) as r:
        a = r.array()
        a[:] = 1
        r.pin(0, 2)
        assert r.block_info(1)["pins"] == 1
        r.unpin(0, 2)
        r.advise(0, 4, "discard")
        assert a[: 4 * (64 << 10)].max() == 0  # discarded: zeros
        assert a[4 * (64 << 10)] == 1
        with pytest.raises(KvpagerError) as e:
            r.advise(0, 1, "hot")
        assert e.value.errno == errno.EINVAL
        with pytest.raises(KvpagerError) as e:
            r.pin(30, 3)
        assert e.value.errno == errno.EINVAL
        with pytest.raises(KvpagerError) as e:
            r.pin(0, 32)  # 2 MiB of pins fit the 4 MiB budget ...
            r.pin(0, 32)  # ... nested pins count once
            big = pager.region(8 * MiB, block_bytes=64 << 10)
            big.pin(0, 128)  # 8 MiB do not
        assert e.value.errno == errno.ENOSPC
        r.unpin(0, 32)
        r.unpin(0, 32)
        big.close()
        del a


def test_peek_does_not_fault(pager):
    with pager.region(MiB, block_bytes=4096) as r:
        a = r.array()
        a[4096:8192] = 9
        r.flush()
        r.advise(1, 1, "cold")
        got = r.peek(1)
        assert got.shape == (4096,) and (got == 9).all()
        assert r.peek(2).max() == 0
        del a


def test_stats_are_dicts_of_every_statistic(pager):
    from kvpager import _abi
    st = pager.stats()
    assert set(st) == {n for n, _ in _abi.STATS} | {"io_latency_us",
                                                    "io_latency_sum_ns"}
    assert len(st["io_latency_us"]) == _abi.LATENCY_BUCKETS
    assert all(isinstance(v, int) for k, v in st.items()
               if k != "io_latency_us")


def test_tunables_as_keywords():
    with kvpager.Pager(budget=8 * MiB, readahead_bytes="1M",
                       install_mode="copy", pool_prefault_bytes=0) as p:
        c = p.config()
        assert c["ram_budget_bytes"] == 8 * MiB
        assert c["readahead_bytes"] == MiB
        assert c["install_mode"] == 2
        with p.region(MiB, block_bytes=4096) as r:
            assert r.install_mode == "copy"
        p.reconfigure(ram_budget_bytes="16M")
        assert p.config()["ram_budget_bytes"] == 16 * MiB
        with pytest.raises(KvpagerError) as e:
            p.reconfigure(io_depth=8)  # not a runtime tunable
        assert e.value.errno == errno.EINVAL and "io_depth" in str(e.value)
        assert p.config()["io_depth"] == 64


@pytest.mark.parametrize("kw,what", [
    ({"budget": "1K"}, "ram_budget_bytes"),
    ({"budget": -1}, "ram_budget_bytes"),
    ({"no_such_knob": 1}, "no_such_knob"),
    ({"install_mode": "fast"}, "install_mode"),
    ({"service_threads": 0}, "service_threads"),
    ({"predictor": "exact"}, "predictor"),  # a KV tunable, not the pager's
])
def test_bad_tunables_refused(kw, what):
    with pytest.raises(KvpagerError) as e:
        kvpager.Pager(**kw)
    assert e.value.errno == errno.EINVAL
    assert what in str(e.value)
    assert e.value.strerror == kvpager.strerror(errno.EINVAL)


@pytest.mark.parametrize("kw,err", [
    ({"size": 4096 * 3 + 1, "block_bytes": 4096}, errno.EINVAL),
    ({"size": 1 << 20, "block_bytes": 3000}, errno.EINVAL),
    ({"size": 1 << 20, "block_bytes": 4096, "name": "dup"}, errno.EEXIST),
])
def test_bad_regions_refused(pager, kw, err):
    with pager.region(1 << 20, block_bytes=4096, name="dup"):
        with pytest.raises(KvpagerError) as e:
            pager.region(**kw)
        assert e.value.errno == err
        assert e.value.call == "kvp_region_create"


def test_file_store_from_store(pager, tmp_path):
    path = str(tmp_path / "kv.bin")
    data = np.random.default_rng(1).integers(0, 255, MiB, dtype=np.uint8)
    data.tofile(path)
    with kvpager.Store.file(path) as st:
        with pager.region(MiB, block_bytes=64 << 10, store=st,
                          from_store=True) as r:
            a = r.array()
            assert np.array_equal(a, data)
            a[:16] = 0
            with pytest.raises(KvpagerError) as e:
                st.close()  # the region still uses it
            assert e.value.errno == errno.EBUSY
            del a
    assert np.fromfile(path, dtype=np.uint8)[:16].max() == 0
    assert np.array_equal(np.fromfile(path, dtype=np.uint8)[16:], data[16:])


def test_store_file_missing_directory():
    with pytest.raises(KvpagerError) as e:
        kvpager.Store.file("/nonexistent-dir/kv.bin", MiB)
    assert e.value.errno == errno.ENOENT
    assert "/nonexistent-dir/kv.bin" in str(e.value)


def test_pager_directory_is_used(tmp_path):
    bad = str(tmp_path / "missing")
    with kvpager.Pager(budget="4M", directory=bad,
                       pool_prefault_bytes=0) as p:
        with pytest.raises(KvpagerError) as e:
            p.region(MiB, block_bytes=4096)
        assert e.value.errno == errno.ENOENT
    os.mkdir(bad)
    with kvpager.Pager(budget="4M", directory=bad,
                       pool_prefault_bytes=0) as p:
        with p.region(MiB, block_bytes=4096) as r:
            assert r.store.desc.endswith(bad)


@pytest.mark.parametrize("make", [
    lambda: kvpager.Pager(budget=(1 << 64) + 16 * MiB,
                          pool_prefault_bytes=0),
    lambda: kvpager.Pager(budget="4M", readahead_bytes=(1 << 64) + 4096,
                          pool_prefault_bytes=0),
    lambda: kvpager.Store.memory((1 << 64) + MiB),
    lambda: kvpager.Store.temp((1 << 64) + MiB),
])
def test_sizes_past_64_bits_refused(make):
    """ctypes keeps an int's low 64 bits: 2**64 + 16M was a 16 MiB budget
    and 2**64 + 1M a 1 MiB store, without a word."""
    with pytest.raises(KvpagerError) as e:
        make().close()
    assert e.value.errno == errno.EINVAL
    assert "is out of range" in str(e.value) or \
        "is not a value" in str(e.value)


def test_region_size_past_64_bits_refused(pager):
    with pytest.raises(KvpagerError) as e:
        pager.region((1 << 64) + MiB, block_bytes=4096).close()
    assert e.value.errno == errno.EINVAL and "size" in str(e.value)
    st = kvpager.Store.memory(MiB)
    with pytest.raises(KvpagerError) as e:
        pager.region((1 << 64) + MiB, block_bytes=4096, store=st).close()
    assert e.value.errno == errno.EINVAL
    st.close()


def test_close_while_another_thread_waits_is_refused(pager):
    """Region.close and Pager.close from one thread while another waits
    in Prefetch.wait (the GIL released in C): closing freed the prefetch
    and the region under the waiter.  Now EBUSY until the wait returns.
    The store delays each read by 2 s, so the wait outlasts the closes;
    the closes start once the waiter has counted its call (_busy: the
    binding's own count; absent before it existed)."""
    import threading
    with kvpager.Store.memory(4 * MiB) as inner, \
            kvpager.Store.faulty(inner, delay_us=2_000_000) as slow:
        r = pager.region(4 * MiB, block_bytes=MiB, store=slow,
                         from_store=True, name="slow")
        pf = r.prefetch([0, 1])
        got = {}
        t = threading.Thread(target=lambda: got.setdefault("wait",
                                                           pf.wait()))
        t.start()
        while not getattr(pf, "_busy", 1):
            pass
        errs = []
        for obj in (pf, r, pager):
            try:
                obj.close()
            except KvpagerError as e:
                errs.append(e.errno)
                assert "in progress" in str(e)
        t.join()
        assert errs == [errno.EBUSY] * 3, "a close went through during wait()"
        assert got["wait"] is True
        r.close()


def test_prefetch_wait_is_interrupted_by_ctrl_c(pager):
    """A KeyboardInterrupt (SIGINT's, here SIGALRM's handler) during a
    long wait comes out of wait() while the prefetch is still loading:
    the wait used to hold it until the prefetch was done."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    with kvpager.Store.memory(MiB) as inner, \
            kvpager.Store.faulty(inner, delay_us=3_000_000) as slow:
        with pager.region(MiB, block_bytes=MiB, store=slow,
                          from_store=True) as r:
            old = signal.signal(signal.SIGALRM, interrupt)
            try:
                with r.prefetch([0]) as pf:
                    signal.setitimer(signal.ITIMER_REAL, 0.2)
                    with pytest.raises(KeyboardInterrupt):
                        pf.wait()
                    assert not pf.done
                    assert pf.wait(timeout=float("inf")) is True
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("timeout", [float("nan"), "1", 2j])
def test_prefetch_wait_bad_timeout_refused(pager, timeout):
    with pager.region(MiB, block_bytes=4096) as r:
        with r.prefetch([0]) as pf:
            with pytest.raises(KvpagerError) as e:
                pf.wait(timeout)
            assert e.value.errno == errno.EINVAL
            assert "is not a number of seconds" in str(e.value)
            assert pf.wait(1e12) is True  # a long timeout, not a wrap


@pytest.mark.parametrize("call", [
    lambda r: r.pin(1.5),
    lambda r: r.block_info("0"),
    lambda r: r.peek(0.0),
    lambda r: r.advise(0, 1.0),
    lambda r: r.array(np.uint8, shape=4.0),
    lambda r: r.array(np.uint8, shape=(2, "2")),
    lambda r: r.array(np.uint8, offset=8.0),
    lambda r: r.pager.region(MiB, block_bytes=4096, name=5),
    lambda r: kvpager.Store.file(5),
])
def test_wrong_types_raise_type_error_naming_the_call(pager, call):
    """README: wrong argument types raise TypeError.  They raised
    AttributeError ('int' object has no attribute 'encode') or ctypes'
    ArgumentError ("argument 2: wrong type"), which is not a TypeError."""
    with pager.region(MiB, block_bytes=4096) as r:
        with pytest.raises(TypeError) as e:
            call(r)
        assert str(e.value).split(":")[0] in ("Region.pin",
                                              "Region.block_info",
                                              "Region.peek",
                                              "Region.advise",
                                              "Region.array",
                                              "Pager.region", "Store.file")


@pytest.mark.parametrize("shape,offset,dtype", [
    ((-1,), 0, np.uint8), ((2, -1), 0, np.uint8), (None, MiB + 8, np.uint8),
    ((4,), 0, "V0"),
])
def test_array_bad_shapes_are_einval(pager, shape, offset, dtype):
    """A negative dimension or an offset past the end was ctypes'
    "Array length must be >= 0"; an empty dtype ZeroDivisionError."""
    with pager.region(MiB, block_bytes=4096) as r:
        with pytest.raises(KvpagerError) as e:
            r.array(dtype, shape=shape, offset=offset)
        assert e.value.errno == errno.EINVAL and e.value.call == "Region.array"


def test_paths_may_be_pathlib(pager, tmp_path):
    with kvpager.Store.file(tmp_path / "kv.bin", MiB) as st:
        assert str(tmp_path) in st.desc
    with kvpager.Pager(budget="4M", directory=tmp_path,
                       pool_prefault_bytes=0) as p:
        with p.region(MiB, block_bytes=4096) as r:
            assert r.store.desc.endswith(str(tmp_path))


def test_binding_refusals_explain_themselves(pager):
    """The binding's own EBUSY and EBADF carried kvp_strerror's text for
    the engine's: "busy: the block is pinned, or more is pinned than the
    new budget" for a region still viewed, "Bad file descriptor" for a
    closed one."""
    r = pager.region(MiB, block_bytes=4096, name="viewed")
    a = r.array()
    with pytest.raises(KvpagerError) as e:
        r.close()
    assert e.value.strerror == "busy: still in use"
    assert "pinned" not in str(e.value)
    assert str(e.value).endswith("delete them first: busy: still in use "
                                 "[EBUSY]")
    del a, e
    r.close()
    with pytest.raises(KvpagerError) as e:
        r.flush()
    assert e.value.errno == errno.EBADF
    assert str(e.value) == "Region: region viewed is closed: not open [EBADF]"


def test_regions_on_overlapping_store_bytes_refused(pager):
    """Two regions on one store at overlapping offsets read each other's
    writes: B's 2s read back as A's 1s where they met.  The second is
    refused (EBUSY, naming the first), through a faulty store over the
    same bytes too; disjoint ranges, and the range once A closes, work."""
    with kvpager.Store.memory(16 * MiB) as st, \
            kvpager.Store.faulty(st) as over:
        a = pager.region(8 * MiB, block_bytes=MiB, store=st, name="A")
        for s in (st, over):
            with pytest.raises(KvpagerError) as e:
                pager.region(8 * MiB, block_bytes=MiB, store=s,
                             store_offset=4 * MiB, name="B").close()
            assert e.value.errno == errno.EBUSY
            assert "overlap [0, 8388608) of region A" in str(e.value)
        with pager.region(8 * MiB, block_bytes=MiB, store=over,
                          store_offset=8 * MiB, name="C") as c:
            x, y = a.array(np.uint32), c.array(np.uint32)
            x[:] = 1
            y[:] = 2
            assert (x == 1).all() and (y == 2).all()
            del x, y
        a.close()
        with pager.region(8 * MiB, block_bytes=MiB, store=st,
                          store_offset=4 * MiB, name="B"):
            pass


@pytest.mark.parametrize("what", ["region", "cache", "prefetch"])
def test_collected_in_a_cycle_with_its_pager(what):
    """A pager, and a region, a KV cache or a prefetch of its, collected
    together as cyclic garbage (a traceback holding them, objects that
    refer to each other): the collector clears the weak sets through
    which the pager finds its regions before any finalizer runs, so the
    pager freed the engine first and the region's finalizer then crashed
    (SIGSEGV) or the cache's hung.  Each is now closed, children first."""
    code = f"""if True:
        import gc, numpy as np, kvpager
        p = kvpager.Pager(budget="8M", pool_prefault_bytes=0)
        if "{what}" == "cache":
            o = kvpager.KVCache(kvpager.KVGeometry.preset("tiny"),
                                capacity_tokens=64, pager=p)
        else:
            o = p.region(4 << 20, block_bytes=1 << 20)
            o.array(np.uint8)[:] = 7
            if "{what}" == "prefetch":
                o = o.prefetch([0, 1, 2, 3])
        o.cycle, p.cycle = (o, p), p
        del o, p
        gc.collect()
        print("collected")
    """
    r = run_python(code, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == "collected\n"
