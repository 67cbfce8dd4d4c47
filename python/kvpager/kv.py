"""The KV layer: geometries, the KV cache with its block tables and
predictors, K/V sources, and decode attention (lib/kv/, lib/predict/).

A KVCache holds the K and V of several sequences in a pager region (or in
RAM, or in the kernel's mmap of a file), laid out by the geometry:
layer-major, KV blocks of G tokens, K[kv_head][slot][dim] then V.  Block
tables map each sequence's logical blocks to physical ones; forks share
prefixes.  Each decode step appends one token to each sequence, every
layer, and computes every layer's attention over the blocks the predictor
chose, with those blocks prefetched layers ahead and pinned while used.

K and V come from a source: append() takes numpy arrays; step() asks a
source object, layer by layer, because in a real model layer l's K, V and
query come from layer l-1's attention output (which step() has written to
its output array by then).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
from ctypes import byref, c_uint32, c_void_p
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from . import _abi
from ._native import (FILL_FN, QUERY_FN, AttnBlocks, Config, Geometry,
                      Handle, KvConfig, KvcacheOpts, KvcacheStats, Layout,
                      KvpagerError, KvSource, KvSourceOps, StepStats,
                      SynthOpts, TunableTarget, Viewed, address, as_dict,
                      check, closed, floatp, invalid, lib, view)
from .pager import KV, PAGER, Pager, Store, apply_tunables, integer, u64

DTYPES = ("fp16", "bf16", "fp32")  # enum kvp_kv_dtype
BACKENDS = ("pager", "ram", "mmap")  # enum kvp_kvcache_backend


@dataclass(frozen=True)
class KVGeometry:
    """A model's attention shape (lib/kv/kv_geometry.h): layers, query
    heads, KV heads (grouped-query attention), head dimension (a multiple
    of 8), element type ("fp16", "bf16", "fp32") and G, the tokens of one
    KV block."""

    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: str = "fp16"
    block_tokens: int = 4

    @classmethod
    def preset(cls, name: str, **changes) -> "KVGeometry":
        """A named preset ("llama3-8b", "qwen3-8b", "tiny"), with fields
        changed by keyword (block_tokens=16)."""
        g = Geometry()
        names, at = [], lib.kvp_kv_geometry_presets()
        while at[len(names)]:
            names.append(at[len(names)].decode())
        check(lib.kvp_kv_geometry_preset(name.encode(), byref(g)),
              "kvp_kv_geometry_preset",
              f"'{name}' is not a preset (one of {', '.join(names)})")
        fields = {f: getattr(g, f) for f, _ in Geometry._fields_}
        fields["dtype"] = DTYPES[g.dtype]
        return cls(**{**fields, **changes})

    def c(self) -> Geometry:
        """The C struct, checked (EINVAL naming the limits)."""
        if self.dtype not in DTYPES:
            raise invalid("KVGeometry", f"dtype '{self.dtype}' is not one "
                          f"of {' '.join(DTYPES)}")
        for f in ("layers", "q_heads", "kv_heads", "head_dim",
                  "block_tokens"):  # c_uint32 would wrap -1 to 2^32-1
            u64("KVGeometry", f, integer("KVGeometry", f, getattr(self, f)),
                bits=32)
        g = Geometry(self.layers, self.q_heads, self.kv_heads, self.head_dim,
                     DTYPES.index(self.dtype), self.block_tokens)
        check(lib.kvp_kv_geometry_check(byref(g)), "kvp_kv_geometry_check",
              f"{self}: head_dim a multiple of 8 up to 512, q_heads a "
              f"multiple of kv_heads up to 256, block_tokens 1..1024")
        return g

    @property
    def np_dtype(self) -> np.dtype:
        """The numpy type K and V are stored in (bf16 as its raw uint16)."""
        return np.dtype({"fp16": np.float16, "bf16": np.uint16,
                         "fp32": np.float32}[self.dtype])

    @property
    def block_bytes(self) -> int:
        """Bytes of one KV block: 2 * G * kv_heads * head_dim * element."""
        return lib.kvp_kv_block_bytes(byref(self.c()))

    @property
    def block_stride(self) -> int:
        """Distance between two physical KV blocks of one layer."""
        return lib.kvp_kv_block_stride(byref(self.c()))


def block_view_shape(g: KVGeometry) -> tuple:
    """The numpy shape of one KV block as the binding views it (K then V,
    [2, kv_heads, G, head_dim]): KVCache.kv_block's, PrefixCache.chunk_kv's."""
    return (2, g.kv_heads, g.block_tokens, g.head_dim)


def _check_block_order() -> None:
    """block_view_shape() against the C block format (kv_geometry.h's
    offsets, printed into _abi by gen_abi.c at a probe geometry): a
    changed format fails the import instead of misreading K and V."""
    geo, k_off, v_off = _abi.KV_BLOCK_PROBE
    g = KVGeometry(*geo[:4], dtype=DTYPES[geo[4]], block_tokens=geo[5])
    shape, es = block_view_shape(g), g.np_dtype.itemsize
    mine = (int(np.ravel_multi_index((0, 1, 2, 3), shape)) * es,
            int(np.ravel_multi_index((1, 1, 2, 3), shape)) * es)
    if mine != (k_off, v_off):
        raise ImportError(f"the binding's KV block view {shape} gives "
                          f"offsets {mine}, the C block format "
                          f"{(k_off, v_off)}: update python/kvpager/kv.py "
                          f"with lib/kv/kv_geometry.h")


_check_block_order()


def to_kv_dtype(g: KVGeometry, a: np.ndarray, what: str) -> np.ndarray:
    """@a in the geometry's element type, C-contiguous: as it is when it
    already is (no copy), else converted by the library's own conversion
    (the rounding every other path uses)."""
    a = np.asarray(a)
    if a.dtype == g.np_dtype and a.flags.c_contiguous:
        return a
    if a.dtype.kind != "f":
        raise invalid(what, f"K/V of type {a.dtype}: give float32 or "
                      f"{g.np_dtype}")
    f = np.ascontiguousarray(a, dtype=np.float32)
    out = np.empty(f.shape, dtype=g.np_dtype)
    lib.kvp_kv_from_f32(DTYPES.index(g.dtype), f.ctypes.data_as(floatp),
                        out.ctypes.data, f.size)
    return out


class KVSourceProtocol(Protocol):
    """What KVCache.step asks, layer by layer, for each sequence:

    ``kv(seq, layer, token)`` -> (k, v), each [kv_heads, head_dim]: the K
    and V of token @token (its position) in @layer;
    ``query(seq, layer, pos)`` -> q [q_heads, head_dim]: the layer's query
    for the step that attends to tokens 0 .. pos-1.

    Both are called for layer l after layer l-1's attention output is in
    the step's output array.  The lowrank predictor also asks query() for
    layers ahead (prefetch planning): a real model cannot answer that, so
    use exact or window with one (see KVCache)."""

    def kv(self, seq: int, layer: int, token: int): ...

    def query(self, seq: int, layer: int, pos: int): ...


class _Callbacks:
    """A Python source as a struct kvp_kv_source: ctypes callbacks that
    write into the cache's KV block and query buffer in place.  An
    exception in the source makes the C call fail; raise_pending() then
    raises it (the first one) in the caller."""

    def __init__(self, g: KVGeometry, kv, query):
        self.g = g
        self.kv = kv  # kv(seq, layer, token, ntokens) -> (k, v)
        self.query = query  # query(seq, layer, pos) -> q, or None
        self.error = None
        self._blk_shape = (2, g.kv_heads, g.block_tokens, g.head_dim)
        self._blk_bytes = g.block_bytes
        self._q_shape = (g.q_heads * g.head_dim,)
        # the ops table lives as long as self: the C source points at it
        self.ops = KvSourceOps(FILL_FN(self._fill), QUERY_FN(self._query))
        self.c = KvSource(ctypes.pointer(self.ops), None, 0)

    def _fill(self, arg, seq, layer, token, ntokens, kvblock):
        try:
            k, v = self.kv(seq, layer, token, ntokens)
            g = self.g
            blk = np.frombuffer(
                (ctypes.c_char * self._blk_bytes).from_address(kvblock),
                dtype=g.np_dtype).reshape(self._blk_shape)
            s = token % g.block_tokens
            kk = to_kv_dtype(g, k, "kv source")
            vv = to_kv_dtype(g, v, "kv source")
            shape = (ntokens, g.kv_heads, g.head_dim)
            if kk.shape != shape or vv.shape != shape:
                raise invalid("kv source", f"K/V of layer {layer} have "
                              f"shapes {kk.shape} and {vv.shape}; "
                              f"expected {shape}")
            blk[0, :, s:s + ntokens, :] = kk.swapaxes(0, 1)
            blk[1, :, s:s + ntokens, :] = vv.swapaxes(0, 1)
            return 0
        except BaseException as e:  # noqa: B902 - carried to the caller
            self.error = self.error or e
            return -errno.ECANCELED

    def _query(self, arg, seq, layer, pos, q):
        try:
            src = np.ascontiguousarray(self.query(seq, layer, pos),
                                       dtype=np.float32).reshape(-1)
            if src.shape != self._q_shape:
                raise invalid("kv source", f"query of layer {layer} has "
                              f"{src.size} floats; expected "
                              f"{self._q_shape[0]}")
            ctypes.memmove(q, src.ctypes.data, src.nbytes)
            return 0
        except BaseException as e:  # noqa: B902 - carried to the caller
            self.error = self.error or e
            return -errno.ECANCELED

    def raise_pending(self) -> None:
        if self.error is not None:
            e, self.error = self.error, None
            raise e


class SynthSource(Handle):
    """The synthetic K/V and queries of lib/synth (planted attention
    structure, deterministic from @seed): the tools' and tests' source,
    run in C with no Python in the loop."""

    def __init__(self, geometry: KVGeometry, seed: int = 1):
        o = SynthOpts()
        lib.kvp_kv_synth_opts_default(byref(o))
        o.seed = seed
        h = c_void_p()
        check(lib.kvp_kv_synth_create(byref(geometry.c()), byref(o),
                                      byref(h)), "kvp_kv_synth_create")
        self._h = h.value
        self.geometry = geometry
        self.c = KvSource()
        lib.kvp_kv_source_synth(byref(self.c), self._h)

    def close(self) -> None:
        """EBUSY while a step or a prefill reads from it."""
        h = self._take("SynthSource.close", "the synthetic source")
        if h:
            lib.kvp_kv_synth_destroy(h)


# Which KV tunable sets which field of struct kvp_kvcache_opts.
_KV_OPTS = {
    "predictor": ("pred", "kind"),
    "predict_budget_tokens": ("pred", "budget_tokens"),
    "sink_tokens": ("pred", "sink_tokens"),
    "lowrank_rank": ("pred", "rank"),
    "lowrank_fit_tokens": ("pred", "fit_tokens"),
    "prefetch_depth_layers": (None, "prefetch_depth"),
    "attention_threads": (None, "attn_threads"),
}


class KVCache(Handle, Viewed):
    """A KV cache of @geometry for up to @max_seqs sequences and
    @capacity_tokens tokens in all (kvcache.h).

    @backend: "pager" (a region served from a store under a RAM budget:
    the product), "ram" (all resident: the reference) or "mmap" (the
    kernel's mmap of a file, with an emulated budget).  With "pager" the
    cache uses @pager, or opens its own with @budget (None: a quarter of
    the KV) and the engine tunables given as keywords; its backing file
    goes to @directory, or @store holds the KV.  @pager_block_bytes: the
    pager's block (0: one KV block).  @prefetch: prefetch the predictor's
    blocks prefetch_depth_layers ahead.

    KV tunables (``kvpctl list``) are keywords too: predictor ("exact",
    "window", "lowrank"), predict_budget_tokens, sink_tokens,
    lowrank_rank, lowrank_fit_tokens, prefetch_depth_layers,
    attention_threads; kv_block_tokens is the geometry's block_tokens.

    One thread drives a cache (the C contract).  A context manager."""

    def __init__(self, geometry: KVGeometry, *, capacity_tokens: int,
                 max_seqs: int = 1, backend: str = "pager",
                 pager: Pager | None = None, budget: int | str | None = None,
                 directory: str | None = None, store: Store | None = None,
                 pager_block_bytes: int = 0, prefetch: bool = True,
                 name: str = "kv", **tunables):
        call = "KVCache"
        if backend not in BACKENDS:
            raise invalid(call, f"backend '{backend}' is not one of "
                          f"{' '.join(BACKENDS)}")
        if not isinstance(name, str):
            raise TypeError(f"{call}: name must be a str, not "
                            f"{type(name).__name__}")
        u64(call, "capacity_tokens", integer(call, "capacity_tokens",
                                             capacity_tokens))
        u64(call, "max_seqs", integer(call, "max_seqs", max_seqs), bits=32)
        u64(call, "pager_block_bytes", integer(call, "pager_block_bytes",
                                               pager_block_bytes))
        o = KvcacheOpts()
        lib.kvp_kvcache_opts_default(byref(o), byref(geometry.c()))
        kv = KvConfig()
        lib.kvp_kv_config_defaults(byref(kv))
        cfg = Config()
        lib.kvp_config_defaults(byref(cfg))
        if budget is not None:
            tunables = {"ram_budget_bytes": budget, **tunables}
        owners = (KV,) if pager else (KV, PAGER)
        apply_tunables(call, TunableTarget(ctypes.pointer(cfg),
                                           ctypes.pointer(kv)),
                       tunables, owners)
        for t, (sub, field) in _KV_OPTS.items():
            setattr(getattr(o, sub) if sub else o, field, getattr(kv, t))
        if "kv_block_tokens" in tunables:
            o.geo.block_tokens = kv.kv_block_tokens
            geometry = KVGeometry(**{**geometry.__dict__,
                                     "block_tokens": kv.kv_block_tokens})
        o.prefetch = prefetch and o.prefetch_depth > 0
        o.prefetch_depth = max(1, min(o.prefetch_depth, geometry.layers - 1))
        o.max_seqs = max_seqs
        o.pred.max_seqs = max_seqs
        o.capacity_tokens = capacity_tokens
        o.pager_block_bytes = pager_block_bytes
        o.backend = BACKENDS.index(backend)
        o.pager = pager._live() if pager else None
        o.cfg = ctypes.pointer(cfg)
        o.budget_bytes = cfg.ram_budget_bytes if budget is not None else 0
        o.store = store._handle() if store else None
        self._name = name.encode()
        o.region_name = self._name
        self._dir = directory.encode() if directory else None
        o.dir = self._dir
        claim = None
        if store and backend == "pager":
            # Its region's bytes of the store, claimed as Pager.region's
            # are: a region on them would write over the cache's K and V.
            # Asked first for the message naming the region; the C
            # library refuses it too (EBUSY), for regions made in C.
            lay = Layout()
            check(lib.kvp_kvcache_layout_for(byref(o), byref(lay)),
                  "kvp_kvcache_layout_for", f"{geometry}, "
                  f"{capacity_tokens} tokens")
            with Handle._lock:
                claim = store._claim(o.store_offset, lay.region_bytes, call)
        h = c_void_p()
        check(lib.kvp_kvcache_create(byref(o), byref(h)),
              "kvp_kvcache_create", f"{geometry}, {capacity_tokens} tokens, "
              f"{max_seqs} sequences, backend {backend}")
        if claim:
            with Handle._lock:
                store._root()._claims[self] = claim
        self._h = h.value
        self.geometry = geometry
        self.name = name
        self.backend = backend
        self.pager = pager
        self._parent = pager
        self.store = store
        if store:
            store._users += 1
        if pager:
            pager._children.add(self)
            pager._adopt()
        self.step_stats: dict = {}  # the last step's figures
        self._ids = (c_uint32 * max_seqs)()  # kvp_kvcache_seq_list's
        self._qfloats = geometry.q_heads * geometry.head_dim

    def _live(self) -> int:
        if not self._h:
            raise closed("KVCache", "the cache is closed")
        return self._h

    def _seq(self, call: str, seq: int) -> int:
        seq = integer(call, "the sequence id", seq)
        if seq not in self.sequences():
            raise invalid(call, f"sequence {seq} is not live")
        return seq

    # --- sequences and block tables ---------------------------------------

    def new_sequence(self) -> int:
        """An empty sequence; its id.  ENOSPC when max_seqs are live."""
        sid = c_uint32()
        with self._call() as h:
            check(lib.kvp_kvcache_seq_create(h, byref(sid)),
                  "kvp_kvcache_seq_create")
        return sid.value

    def fork(self, parent: int, ntokens: int | None = None) -> int:
        """A new sequence sharing the first @ntokens tokens of @parent
        (None: all) by reference; the first append into a shared, partly
        filled block copies it.  Its id."""
        self._seq("KVCache.fork", parent)
        sid = c_uint32()
        n = (1 << 64) - 1 if ntokens is None else \
            u64("KVCache.fork", "ntokens",
                integer("KVCache.fork", "ntokens", ntokens))
        with self._call() as h:
            err = lib.kvp_kvcache_seq_fork(h, parent, n, byref(sid))
            check(err, "kvp_kvcache_seq_fork",
                  f"{ntokens} tokens of sequence {parent} "
                  f"({self.tokens(parent)} held)")
        return sid.value

    def free(self, seq: int) -> None:
        """Drop a sequence; blocks no other sequence holds are freed (and
        their pager blocks discarded, not written back)."""
        self._seq("KVCache.free", seq)
        with self._call() as h:
            check(lib.kvp_kvcache_seq_free(h, seq), "kvp_kvcache_seq_free")

    def sequences(self) -> list[int]:
        """The live sequence ids, in order."""
        with self._call() as h:
            n = lib.kvp_kvcache_seq_list(h, self._ids, len(self._ids))
        return list(self._ids[:n])

    def tokens(self, seq: int) -> int:
        """Tokens held by sequence @seq."""
        seq = self._seq("KVCache.tokens", seq)
        with self._call() as h:
            return lib.kvp_kvcache_seq_tokens(h, seq)

    def block_table(self, seq: int) -> np.ndarray:
        """The sequence's block table: physical block of each logical
        block (a copy: the table changes with appends)."""
        seq = self._seq("KVCache.block_table", seq)
        with self._call() as h:
            bt = lib.kvp_kvcache_seq_table(h, seq)
            n = lib.kvp_block_table_blocks(bt)
            if not n:
                return np.empty(0, dtype=np.uint32)
            return np.ctypeslib.as_array(lib.kvp_block_table_map(bt),
                                         (n,)).copy()

    def format_block_table(self, seq: int) -> str:
        """The table as text, one line per logical block: logical,
        physical, valid tokens, reference count, where it is ("rolling",
        or the pager block's state)."""
        self._seq("KVCache.format_block_table", seq)
        with self._call() as h:
            need = check(lib.kvp_kvcache_format_block_table(h, seq, None,
                                                            0),
                         "kvp_kvcache_format_block_table")
            buf = ctypes.create_string_buffer(need + 1)
            lib.kvp_kvcache_format_block_table(h, seq, buf, need + 1)
        return buf.value.decode()

    def kv_block(self, layer: int, pblock: int) -> np.ndarray:
        """A numpy view [2, kv_heads, G, head_dim] (K then V) of physical
        block @pblock of @layer where the cache keeps it (the region on
        the pager backend: reading faults it in).  A sequence's newest,
        partly filled block is held outside, in RAM, until it fills: its
        physical block has no data yet.  The cache cannot close while the
        view lives."""
        with self._call() as h:  # a copy: the layout is the cache's
            lay = Layout.from_buffer_copy(lib.kvp_kvcache_layout(h).contents)
        if not 0 <= layer < lay.geo.layers or \
                not 0 <= pblock < lay.capacity_blocks:
            raise invalid("KVCache.kv_block", f"layer {layer}, block "
                          f"{pblock}: past {lay.geo.layers} layers of "
                          f"{lay.capacity_blocks} blocks")
        base = self._base()
        g = self.geometry
        off = layer * lay.layer_bytes + pblock * lay.block_stride
        return view(self, base + off, g.block_bytes, g.np_dtype,
                    block_view_shape(g))

    def _base(self) -> int:
        with self._call() as h:
            r = lib.kvp_kvcache_region(h)
            if not r:
                raise invalid("KVCache.kv_block", f"the {self.backend} "
                              f"backend has no region to view")
            return lib.kvp_region_addr(r)

    # --- K/V in, attention out ---------------------------------------------

    def append(self, seq: int, k: np.ndarray, v: np.ndarray) -> None:
        """Append the K and V of ntokens tokens to sequence @seq, all
        layers: @k and @v of shape [layers, ntokens, kv_heads, head_dim],
        in the geometry's type (read in place) or float32 (converted).
        Full KV blocks go to the backing store, the partial last one stays
        in RAM.  The lowrank predictor fits its projection from the first
        append of at least 64 tokens.  On failure the sequence may hold
        part of the tokens: free it."""
        call = "KVCache.append"
        self._seq(call, seq)
        g = self.geometry
        k = to_kv_dtype(g, k, call)
        v = to_kv_dtype(g, v, call)
        if k.ndim != 4 or k.shape != v.shape or \
                k.shape[0] != g.layers or k.shape[2:] != (g.kv_heads,
                                                         g.head_dim):
            raise invalid(call, f"K and V have shapes {k.shape} and "
                          f"{v.shape}; expected (layers={g.layers}, "
                          f"ntokens, kv_heads={g.kv_heads}, "
                          f"head_dim={g.head_dim})")
        t0 = self.tokens(seq)

        def kv(s, layer, token, n):
            return k[layer, token - t0:token - t0 + n], \
                v[layer, token - t0:token - t0 + n]

        cb = _Callbacks(g, kv, None)
        with self._call() as h:
            rc = lib.kvp_kvcache_prefill(h, seq, k.shape[1], byref(cb.c),
                                         None, None)
        cb.raise_pending()
        check(rc, "kvp_kvcache_prefill", f"{k.shape[1]} tokens to "
              f"sequence {seq}")

    def prefill(self, seq: int, ntokens: int, source: SynthSource) -> None:
        """Append @ntokens tokens of sequence @seq generated by @source, a
        C source, with no Python in the loop (benchmarks and tests at
        long contexts, where arrays for append would not fit)."""
        self._seq("KVCache.prefill", seq)
        if not isinstance(source, SynthSource):
            raise invalid("KVCache.prefill", "the source must be a "
                          "SynthSource; append() takes arrays")
        with self._call() as h, source._call():
            check(lib.kvp_kvcache_prefill(h, seq, ntokens, byref(source.c),
                                          None, None),
                  "kvp_kvcache_prefill",
                  f"{ntokens} tokens to sequence {seq}")

    def step(self, seqs: Sequence[int] | int, source, *,
             out: np.ndarray | None = None) -> np.ndarray:
        """One decode step of @seqs (an id or a list): append one token to
        each, every layer, and compute every layer's attention over the
        predictor's blocks and the newest ones.  @source is a
        KVSourceProtocol object (K, V and query in Python) or a
        SynthSource (all in C).  Returns @out (allocated when None),
        float32 [len(seqs), layers, q_heads, head_dim]; layer l of it is
        written before the source is asked for layer l+1.  The step's
        figures are in self.step_stats.  An exception from the source is
        raised here; the cache is consistent but the step half done."""
        call = "KVCache.step"
        ids = np.atleast_1d(np.asarray(seqs)).astype(np.uint32)
        live = set(self.sequences())
        if not ids.size or any(int(i) not in live for i in ids):
            raise invalid(call, f"sequences {list(map(int, ids))} are not "
                          f"all live ({sorted(live)} are)")
        g = self.geometry
        shape = (ids.size, g.layers, g.q_heads, g.head_dim)
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        elif out.shape != shape or out.dtype != np.float32 or \
                not out.flags.c_contiguous:
            raise invalid(call, f"out must be C-contiguous float32 {shape}")
        synth = isinstance(source, SynthSource)
        if synth:
            cb, src = None, source.c
        else:
            # A step appends one token: [kv_heads, head_dim] -> [1, ...]
            cb = _Callbacks(g, lambda s, layer, t, n: tuple(
                np.asarray(a)[None] for a in source.kv(s, layer, t)),
                source.query)
            src = cb.c
        st = StepStats()
        with self._call() as h, \
                (source._call() if synth else contextlib.nullcontext()):
            rc = lib.kvp_kvcache_step(h, address(ids), ids.size, byref(src),
                                      address(out), byref(st))
        if cb:
            cb.raise_pending()
        check(rc, "kvp_kvcache_step", f"sequences {list(map(int, ids))}")
        self.step_stats = as_dict(st)
        return out

    def drain(self) -> None:
        """Wait for and release the prefetches planned for a next step."""
        with self._call() as h:
            lib.kvp_kvcache_drain(h)

    def stats(self) -> dict:
        """Totals since creation (struct kvp_kvcache_stats): "sum" of the
        steps' figures, prefill time, tokens and bytes, copies on write,
        discarded pager blocks, refused pins."""
        st = KvcacheStats()
        with self._call() as h:
            lib.kvp_kvcache_stats(h, byref(st))
        return as_dict(st)

    @property
    def budget_bytes(self) -> int:
        """The RAM budget in force for the KV."""
        with self._call() as h:
            return lib.kvp_kvcache_budget_bytes(h)

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V held by live sequences."""
        with self._call() as h:
            return lib.kvp_kvcache_kv_bytes(h)

    def pager_stats(self) -> dict:
        """The statistics of the cache's region (pager backend)."""
        from ._native import Stats
        from .pager import stats_dict
        st = Stats()
        with self._call() as h:
            r = lib.kvp_kvcache_region(h)
            if not r:
                raise invalid("KVCache.pager_stats", f"the {self.backend} "
                              f"backend has no pager")
            lib.kvp_region_stats(r, byref(st))
        return stats_dict(st)

    def close(self) -> None:
        """Free every sequence, stop the cache's threads, destroy its
        region (and its pager and store, when it made them).  EBUSY while
        a kv_block view lives, or while a step, an append or a prefill
        runs (a source's callback closing it, another thread)."""
        h = self._take("KVCache.close", f"cache {self.name}")
        if not h:
            return
        lib.kvp_kvcache_destroy(h)
        if self.store:
            self.store._root()._claims.pop(self, None)
            self.store._users -= 1
        if self.pager:
            self.pager._children.discard(self)
            self.pager._release()


class Attention(Handle):
    """Decode attention on the CPU (lib/kv/attention.h) over KV blocks in
    numpy memory, a region's included, with a pool of @threads (0: one
    per CPU, 1: the caller alone).  A context manager."""

    def __init__(self, geometry: KVGeometry, threads: int = 0):
        self.geometry = geometry
        self._g = geometry.c()
        self._gref = byref(self._g)
        self._block_bytes = geometry.block_bytes
        self._qfloats = geometry.q_heads * geometry.head_dim
        h = c_void_p()
        u64("Attention", "threads", integer("Attention", "threads", threads),
            32)
        check(lib.kvp_attn_pool_create(threads, byref(h)),
              "kvp_attn_pool_create", f"{threads} threads")
        self._h = h.value

    def __call__(self, kv: np.ndarray, q: np.ndarray, *,
                 index: np.ndarray | None = None,
                 ntokens: np.ndarray | None = None,
                 out: np.ndarray | None = None) -> np.ndarray:
        """out[h] = softmax(q[h] . K / sqrt(head_dim)) V over KV blocks.

        @kv: an array whose first axis counts KV blocks: row i, at
        kv.strides[0] bytes from row 0, C-contiguous, holds one KV block
        of the geometry's layout in its first bytes (a region's array
        reshaped to [blocks, stride], or to [blocks, pager block] to
        give each KV block a pager block of its own).  The blocks read
        are @index (None: all), each with @ntokens valid slots (None: all
        G).  Nothing is copied: the C call gets pointers.
        @q: [q_heads, head_dim] float32.  Returns @out (allocated when
        None), float32 [q_heads, head_dim]."""
        call = "Attention"
        g = self.geometry
        bb = self._block_bytes
        row = kv.strides[0] if kv.ndim > 1 else 0
        if kv.ndim < 2 or not kv[0].flags.c_contiguous or \
                kv[0].nbytes < bb or row < bb:
            raise invalid(call, f"kv must hold one KV block ({bb} bytes, "
                          f"C-contiguous) per row of its first axis")
        if index is None:
            idx = self._iota(kv.shape[0])
        else:
            idx = np.asarray(index)
            if idx.ndim != 1 or idx.dtype.kind not in "iu" or \
                    (idx.size and (int(idx.min()) < 0 or
                                   int(idx.max()) >= kv.shape[0])):
                raise invalid(call, f"index must list blocks below "
                              f"{kv.shape[0]}")
        # Into a buffer kept between calls: fresh memory costs a fault
        # per page here, more than the arithmetic.
        ptrs = self._scratch("_ptrs", idx.size)
        np.multiply(idx, np.uintp(row), out=ptrs, casting="unsafe")
        ptrs += np.uintp(address(kv))
        q = np.ascontiguousarray(q, dtype=np.float32)
        if q.size != self._qfloats:
            raise invalid(call, f"q has {q.size} floats; expected "
                          f"{g.q_heads} x {g.head_dim}")
        if out is None:
            out = np.empty((g.q_heads, g.head_dim), dtype=np.float32)
        elif out.dtype != np.float32 or not out.flags.c_contiguous or \
                out.size != q.size or not out.flags.writeable:
            raise invalid(call, f"out must be a writeable C-contiguous "
                          f"float32 array of {q.size} floats")
        b = AttnBlocks(address(ptrs), None, idx.size)
        if ntokens is not None:
            nt = np.ascontiguousarray(ntokens, dtype=np.uint32)
            if nt.shape != idx.shape:
                raise invalid(call, "ntokens needs one entry per block")
            b.ntokens = address(nt)
        with self._call() as h:
            rc = lib.kvp_attn_decode(self._gref, byref(b), address(q),
                                     address(out), h)
        if rc:
            check(rc, "kvp_attn_decode", f"{idx.size} blocks")
        return out

    def _scratch(self, name: str, n: int) -> np.ndarray:
        buf = getattr(self, name, None)
        if buf is None or buf.size < n:
            buf = np.empty(max(n, 1024), dtype=np.uintp)
            setattr(self, name, buf)
        return buf[:n]

    def _iota(self, n: int) -> np.ndarray:
        """0 .. n-1, kept between calls."""
        buf = getattr(self, "_iota_buf", None)
        if buf is None or buf.size < n:
            buf = self._iota_buf = np.arange(max(n, 1024), dtype=np.uintp)
        return buf[:n]

    @property
    def threads(self) -> int:
        with self._call() as h:
            return lib.kvp_attn_pool_threads(h)

    def close(self) -> None:
        """EBUSY while a call runs in another thread."""
        h = self._take("Attention.close", "the attention pool")
        if h:
            lib.kvp_attn_pool_destroy(h)


def simd_name() -> str:
    """The attention code path here: "avx2+f16c" or "scalar"."""
    return lib.kvp_attn_simd_name().decode()
