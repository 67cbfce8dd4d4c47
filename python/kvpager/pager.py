"""The paging engine: a Pager, its Regions viewed as numpy arrays, their
Stores, and prefetches (pager/pager.h, pager/store.h).

Lifetimes follow the C contracts: a Region keeps its Pager and its Store
alive; closing a Pager closes its regions first (writing their dirty blocks
back); a Region refuses to close while a numpy array still views it, as
Python's mmap refuses with exported buffers, because its memory is unmapped
on close and the array would point at nothing.
"""

from __future__ import annotations

import ctypes
import errno
import math
import os
import time
import weakref
from ctypes import byref, c_char_p, c_uint64, c_void_p
from typing import Iterable, Sequence

import numpy as np

from . import _abi
from ._native import (BlockInfo, Config, FaultPlan, Handle, KvpagerError,
                      RegionOpts, Stats, TunableTarget, Viewed, as_dict, busy,
                      check, closed, invalid, lib, view)

ERR_MAX = 512  # KVP_TUNABLE_ERR_MAX
WAIT_SLICE_S = 0.1  # Prefetch.wait's longest C call: Ctrl-C's latency
PAGER = 0  # enum kvp_tunable_owner
KV = 1


def u64(call: str, what: str, value, bits: int = 64) -> int:
    """@value as a C uint64_t (uint32_t with @bits 32), refused (EINVAL)
    when outside 0..2^bits-1: ctypes would keep its low bits, so that
    2**64 + 16M asked for 16M without a word.  Other types go on to
    ctypes' TypeError."""
    if isinstance(value, (int, np.integer)) and \
            not 0 <= int(value) < 1 << bits:
        raise invalid(call, f"{what}: {value} is out of range (0 to "
                      f"2^{bits}-1)")
    return value


def fspath(call: str, what: str, path) -> bytes:
    """A path (str, bytes or os.PathLike such as pathlib.Path) for C;
    TypeError naming the argument otherwise."""
    try:
        return os.fsencode(path)
    except TypeError:
        raise TypeError(f"{call}: {what} must be a path (str, bytes or "
                        f"os.PathLike), not {type(path).__name__}") from None


def integer(call: str, what: str, value) -> int:
    """@value as an int; TypeError naming the argument for a float, a
    string...  (ctypes said only "argument 2: wrong type")."""
    if isinstance(value, (int, np.integer)):
        return int(value)
    raise TypeError(f"{call}: {what} must be an integer, not "
                    f"{type(value).__name__}")


def apply_tunables(call: str, target: TunableTarget, values: dict,
                   owners: Sequence[int]) -> None:
    """Set each name=value of @values in @target through the C registry
    (its ranges, choices and messages).  A value is an int, a bool or the
    text the registry parses ("512M", "lowrank").  Raises KvpagerError
    (EINVAL) naming the tunable; @target may be partly changed then, so
    the caller works on a scratch copy."""
    err = ctypes.create_string_buffer(ERR_MAX)
    for name, value in values.items():
        t = lib.kvp_tunable_find(name.encode())
        if not t:
            raise invalid(call, f"'{name}' is not a tunable "
                          f"(kvpctl list shows them)")
        if t.contents.owner not in owners:
            where = "KVCache" if t.contents.owner == KV else "Pager"
            raise invalid(call, f"'{name}' is a tunable of {where}, "
                          f"not of this call")
        if isinstance(value, str):
            v = c_uint64()
            check(lib.kvp_tunable_parse(t, value.encode(), byref(v), err,
                                        ERR_MAX), call, err.value.decode())
            v = v.value
        elif isinstance(value, (bool, int, np.integer)) and \
                0 <= value < 1 << 64:
            v = int(value)
        else:
            raise invalid(call, f"{name}: {value!r} is not a value "
                          f"(an unsigned integer or its text form)")
        check(lib.kvp_tunable_set(byref(target), t, v, err, ERR_MAX), call,
              err.value.decode())


def stats_dict(st: Stats) -> dict:
    """struct kvp_stats as a dict: every statistic by its name (counters
    end in _total), io_latency_us, the read latency histogram (bucket
    i counts I/Os of 2^i to 2^(i+1) microseconds), and io_latency_sum_ns,
    the latencies summed."""
    return as_dict(st)


class Store(Handle):
    """Where a region's blocks live when they are not resident.

    Made by the class methods: ``Store.temp`` (an unlinked file, the
    default of a region), ``Store.file``, ``Store.memory`` and
    ``Store.faulty`` (injects failures, for tests of error paths).  A store
    must outlive the regions that use it: close() raises EBUSY while one
    is open.  A context manager.
    """

    def __init__(self, handle: int, desc: str, inner: "Store | None" = None):
        self._h = handle
        self._inner = inner  # a faulty store's backing, kept alive
        self._users = 0  # open regions on it
        self._claims = {}  # Region -> (first, end) byte range it uses
        self.desc = desc

    @classmethod
    def temp(cls, size: int, directory: str | None = None) -> "Store":
        """An anonymous file of @size bytes in @directory ($TMPDIR or /tmp
        when None), unlinked at once, read with io_uring and O_DIRECT."""
        h = c_void_p()
        d = fspath("Store.temp", "directory", directory) \
            if directory else None
        u64("Store.temp", "size", size)
        check(lib.kvp_store_file_temp(d, int(size), byref(h)),
              "kvp_store_file_temp", f"{size} bytes in {directory or '$TMPDIR'}")
        return cls(h.value, f"temporary file in {directory or '$TMPDIR'}")

    @classmethod
    def file(cls, path: str, size: int = 0, *, create: bool = True,
             truncate: bool = False) -> "Store":
        """The file @path (created if @create), extended to @size bytes
        (0: its size); @truncate drops what it held."""
        flags = (_abi.STORE_CREATE if create else 0) | \
            (_abi.STORE_TRUNCATE if truncate else 0)
        h = c_void_p()
        u64("Store.file", "size", size)
        check(lib.kvp_store_file_open(fspath("Store.file", "path", path),
                                      int(size), flags, byref(h)),
              "kvp_store_file_open", os.fsdecode(path))
        return cls(h.value, f"file {path}")

    @classmethod
    def memory(cls, size: int) -> "Store":
        """A store in anonymous memory (tests, a RAM tier)."""
        h = c_void_p()
        u64("Store.memory", "size", size)
        check(lib.kvp_store_memory_create(int(size), byref(h)),
              "kvp_store_memory_create")
        return cls(h.value, "memory")

    @classmethod
    def faulty(cls, inner: "Store", *, read_fail: tuple[int, int] = (0, 0),
               read_errno: int = errno.EIO, write_errno: int = 0,
               write_fail_after: int = 0, delay_us: int = 0) -> "Store":
        """A store over @inner that fails reads overlapping the byte range
        read_fail = (offset, length) with read_errno (0: a short read),
        writes with write_errno after write_fail_after bytes, and delays
        every I/O by delay_us.  For tests of the error paths."""
        h = c_void_p()
        check(lib.kvp_store_faulty_create(inner._handle(), byref(h)),
              "kvp_store_faulty_create")
        s = cls(h.value, f"faulty over {inner.desc}", inner)
        inner._users += 1
        plan = FaultPlan(read_fail[0], read_fail[1], read_errno, write_errno,
                         write_fail_after, delay_us)
        try:
            check(lib.kvp_store_faulty_set(h, byref(plan)),
                  "kvp_store_faulty_set")
        except KvpagerError:
            s.close()
            raise
        return s

    def _root(self) -> "Store":
        """The store that holds the bytes (a faulty store's inner one)."""
        return self._inner._root() if self._inner else self

    def _claim(self, offset: int, size: int,
               call: str = "Pager.region") -> tuple:
        """The byte range a new region would use, EBUSY if an open
        region uses part of it: each would read the other's writes."""
        lo, hi = offset, offset + size
        for r, (a, b) in self._root()._claims.items():
            if lo < b and a < hi:
                raise busy(call, f"bytes [{lo}, {hi}) of store "
                           f"{self.desc} overlap [{a}, {b}) of region "
                           f"{r.name}: two regions on the same bytes read "
                           f"each other's writes; give another "
                           f"store_offset, or close {r.name} first")
        return lo, hi

    def _handle(self) -> int:
        if not self._h:
            raise closed("Store", "the store is closed")
        return self._h

    def close(self) -> None:
        """Destroy the store (its blocks vanish if it is temporary).
        EBUSY while a region (or a faulty store) still uses it."""
        if not self._h:
            return
        if self._users:
            raise busy("Store.close",
                       f"{self._users} regions or stores still use "
                       f"it: close them first")
        lib.kvp_store_destroy(self._h)
        self._h = None
        if self._inner:
            self._inner._users -= 1
            self._inner = None




class Prefetch(Handle):
    """An asynchronous prefault of some blocks of a region
    (kvp_prefetch_submit).  Poll with ``done``, wait with ``wait()``; a
    context manager that releases the handle (cancelling what was not yet
    submitted)."""

    def __init__(self, region: "Region", handle: int):
        self._region = region  # the region outlives its prefetches
        self._parent = region
        self._h = handle

    @property
    def done(self) -> bool:
        """True once every block is installed, failed, cancelled or given
        up (no frame within the budget, or dropped: left to faults)."""
        with self._call() as h:
            return bool(lib.kvp_prefetch_done(h))

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until done, at most @timeout seconds (None or inf: for
        ever; negative: 0).  True when done, False on timeout (like
        threading.Event.wait); raises KvpagerError(EIO) if a block failed
        to load (it is poisoned: reading it through the region is
        SIGBUS).  Ctrl-C interrupts it (KeyboardInterrupt; the prefetch
        goes on)."""
        if timeout is not None and (not isinstance(
                timeout, (int, float, np.integer, np.floating)) or
                math.isnan(timeout)):
            raise invalid("Prefetch.wait", f"timeout {timeout!r} is not a "
                          f"number of seconds (or None: for ever)")
        end = None if timeout is None or math.isinf(timeout) else \
            time.monotonic() + max(0.0, float(timeout))
        while True:
            # In slices: Python runs signal handlers (Ctrl-C) only between
            # C calls, and a long slice would hold them off.
            left = WAIT_SLICE_S if end is None else \
                min(WAIT_SLICE_S, max(0.0, end - time.monotonic()))
            with self._call() as h:
                rc = lib.kvp_prefetch_wait(h, int(left * 1000))
            if rc != -errno.ETIMEDOUT:
                break
            if end is not None and time.monotonic() >= end:
                return False
        check(rc, "kvp_prefetch_wait", f"region {self._region.name}")
        return True

    def cancel(self) -> None:
        """Drop the blocks not yet submitted; those in flight complete."""
        with self._call() as h:
            check(lib.kvp_prefetch_cancel(h), "kvp_prefetch_cancel")

    def close(self) -> None:
        """Release the handle (cancels first if not done).  EBUSY while
        another thread waits on it."""
        h = self._take("Prefetch.close", f"a prefetch of region "
                       f"{self._region.name}")
        if h:
            lib.kvp_prefetch_release(h)
            self._region._prefetches.discard(self)
            self._region._release()


    def _live(self) -> int:
        if not self._h:
            raise closed("Prefetch",
                         "the prefetch was released")
        return self._h




BLOCK_STATES = ("absent", "loading", "resident", "evicting", "poisoned")
ADVICE = {"cold": 0, "discard": 1}  # enum kvp_advice


class Region(Handle, Viewed):
    """Virtual memory served by the pager from a store: made by
    Pager.region().  ``array()`` views it as a numpy array, in place: a
    read faults the block in as any access from C would, a write dirties
    it.  A block whose load failed is poisoned, and touching it through
    an array raises SIGBUS in the process (not an exception: Python cannot
    recover from it; see the README); ``block_info`` tells, without
    touching it.  A context manager."""

    def __init__(self, pager: "Pager", handle: int, store: Store,
                 own_store: bool):
        self.pager = pager
        self._parent = pager
        self.store = store
        self._h = handle
        self._own_store = own_store  # made by Pager.region, closed with it
        self._prefetches = weakref.WeakSet()
        self.addr = lib.kvp_region_addr(handle)
        self.size = lib.kvp_region_size(handle)
        self.block_bytes = lib.kvp_region_block_bytes(handle)
        self.name = lib.kvp_region_name(handle).decode()
        self.nblocks = self.size // self.block_bytes

    @property
    def install_mode(self) -> str:
        """"move" or "copy": how loaded blocks enter the region."""
        with self._call() as h:
            return lib.kvp_region_install_mode(h).decode()

    def _live(self) -> int:
        if not self._h:
            raise closed("Region",
                         f"region {self.name} is closed")
        return self._h

    def array(self, dtype=np.uint8, shape: int | tuple | None = None,
              offset: int = 0) -> np.ndarray:
        """A numpy array viewing the region's memory from byte @offset
        (zero copy), of @dtype and @shape (None: as many elements as fit
        to the end).  The region cannot be closed while the array (or a
        view of it) lives."""
        call = "Region.array"
        dt = np.dtype(dtype)
        if not dt.itemsize or dt.hasobject:
            raise invalid(call, f"{dt} cannot view memory (elements of no "
                          f"size, or Python objects)")
        offset = integer(call, "offset", offset)
        if not 0 <= offset <= self.size:
            raise invalid(call, f"offset {offset} is not within the "
                          f"region's {self.size} bytes")
        if shape is None:
            shape = ((self.size - offset) // dt.itemsize,)
        elif isinstance(shape, (int, np.integer)):
            shape = (int(shape),)
        if not isinstance(shape, (tuple, list)):
            raise TypeError(f"{call}: shape must be an integer or a tuple "
                            f"of them, not {type(shape).__name__}")
        shape = tuple(integer(call, "shape", d) for d in shape)
        if any(d < 0 for d in shape):
            raise invalid(call, f"shape {shape} has a negative dimension")
        nbytes = math.prod(shape) * dt.itemsize  # Python ints: no overflow
        if offset % dt.alignment or offset + nbytes > self.size:
            raise invalid("Region.array", f"{nbytes} bytes at offset "
                          f"{offset} do not fit the region's {self.size} "
                          f"(or the offset is misaligned for {dt})")
        with self._lock:  # not closed between the check and the count
            self._live()
            return view(self, self.addr + offset, nbytes, dt, shape)

    def _blocks(self, call: str, first: int, n: int) -> None:
        first = integer(call, "the block number", first)
        n = integer(call, "the number of blocks", n)
        if first < 0 or n < 1 or first + n > self.nblocks:
            raise invalid(call, f"blocks [{first}, {first + n}) are not "
                          f"within the region's {self.nblocks}")

    def flush(self) -> None:
        """Write every dirty block back (they stay resident)."""
        with self._call() as h:
            check(lib.kvp_region_flush(h), "kvp_region_flush",
                  f"region {self.name}")

    def pin(self, first: int, n: int = 1) -> None:
        """Keep blocks [first, first+n) resident (pins nest).  ENOSPC if
        more than the budget would be pinned (then nothing is)."""
        self._blocks("Region.pin", first, n)
        with self._call() as h:
            check(lib.kvp_region_pin(h, first, n), "kvp_region_pin",
                  f"blocks [{first}, {first + n}) of region {self.name}")

    def unpin(self, first: int, n: int = 1) -> None:
        """Drop one pin of each of blocks [first, first+n)."""
        self._blocks("Region.unpin", first, n)
        with self._call() as h:
            check(lib.kvp_region_unpin(h, first, n), "kvp_region_unpin",
                  f"blocks [{first}, {first + n}) of region {self.name}")

    def advise(self, first: int, n: int = 1, advice: str = "cold") -> None:
        """A hint over blocks [first, first+n): "cold" (evict these
        next) or "discard" (drop their contents without write-back: they
        read back as zeros)."""
        self._blocks("Region.advise", first, n)
        if advice not in ADVICE:
            raise invalid("Region.advise", f"'{advice}' is not an advice; "
                          f"accepted: cold discard")
        with self._call() as h:
            check(lib.kvp_region_advise(h, first, n, ADVICE[advice]),
                  "kvp_region_advise", f"{advice} on region {self.name}")

    def prefetch(self, blocks: Iterable[int] | np.ndarray) -> Prefetch:
        """Start loading @blocks (block numbers) asynchronously; returns
        the Prefetch to poll or wait on.  A uint64 numpy array is passed
        as it is, without a copy."""
        b = np.asarray(blocks)
        if b.ndim != 1 or not b.size or b.dtype.kind not in "iu" or \
                (b.dtype.kind == "i" and b.min() < 0):
            raise invalid("Region.prefetch", "blocks must be a non-empty "
                          "list of block numbers")
        b = np.ascontiguousarray(b, dtype=np.uint64)
        if int(b.max()) >= self.nblocks:
            raise invalid("Region.prefetch", f"block {int(b.max())} is past "
                          f"the region's {self.nblocks}")
        h = c_void_p()
        with self._call() as rh:
            check(lib.kvp_prefetch_submit(
                rh, b.ctypes.data_as(ctypes.POINTER(c_uint64)), b.size,
                byref(h)), "kvp_prefetch_submit", f"region {self.name}")
            pf = Prefetch(self, h.value)
            self._prefetches.add(pf)
            self._adopt()
        return pf

    def block_info(self, block: int) -> dict:
        """A block's state without faulting it in: state ("absent",
        "loading", "resident", "evicting", "poisoned"), dirty, in_store,
        staged (loading: read ahead and read, kept until asked for), pins,
        last_use."""
        self._blocks("Region.block_info", block, 1)
        bi = BlockInfo()
        with self._call() as h:
            check(lib.kvp_region_block_info(h, block, byref(bi)),
                  "kvp_region_block_info")
        d = as_dict(bi)
        d["state"] = BLOCK_STATES[bi.state]
        return d

    def peek(self, block: int) -> np.ndarray:
        """A copy of a block's bytes, from its frame or its store, without
        changing its state (no fault, no load into the region)."""
        self._blocks("Region.peek", block, 1)
        out = np.empty(self.block_bytes, dtype=np.uint8)
        with self._call() as h:
            check(lib.kvp_region_peek(h, block, out.ctypes.data),
                  "kvp_region_peek", f"block {block} of region {self.name}")
        return out

    def stats(self) -> dict:
        """The region's statistics (see Pager.stats)."""
        st = Stats()
        with self._call() as h:
            lib.kvp_region_stats(h, byref(st))
        return stats_dict(st)

    def close(self) -> None:
        """Write the dirty blocks back, unregister and unmap.  EBUSY
        while numpy arrays view the region (delete them first); EIO if a
        write-back failed (the region is closed anyway: data was lost).
        EBUSY while a call on it (a flush, a prefetch's wait) runs in
        another thread."""
        h = self._take("Region.close", f"region {self.name}")
        if not h:
            return
        for pf in list(self._prefetches):
            pf.close()
        rc = lib.kvp_region_destroy(h)
        self.pager._children.discard(self)
        self.store._root()._claims.pop(self, None)
        self.store._users -= 1
        if self._own_store:
            self.store.close()
        self.pager._release()
        check(rc, "kvp_region_destroy", f"region {self.name}")




class _Pending:
    """A store range's claim while its region is being created."""

    def __init__(self, name: str):
        self.name = name


class Pager(Handle):
    """A pager: one userfaultfd, its service threads and a frame pool of
    @budget bytes (an int or text such as "512M"; None: the default 1 GiB),
    serving regions from stores.  @directory is where regions' temporary
    backing files go (None: $TMPDIR or /tmp).  Every engine tunable
    (``kvpctl list``, pager/config.h) is a keyword argument, as a number or
    its text: ``Pager(budget="256M", service_threads=2,
    install_mode="copy")``.  A context manager; close() closes the
    regions still open, writing their dirty blocks back."""

    def __init__(self, budget: int | str | None = None,
                 directory: str | None = None, **tunables):
        cfg = Config()
        lib.kvp_config_defaults(byref(cfg))
        if budget is not None:
            tunables = {"ram_budget_bytes": budget, **tunables}
        apply_tunables("Pager", TunableTarget(ctypes.pointer(cfg), None),
                       tunables, (PAGER,))
        h = c_void_p()
        check(lib.kvp_pager_open(byref(cfg), byref(h)), "kvp_pager_open")
        self._h = h.value
        self.directory = directory
        self._children = weakref.WeakSet()  # regions and KV caches

    def _live(self) -> int:
        if not self._h:
            raise closed("Pager", "the pager is closed")
        return self._h

    @property
    def uffd_mode(self) -> str:
        """"full" or "user-mode-only" (kernel-side accesses such as
        read(2) into a missing page then fail with EFAULT)."""
        with self._call() as h:
            return lib.kvp_pager_uffd_mode(h).decode()

    def config(self) -> dict:
        """The engine tunables in force, by name."""
        cfg = Config()
        with self._call() as h:
            lib.kvp_pager_config(h, byref(cfg))
        return as_dict(cfg)

    def reconfigure(self, **tunables) -> None:
        """Change runtime tunables of the live pager (ram_budget_bytes,
        readahead_bytes, ...).  EINVAL naming the tunable if one may not
        change live or is out of range, EBUSY if more is pinned than a new
        budget; nothing changes then."""
        cfg = Config()
        bad = c_char_p()
        with self._call() as h:
            lib.kvp_pager_config(h, byref(cfg))
            apply_tunables("Pager.reconfigure",
                           TunableTarget(ctypes.pointer(cfg), None),
                           tunables, (PAGER,))
            rc = lib.kvp_pager_reconfigure(h, byref(cfg), byref(bad))
        check(rc, "kvp_pager_reconfigure",
              f"{bad.value.decode()} cannot change on a live pager"
              if bad.value else None)

    def stats(self) -> dict:
        """Totals over all regions, destroyed ones included: every
        statistic of pager/stats.h by name (counters end in _total, the
        rest are gauges), io_latency_us, the read latency histogram
        (bucket i: I/Os of 2^i to 2^(i+1) microseconds), and
        io_latency_sum_ns, the latencies summed."""
        st = Stats()
        with self._call() as h:
            lib.kvp_pager_stats(h, byref(st))
        return stats_dict(st)

    def region(self, size: int, *, block_bytes: int = 64 << 10,
               name: str | None = None, store: Store | None = None,
               store_offset: int = 0, from_store: bool = False) -> Region:
        """A region of @size bytes (a multiple of @block_bytes, a power of
        two from 4 KiB) named @name (unique; None: "region<N>").  Its
        blocks live in @store from @store_offset (None: a temporary file
        in the pager's directory, closed with the region).  @from_store:
        the store holds the initial contents; else the region starts as
        zeros.  EINVAL (sizes), EEXIST (name taken), ENOMEM, ENOSPC (no
        room for the temporary file)."""
        for what, v in (("size", size), ("block_bytes", block_bytes),
                        ("store_offset", store_offset)):
            u64("Pager.region", what, v)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"Pager.region: name must be a str, not "
                            f"{type(name).__name__}")
        own = store is None
        if own:
            store = Store.temp(size + store_offset, self.directory)
        opts = RegionOpts(name.encode() if name else None, size, block_bytes,
                          store._handle(), store_offset,
                          _abi.REGION_FROM_STORE if from_store else 0)
        h = c_void_p()
        claims = store._root()._claims
        # The range is reserved before the C call, which runs without the
        # lock: a region created meanwhile on the same bytes is refused.
        pending = _Pending(name or "being created")
        try:
            with self._lock:
                claims[pending] = store._claim(store_offset, size)
            with self._call() as ph:
                rc = lib.kvp_region_create(ph, byref(opts), byref(h))
                if rc >= 0:
                    store._users += 1
                    r = Region(self, h.value, store, own)
                    self._children.add(r)
                    self._adopt()
                    with self._lock:
                        claims[r] = claims[pending]
        except KvpagerError:
            if own:
                store.close()
            raise
        finally:
            with self._lock:
                claims.pop(pending, None)
        if rc < 0 and own:
            store.close()
        check(rc, "kvp_region_create", f"{size} bytes in blocks of "
              f"{block_bytes}" + (f" named {name}" if name else ""))
        return r

    def close(self) -> None:
        """Close every region still open (writing dirty blocks back), stop
        the threads and free the pool.  EBUSY, with nothing closed, while
        numpy arrays view one of the regions, or while a call on it or
        one of its regions runs in another thread; the first write-back
        error is raised after everything is closed."""
        with self._lock:
            if not self._h:
                return
            if self._busy:
                raise busy("Pager.close",
                           "a call on the pager or one of its "
                           "regions is in progress (another "
                           "thread's, or a callback's within "
                           "it): close it once that call has "
                           "returned")
            for r in self._children:
                r._refuse_if_viewed("Pager.close", f"{r.name}")
            # Closed from here: no call on a region of it can start.
            h, self._h = self._h, None
        first = None
        for r in list(self._children):
            try:
                r.close()
            except KvpagerError as e:
                first = first or e
        lib.kvp_pager_close(h)
        if first:
            raise first


