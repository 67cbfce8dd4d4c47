"""The C side of the binding: libkvpager loaded with ctypes, its structures,
its prototypes, and the one place where a C return code becomes an exception.

ctypes rather than cffi: nothing to compile when the package is installed
(it is plain Python next to libkvpager.so), no python3-dev or C compiler on
the user's machine, and the calls the hot path makes (attention over a
layer, a decode step, a prefetch) each do milliseconds of work against
about a microsecond of ctypes overhead.  The data never crosses by copy:
numpy arrays are passed by pointer and regions are viewed in place.

The structures below are written by hand; _abi.py (generated from the C
headers by python/gen_abi.c at build time) holds their sizes and offsets as
the compiler sees them, and check_layouts() compares the two at import.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno as _errno
import os
import threading
from ctypes import (POINTER, Structure, c_bool, c_char, c_char_p, c_double,
                    c_float, c_int, c_size_t, c_uint, c_uint32, c_uint64,
                    c_void_p)

from . import _abi

u32p = POINTER(c_uint32)
u64p = POINTER(c_uint64)
floatp = POINTER(c_float)


class KvpagerError(OSError):
    """A kvpager call failed.

    ``errno`` is the error number (``errno.EINVAL``, ``errno.EIO``, ...),
    ``strerror`` the library's explanation with its remedy (kvp_strerror;
    for the binding's own EBUSY and EBADF, which kvp_strerror explains
    as the engine's, "busy: still in use" and "not open"),
    ``call`` the C function or binding method that failed, and ``detail``
    what exactly was refused, when known (a tunable's message, the bad
    argument).  A subclass of OSError, so ``except OSError`` catches it.
    """

    def __init__(self, err: int, call: str, detail: str | None = None,
                 text: str | None = None):
        err = abs(err)
        super().__init__(err, text or strerror(err))
        self.call = call
        self.detail = detail

    def __str__(self) -> str:
        what = f"{self.call}: {self.detail}" if self.detail else self.call
        name = _errno.errorcode.get(self.errno, str(self.errno))
        return f"{what}: {self.strerror} [{name}]"

    def __reduce__(self):
        return (type(self), (self.errno, self.call, self.detail,
                             self.strerror))


def busy(call: str, detail: str) -> KvpagerError:
    """The binding refusing to close what is still in use: EBUSY, whose
    kvp_strerror text (pinned blocks) would mislead."""
    return KvpagerError(_errno.EBUSY, call, detail, "busy: still in use")


def closed(call: str, detail: str) -> KvpagerError:
    """A call on a closed object: EBADF, "not open" rather than a file
    descriptor's text."""
    return KvpagerError(_errno.EBADF, call, detail, "not open")


class Handle:
    """The owner of a C object (in _h): a context manager that closes it
    at exit, and at garbage collection quietly (an error there has no one
    to go to; close explicitly to see it).

    ctypes releases the GIL during a C call, so another thread, or a
    callback of the call itself, may close the object meanwhile: freeing
    what the call is using.  A call therefore goes through _call(), which
    counts it in _busy of the object and of its _parent chain (a
    prefetch's region, a region's pager), and close() refuses (EBUSY)
    while _busy is not zero."""

    _h = None
    _busy = 0  # C calls in progress on it or on what it owns
    _parent = None  # the Handle whose C object this one's calls use too
    _lock = threading.RLock()  # _busy and _h changes; a class attribute,
    # so that a close at interpreter exit still finds it

    def _live(self) -> int:
        if not self._h:
            raise closed(type(self).__name__,
                         "it is closed")
        return self._h

    @contextlib.contextmanager
    def _call(self):
        """The live handle, counted busy (with its parents) while the
        with block makes its C call; EBADF if it or a parent is closed."""
        with self._lock:
            h = self._live()
            chain = []
            o = self
            while o is not None:
                o._live()
                chain.append(o)
                o = o._parent
            for o in chain:
                o._busy += 1
        try:
            yield h
        finally:
            with self._lock:
                for o in chain:
                    o._busy -= 1

    def _take(self, call: str, what: str) -> int | None:
        """For close(): the handle, now marked closed (None if it was),
        unless a call is in progress on it (EBUSY) or arrays view it."""
        with self._lock:
            if not self._h:
                return None
            if self._busy:
                raise busy(call,
                           f"{what} is in use by a call in "
                           f"progress (another thread's, or a "
                           f"callback's within it): close it "
                           f"once that call has returned")
            refuse = getattr(self, "_refuse_if_viewed", None)
            if refuse:
                refuse(call, what)
            h, self._h = self._h, None
            return h

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # Children (a pager's regions and caches, a region's prefetches) are
    # found through weak sets, which the garbage collector clears before it
    # runs any finalizer of a cycle: a pager collected with its regions
    # found none to close, freed the engine, and the regions' finalizers
    # then crashed or hung in C.  So each child is also counted here
    # (_adopt, _release); a parent collected while it has children leaves
    # its close to the last of them.
    _kids = 0
    _orphan = False

    def _adopt(self) -> None:
        with self._lock:
            self._kids += 1

    def _release(self) -> None:
        """A child of this object has closed."""
        with self._lock:
            self._kids -= 1
            last = self._orphan and not self._kids
        if last:
            self.__del__()

    def __del__(self):
        with self._lock:
            if self._h and self._kids:
                self._orphan = True
                return
        if self._h:
            try:
                self.close()
            except KvpagerError:
                pass

    # A copy would own the same C object: the first of the two to close
    # (or be collected) frees it under the other, whose next use or close
    # then crashes the interpreter.  Refused, as Python's mmap refuses.
    def __copy__(self):
        raise TypeError(f"cannot copy a {type(self).__name__}: it owns a C "
                        f"object (copy the data, e.g. np.copy(array))")

    def __deepcopy__(self, memo):
        self.__copy__()

    def __reduce_ex__(self, protocol):
        raise TypeError(f"cannot pickle a {type(self).__name__}: it owns a "
                        f"C object (pickle the data, e.g. an array's copy)")


def address(a) -> int:
    """The address of a numpy array's data: what the hot paths pass to C
    (arguments declared c_void_p), at a fraction of the cost of
    a.ctypes.data_as()."""
    return a.__array_interface__["data"][0]


def view(owner, addr: int, nbytes: int, dtype, shape) -> "np.ndarray":
    """A numpy array over @nbytes of C memory at @addr, no copy.  The
    buffer under it holds @owner, so the owner (whose close() frees the
    memory) lives while the array does; owner._views counts the live
    buffers, so that close() can refuse while one is viewed."""
    import weakref

    import numpy as np

    buf = (ctypes.c_char * nbytes).from_address(addr)
    # Shaped before it counts: a failing reshape's traceback holds buf,
    # which must not keep the owner from closing.
    a = np.frombuffer(buf, dtype=dtype).reshape(shape)
    buf.owner = owner
    owner._views += 1
    weakref.finalize(buf, owner._view_gone)
    return a


class Viewed:
    """Mixin of an owner of memory that numpy arrays view (see view())."""

    _views = 0  # buffers under live numpy arrays

    def _view_gone(self) -> None:
        self._views -= 1

    def _refuse_if_viewed(self, call: str, what: str) -> None:
        if self._views:
            raise busy(call,
                       f"{self._views} numpy arrays still view "
                       f"{what}: delete them first")


def _candidates() -> list[str]:
    """Where libkvpager may be, in the order tried (see load())."""
    env = os.environ.get("KVPAGER_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    found = [os.path.join(here, "..", "..", "lib", "libkvpager.so.0")]
    try:
        from . import _installed  # written by `make install`
        found.append(os.path.join(_installed.LIBDIR, "libkvpager.so.0"))
    except ImportError:
        pass
    found.append("libkvpager.so.0")
    return found


def load() -> ctypes.CDLL:
    """Load libkvpager: $KVPAGER_LIBRARY when set (a path to the .so), else
    the build tree's (this package built in $(BUILD)/python finds
    $(BUILD)/lib), else the library directory `make install` recorded, else
    the dynamic loader's search path."""
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path} (absent)")
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise ImportError("cannot load libkvpager: tried " + "; ".join(tried) +
                      " (build it with make, or set KVPAGER_LIBRARY to the "
                      "path of libkvpager.so)")


lib = load()
lib.kvp_strerror.restype = c_char_p
lib.kvp_strerror.argtypes = [c_int]


def strerror(err: int) -> str:
    """kvp_strerror: what a kvpager error code means, with the remedy."""
    return lib.kvp_strerror(int(err)).decode()


def check(rc: int, call: str, detail: str | None = None) -> int:
    """Raise KvpagerError for a negative C return code, else return it."""
    if rc < 0:
        raise KvpagerError(-rc, call, detail)
    return rc


def invalid(call: str, detail: str) -> KvpagerError:
    """The binding refusing a bad argument value itself, as the C calls do:
    EINVAL and what was wrong."""
    return KvpagerError(_errno.EINVAL, call, detail)


# --- structures (compared against _abi.LAYOUT by check_layouts) ------------

def _u64_fields(names) -> list:
    return [(n, c_uint64) for n in names]


class Config(Structure):
    _c_name_ = "kvp_config"
    _fields_ = _u64_fields(_abi.PAGER_TUNABLES)


class KvConfig(Structure):
    _c_name_ = "kvp_kv_config"
    _fields_ = _u64_fields(_abi.KV_TUNABLES)


class Stats(Structure):
    _c_name_ = "kvp_stats"
    _fields_ = _u64_fields(n for n, _ in _abi.STATS) + \
        [("io_latency_us", c_uint64 * _abi.LATENCY_BUCKETS),
         ("io_latency_sum_ns", c_uint64)]


class RegionOpts(Structure):
    _c_name_ = "kvp_region_opts"
    _fields_ = [("name", c_char_p), ("size", c_size_t),
                ("block_bytes", c_size_t), ("store", c_void_p),
                ("store_offset", c_uint64), ("flags", c_uint)]


class BlockInfo(Structure):
    _c_name_ = "kvp_block_info"
    _fields_ = [("state", c_int), ("dirty", c_bool), ("in_store", c_bool),
                ("staged", c_bool), ("pins", c_uint), ("last_use", c_uint64)]


class FaultPlan(Structure):
    _c_name_ = "kvp_fault_plan"
    _fields_ = [("read_fail_off", c_uint64), ("read_fail_len", c_uint64),
                ("read_errno", c_int), ("write_errno", c_int),
                ("write_fail_after", c_uint64), ("delay_us", c_uint64)]


class Tunable(Structure):
    _c_name_ = "kvp_tunable"
    _fields_ = [("name", c_char_p), ("type", c_int), ("min", c_uint64),
                ("max", c_uint64), ("def", c_uint64), ("runtime", c_bool),
                ("choices", c_char_p), ("doc", c_char_p), ("owner", c_int),
                ("offset", c_size_t)]


class TunableTarget(Structure):
    _c_name_ = "kvp_tunable_target"
    _fields_ = [("pager", POINTER(Config)), ("kv", POINTER(KvConfig))]


class Geometry(Structure):
    _c_name_ = "kvp_kv_geometry"
    _fields_ = [("layers", c_uint32), ("q_heads", c_uint32),
                ("kv_heads", c_uint32), ("head_dim", c_uint32),
                ("dtype", c_int), ("block_tokens", c_uint32)]


class Layout(Structure):
    _c_name_ = "kvp_kv_layout"
    _fields_ = [("geo", Geometry), ("capacity_blocks", c_uint32),
                ("blocks_per_pager_block", c_uint32),
                ("block_stride", c_size_t), ("pager_block_bytes", c_size_t),
                ("layer_bytes", c_size_t), ("region_bytes", c_size_t)]


class AttnBlocks(Structure):
    _c_name_ = "kvp_attn_blocks"
    _fields_ = [("ptrs", c_void_p), ("ntokens", c_void_p),  # addresses
                ("n", c_size_t)]


class PredictorOpts(Structure):
    _c_name_ = "kvp_predictor_opts"
    _fields_ = [("kind", c_int), ("budget_tokens", c_uint32),
                ("sink_tokens", c_uint32), ("rank", c_uint32),
                ("fit_tokens", c_uint32), ("power_iters", c_uint32),
                ("max_seqs", c_uint32), ("seed", c_uint64)]


FILL_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_uint32, c_uint32, c_uint64,
                           c_uint32, c_void_p)
QUERY_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_uint32, c_uint32, c_uint64,
                            floatp)


class KvSourceOps(Structure):
    """struct kvp_kv_source_ops (lib/kv/kv_source.h): the binding sets
    fill and query; the optional ops stay NULL."""
    _c_name_ = "kvp_kv_source_ops"
    _fields_ = [("fill", FILL_FN), ("query", QUERY_FN),
                ("plan_query", c_void_p), ("attended", c_void_p),
                ("prefill_begin", c_void_p), ("prefill_end", c_void_p)]


class KvSource(Structure):
    _c_name_ = "kvp_kv_source"
    _fields_ = [("ops", POINTER(KvSourceOps)), ("arg", c_void_p),
                ("flags", c_uint)]


class KvcacheOpts(Structure):
    _c_name_ = "kvp_kvcache_opts"
    _fields_ = [("geo", Geometry), ("max_seqs", c_uint32),
                ("capacity_tokens", c_uint64),
                ("pager_block_bytes", c_size_t), ("backend", c_int),
                ("pager", c_void_p), ("cfg", POINTER(Config)),
                ("store", c_void_p), ("store_offset", c_uint64),
                ("region_name", c_char_p), ("dir", c_char_p),
                ("budget_bytes", c_uint64), ("prefetch", c_bool),
                ("prefetch_depth", c_uint32), ("cross_step", c_bool),
                ("cold_after", c_int), ("pred", PredictorOpts),
                ("attn_threads", c_uint), ("sample_every", c_uint32),
                ("sample_layers", c_uint32), ("max_samples", c_uint32),
                ("device", c_char_p), ("device_pool_bytes", c_uint64),
                ("reuse_slots", c_bool)]


class StepStats(Structure):
    _c_name_ = "kvp_kvcache_step_stats"
    _fields_ = [("steps", c_uint64), ("tokens", c_uint64),
                ("t_step_s", c_double), ("t_compute_s", c_double),
                ("t_predict_s", c_double), ("t_wait_s", c_double),
                ("t_fill_s", c_double), ("bytes_read", c_uint64),
                ("bytes_written", c_uint64), ("demand_faults", c_uint64),
                ("prefetch_issued", c_uint64), ("prefetch_hit", c_uint64),
                ("prefetch_late", c_uint64), ("prefetch_wasted", c_uint64),
                ("chosen_blocks", c_uint64), ("reused_blocks", c_uint64),
                ("flush_store", c_uint64), ("flush_region", c_uint64)]


class KvcacheStats(Structure):
    _c_name_ = "kvp_kvcache_stats"
    _fields_ = [("sum", StepStats), ("t_load_busy_s", c_double),
                ("t_prefill_s", c_double), ("prefill_tokens", c_uint64),
                ("prefill_bytes", c_uint64), ("cow_copies", c_uint64),
                ("discarded_pager_blocks", c_uint64),
                ("pin_failures", c_uint64), ("mmap_dropped_bytes", c_uint64),
                ("slot_reads", c_uint64), ("slot_read_errors", c_uint64),
                ("slot_ios", c_uint64)]


class SynthOpts(Structure):
    _c_name_ = "kvp_kv_synth_opts"
    _fields_ = [("seed", c_uint64), ("sink_tokens", c_uint32),
                ("clusters", c_uint32), ("topic_run_tokens", c_uint32),
                ("heavy_every", c_uint32), ("recent_tokens", c_uint32),
                ("sink_logit", c_float), ("heavy_logit", c_float),
                ("topic_logit", c_float), ("recent_logit", c_float),
                ("noise", c_float)]


# --- the prefix cache and the remote tier (lib/cache, lib/remote) ----------

class RecKeyCtx(Structure):
    _c_name_ = "kvp_rec_keyctx"
    _fields_ = [("model", ctypes.c_uint8 * 32), ("geo", c_uint32 * 8),
                ("salt", ctypes.c_uint8 * 32)]


class RecKey(Structure):
    _c_name_ = "kvp_rec_key"
    _fields_ = [("b", ctypes.c_uint8 * _abi.REC_KEY_BYTES)]


class RecCipher(Structure):
    _c_name_ = "kvp_rec_cipher"
    _fields_ = [("key", ctypes.c_uint8 * 32)]


class CacheOpts(Structure):
    _c_name_ = "kvp_cache_opts"
    _fields_ = [("capacity_bytes", c_uint64), ("cipher", POINTER(RecCipher)),
                ("read_only", c_bool), ("verify_at_open", c_bool),
                ("io", c_void_p), ("io_arg", c_void_p)]


class CacheStats(Structure):
    _c_name_ = "kvp_cache_stats"
    _fields_ = _u64_fields(n for n, _ in _abi.CACHE_STATS)


class PrefixOpts(Structure):
    _c_name_ = "kvp_prefix_opts"
    _fields_ = [("cache", c_void_p), ("ctx", RecKeyCtx),
                ("queue_bytes", c_uint64)]


class PrefixStats(Structure):
    _c_name_ = "kvp_prefix_stats"
    _fields_ = _u64_fields(("lookups", "hit_chunks", "queued", "stored",
                            "failed", "queue_waits", "behind")) + \
        [("behind_s", c_double)]


class RemoteStats(Structure):
    _c_name_ = "kvp_remote_stats"
    _fields_ = _u64_fields(n for n, _ in _abi.REMOTE_STATS) + \
        [("fetch_latency_us", c_uint64 * _abi.LATENCY_BUCKETS),
         ("fetch_latency_sum_ns", c_uint64)]


class ModelRemoteOpts(Structure):
    _c_name_ = "kvp_model_remote_opts"
    _fields_ = [("url", c_char_p), ("prefix", c_void_p),
                ("ctx", POINTER(RecKeyCtx)), ("cipher", POINTER(RecCipher)),
                ("window", c_uint32)]


class ModelRemoteStats(Structure):
    _c_name_ = "kvp_model_remote_stats"
    _fields_ = _u64_fields(("chunks_fetched", "chunks_missed",
                            "chunks_published", "publish_skipped",
                            "chunks_mapped", "dir_skipped"))


STRUCTS = (Config, KvConfig, Stats, RegionOpts, BlockInfo, FaultPlan,
           Tunable, TunableTarget, Geometry, Layout, AttnBlocks,
           PredictorOpts, KvSourceOps, KvSource, KvcacheOpts, StepStats, KvcacheStats,
           SynthOpts, RecKeyCtx, RecKey, RecCipher, CacheOpts, CacheStats,
           PrefixOpts, PrefixStats, RemoteStats, ModelRemoteOpts,
           ModelRemoteStats)


def check_layouts() -> None:
    """Every hand-written structure against the compiler's view of it."""
    for s in STRUCTS:
        size, offsets = _abi.LAYOUT[s._c_name_]
        mine = {f[0]: getattr(s, f[0]).offset for f in s._fields_}
        bad = [f for f, off in offsets.items() if mine.get(f) != off]
        if ctypes.sizeof(s) != size or bad:
            raise ImportError(
                f"struct {s._c_name_} of the binding disagrees with the C "
                f"header (size {ctypes.sizeof(s)} vs {size}, fields "
                f"{bad or 'all'}): rebuild with make, and update "
                f"python/kvpager/_native.py with the header")


check_layouts()


def as_dict(st: Structure) -> dict:
    """A structure's fields as a dict; arrays as lists, nested structures
    as dicts."""
    out = {}
    for name, _ in st._fields_:
        v = getattr(st, name)
        if isinstance(v, Structure):
            v = as_dict(v)
        elif isinstance(v, ctypes.Array):
            v = list(v)
        out[name] = v
    return out


# --- prototypes -------------------------------------------------------------

_P = c_void_p
_PROTOS = {
    # pager/config.h, pager/pager.h
    "kvp_config_defaults": (None, [POINTER(Config)]),
    "kvp_config_check": (c_int, [POINTER(Config), POINTER(c_char_p)]),
    "kvp_pager_open": (c_int, [POINTER(Config), POINTER(_P)]),
    "kvp_pager_close": (None, [_P]),
    "kvp_pager_config": (None, [_P, POINTER(Config)]),
    "kvp_pager_reconfigure": (c_int, [_P, POINTER(Config),
                                      POINTER(c_char_p)]),
    "kvp_pager_stats": (None, [_P, POINTER(Stats)]),
    "kvp_pager_uffd_mode": (c_char_p, [_P]),
    "kvp_region_create": (c_int, [_P, POINTER(RegionOpts), POINTER(_P)]),
    "kvp_region_destroy": (c_int, [_P]),
    "kvp_region_addr": (c_void_p, [_P]),
    "kvp_region_size": (c_size_t, [_P]),
    "kvp_region_block_bytes": (c_size_t, [_P]),
    "kvp_region_name": (c_char_p, [_P]),
    "kvp_region_install_mode": (c_char_p, [_P]),
    "kvp_region_stats": (None, [_P, POINTER(Stats)]),
    "kvp_region_flush": (c_int, [_P]),
    "kvp_region_pin": (c_int, [_P, c_uint64, c_uint64]),
    "kvp_region_unpin": (c_int, [_P, c_uint64, c_uint64]),
    "kvp_region_advise": (c_int, [_P, c_uint64, c_uint64, c_int]),
    "kvp_prefetch_submit": (c_int, [_P, u64p, c_size_t, POINTER(_P)]),
    "kvp_prefetch_wait": (c_int, [_P, c_int]),
    "kvp_prefetch_done": (c_bool, [_P]),
    "kvp_prefetch_cancel": (c_int, [_P]),
    "kvp_prefetch_release": (None, [_P]),
    "kvp_block_state_name": (c_char_p, [c_int]),
    "kvp_region_block_info": (c_int, [_P, c_uint64, POINTER(BlockInfo)]),
    "kvp_region_peek": (c_int, [_P, c_uint64, c_void_p]),
    # pager/store.h
    "kvp_store_file_open": (c_int, [c_char_p, c_uint64, c_uint,
                                    POINTER(_P)]),
    "kvp_store_file_temp": (c_int, [c_char_p, c_uint64, POINTER(_P)]),
    "kvp_store_memory_create": (c_int, [c_uint64, POINTER(_P)]),
    "kvp_store_faulty_create": (c_int, [_P, POINTER(_P)]),
    "kvp_store_faulty_set": (c_int, [_P, POINTER(FaultPlan)]),
    "kvp_store_destroy": (None, [_P]),
    # lib/tunables/tunables.h
    "kvp_tunable_find": (POINTER(Tunable), [c_char_p]),
    "kvp_tunable_parse": (c_int, [POINTER(Tunable), c_char_p, u64p,
                                  c_char_p, c_size_t]),
    "kvp_tunable_set": (c_int, [POINTER(TunableTarget), POINTER(Tunable),
                                c_uint64, c_char_p, c_size_t]),
    "kvp_tunable_get": (c_int, [POINTER(TunableTarget), POINTER(Tunable),
                                u64p]),
    "kvp_tunable_format": (c_int, [POINTER(Tunable), c_uint64, c_char_p,
                                   c_size_t]),
    "kvp_kv_config_defaults": (None, [POINTER(KvConfig)]),
    "kvp_parse_bytes": (c_int, [c_char_p, u64p]),
    # lib/kv/kv_geometry.h, lib/kv/attention.h
    "kvp_kv_geometry_preset": (c_int, [c_char_p, POINTER(Geometry)]),
    "kvp_kv_geometry_presets": (POINTER(c_char_p), []),
    "kvp_kv_geometry_check": (c_int, [POINTER(Geometry)]),
    "kvp_kv_block_bytes": (c_size_t, [POINTER(Geometry)]),
    "kvp_kv_block_stride": (c_size_t, [POINTER(Geometry)]),
    "kvp_kv_from_f32": (None, [c_int, floatp, c_void_p, c_size_t]),
    "kvp_kv_to_f32": (None, [c_int, c_void_p, floatp, c_size_t]),
    # lib/synth/kv_synth.h
    "kvp_kv_synth_opts_default": (None, [POINTER(SynthOpts)]),
    "kvp_kv_synth_create": (c_int, [POINTER(Geometry), POINTER(SynthOpts),
                                    POINTER(_P)]),
    "kvp_kv_synth_destroy": (None, [_P]),
    "kvp_kv_source_synth": (None, [POINTER(KvSource), _P]),
    "kvp_attn_pool_create": (c_int, [c_uint, POINTER(_P)]),
    "kvp_attn_pool_destroy": (None, [_P]),
    "kvp_attn_pool_threads": (c_uint, [_P]),
    "kvp_attn_decode": (c_int, [POINTER(Geometry), POINTER(AttnBlocks),
                                c_void_p, c_void_p, _P]),
    "kvp_attn_simd_name": (c_char_p, []),
    "kvp_attn_blocks_from_table": (c_int, [POINTER(Layout), c_void_p, _P,
                                           c_uint32, u32p, c_size_t,
                                           POINTER(c_void_p), u32p,
                                           POINTER(AttnBlocks)]),
    # lib/predict/predictor.h
    "kvp_predictor_opts_default": (None, [POINTER(PredictorOpts), c_int]),
    "kvp_predictor_kind_parse": (c_int, [c_char_p, POINTER(c_int)]),
    "kvp_predictor_kind_name": (c_char_p, [c_int]),
    # lib/kv/block_table.h
    "kvp_block_table_tokens": (c_uint64, [_P]),
    "kvp_block_table_blocks": (c_uint32, [_P]),
    "kvp_block_table_map": (u32p, [_P]),
    "kvp_block_table_valid": (c_uint32, [_P, c_uint32]),
    "kvp_block_table_shared": (c_bool, [_P, c_uint32]),
    # lib/kv/kvcache.h
    "kvp_kvcache_opts_default": (None, [POINTER(KvcacheOpts),
                                        POINTER(Geometry)]),
    "kvp_kvcache_create": (c_int, [POINTER(KvcacheOpts), POINTER(_P)]),
    "kvp_kvcache_layout_for": (c_int, [POINTER(KvcacheOpts),
                                       POINTER(Layout)]),
    "kvp_kvcache_destroy": (None, [_P]),
    "kvp_kvcache_seq_create": (c_int, [_P, u32p]),
    "kvp_kvcache_seq_fork": (c_int, [_P, c_uint32, c_uint64, u32p]),
    "kvp_kvcache_seq_free": (c_int, [_P, c_uint32]),
    "kvp_kvcache_seq_tokens": (c_uint64, [_P, c_uint32]),
    "kvp_kvcache_seq_table": (_P, [_P, c_uint32]),
    "kvp_kvcache_seq_list": (c_uint32, [_P, u32p, c_uint32]),
    "kvp_kvcache_prefill": (c_int, [_P, c_uint32, c_uint64,
                                    POINTER(KvSource), c_void_p, c_void_p]),
    "kvp_kvcache_step": (c_int, [_P, c_void_p, c_uint32,
                                 POINTER(KvSource), c_void_p,
                                 POINTER(StepStats)]),
    "kvp_kvcache_drain": (None, [_P]),
    "kvp_kvcache_stats": (None, [_P, POINTER(KvcacheStats)]),
    "kvp_kvcache_format_block_table": (c_int, [_P, c_uint32, c_char_p,
                                               c_size_t]),
    "kvp_kvcache_layout": (POINTER(Layout), [_P]),
    "kvp_kvcache_region": (_P, [_P]),
    "kvp_kvcache_pager": (_P, [_P]),
    "kvp_kvcache_budget_bytes": (c_uint64, [_P]),
    "kvp_kvcache_kv_bytes": (c_uint64, [_P]),
    # lib/cache/block_record.h, cache_dir.h, prefix.h
    "kvp_rec_hash": (c_int, [c_void_p, c_size_t, c_void_p]),
    "kvp_rec_key_hex": (None, [POINTER(RecKey), c_char_p]),
    "kvp_cache_open": (c_int, [c_char_p, POINTER(CacheOpts), POINTER(_P),
                               c_char_p, c_size_t, c_char_p, c_size_t]),
    "kvp_cache_close": (None, [_P]),
    "kvp_cache_contains": (c_bool, [_P, POINTER(RecKey)]),
    "kvp_cache_stats": (None, [_P, POINTER(CacheStats)]),
    "kvp_cache_cipher_parse": (c_int, [c_char_p, c_size_t,
                                       POINTER(RecCipher), c_char_p,
                                       c_size_t]),
    "kvp_cache_cipher_load": (c_int, [c_char_p, POINTER(RecCipher),
                                      c_char_p, c_size_t]),
    "kvp_prefix_create": (c_int, [POINTER(PrefixOpts), POINTER(_P)]),
    "kvp_prefix_destroy": (None, [_P]),
    "kvp_prefix_set_prompt": (c_int, [_P, u32p, c_uint32, c_uint32]),
    "kvp_prefix_key": (c_int, [_P, c_uint32, POINTER(RecKey)]),
    "kvp_prefix_get": (c_int, [_P, c_uint32, c_void_p, c_size_t]),
    "kvp_prefix_put": (None, [_P, c_uint32, c_void_p, c_size_t]),
    "kvp_prefix_drain": (None, [_P]),
    "kvp_prefix_stats": (None, [_P, POINTER(PrefixStats)]),
    # lib/model/model.h: the chunk format (one definition, the C tools')
    "kvp_model_chunk_in_blocks": (c_bool, [POINTER(Geometry), c_uint32]),
    "kvp_model_chunk_bytes": (c_size_t, [POINTER(Geometry), c_uint32]),
    "kvp_model_chunk_keygeo": (None, [POINTER(Geometry), c_uint32, c_uint32,
                                      u32p]),
    # lib/model/model_remote.h (over lib/remote/remote.h)
    "kvp_model_remote_open": (c_int, [POINTER(ModelRemoteOpts), POINTER(_P),
                                      c_char_p, c_size_t]),
    "kvp_model_remote_close": (None, [_P, c_uint]),
    "kvp_model_remote_get": (c_int, [_P, c_uint32, c_void_p, c_size_t]),
    "kvp_model_remote_put": (None, [_P, c_uint32, c_void_p, c_size_t]),
    "kvp_model_remote_stats": (None, [_P, POINTER(ModelRemoteStats),
                                      POINTER(RemoteStats)]),
    "kvp_model_remote_url": (c_char_p, [_P]),
}

for _name, (_res, _args) in _PROTOS.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args
del _name, _res, _args, _fn
