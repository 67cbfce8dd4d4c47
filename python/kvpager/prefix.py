"""The prefix cache and the remote tier: a prompt's KV, chunk by chunk,
stored by content in a cache directory on a local disk (lib/cache) and,
below it, in Redis shared by other instances (lib/remote), found again by
the next process that sees the same prompt.

A PrefixCache is what `kvpager run --model M --cache-dir DIR [--remote
URL]` uses (lib/model/model_cache.c), for an engine written in Python:

    with kvpager.PrefixCache("/var/cache/kvp", model="my-model",
                             geometry=g, chunk_tokens=64) as px:
        px.set_prompt(prompt)              # the chunks' keys
        buf = px.chunk_array()
        for i in range(px.restorable):     # leading chunks stored before?
            if not px.get(i, buf):
                break                      # a miss: compute from here
            ...put buf's K and V in place of computing them...
        ...compute the rest; for each full chunk i computed:
        px.put(i, payload)                 # stored behind the caller

Chunk i holds tokens [i * C, (i + 1) * C) of the prompt; its key (a
BLAKE2b-256 hash, block_record.h) binds the model's identity, the
geometry, the chunk size and the payload's format, the namespace salt
and every token before it, so a chunk is found only under the same model,
salt and prefix.  Its payload is `kvpager run --model`'s chunk format
(lib/model/model.h), asked of the library, never restated here: when G
(the geometry's block_tokens) divides C, the chunk's C / G KV blocks per
layer in the KV cache's block format, the bytes a KV cache's region holds
for them ([layers, C / G, block_stride] bytes; each block K then V of G
tokens of every KV head, [2, kv_heads, G, head_dim], padded with zeros to
the stride); otherwise, per layer and token, K then V ([layers, C, 2,
kv_heads, head_dim]).  chunk_kv() views either as K and V.  What was
stored is verified when it is read (checksum, or authentication when
encrypted): a torn, damaged or foreign chunk is a counted miss, never
served.  Only encrypted (sealed) chunks stand against someone who may
write the directory or the Redis: a plain chunk's checksum has no key.
"""

from __future__ import annotations

import ctypes
import errno
import os
from ctypes import byref, c_uint32, c_void_p
from typing import Sequence

import numpy as np

from . import _abi
from ._native import (CacheOpts, CacheStats, Handle, KvpagerError,
                      ModelRemoteOpts, ModelRemoteStats, PrefixOpts,
                      PrefixStats, RecCipher, RecKey, RecKeyCtx, RemoteStats,
                      address, as_dict, busy, check, closed, invalid, lib)
from .kv import DTYPES, KVGeometry, block_view_shape
from .pager import integer, u64

ERR_MAX = 512


def _hash(data: bytes | memoryview | np.ndarray, what: str) -> bytes:
    """BLAKE2b-256 of @data (kvp_rec_hash: the library's, so that the keys
    are the C tools' keys)."""
    a = np.frombuffer(data, dtype=np.uint8) if not isinstance(
        data, np.ndarray) else data
    out = (ctypes.c_uint8 * 32)()
    check(lib.kvp_rec_hash(address(a) if a.size else None, a.size, out),
          "kvp_rec_hash", what)
    return bytes(out)


def _file_hash(path: str) -> bytes:
    """The hash of a whole file, as `kvpager run --model` names a model by
    its checkpoint's bytes; mapped, not read into memory."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise KvpagerError(e.errno, "PrefixCache", f"model_file {path}: "
                           f"{e.strerror}") from None
    if not size:
        raise invalid("PrefixCache", f"model_file {path} is empty")
    m = np.memmap(path, dtype=np.uint8, mode="r")
    try:
        return _hash(m, f"model_file {path}")
    finally:
        del m


def _cipher(key: str | bytes | None, key_file: str | None) -> RecCipher | None:
    """The cipher key of @key (64 hex digits, or 32 raw bytes) or of the
    file @key_file (which others may not read), as the C cache parses
    them; None for plain records.  Errors never show the key."""
    if key is not None and key_file is not None:
        raise invalid("PrefixCache", "give key or key_file, not both")
    if key is None and key_file is None:
        return None
    c = RecCipher()
    err = ctypes.create_string_buffer(ERR_MAX)
    if key_file is not None:
        check(lib.kvp_cache_cipher_load(os.fsencode(key_file), byref(c), err,
                                        ERR_MAX), "kvp_cache_cipher_load",
              err.value.decode() or key_file)
    else:
        raw = key.encode() if isinstance(key, str) else bytes(key)
        check(lib.kvp_cache_cipher_parse(raw, len(raw), byref(c), err,
                                         ERR_MAX), "kvp_cache_cipher_parse",
              err.value.decode())
    return c


def _stats(st, kinds: Sequence[tuple[str, str]]) -> dict:
    """A statistics structure whose fields are declared with their kind:
    a counter named as the view and metrics name it (<name>_total)."""
    return {n + ("_total" if k == "counter" and not n.endswith("_total")
                 else ""): getattr(st, n) for n, k in kinds}


class PrefixCache(Handle):
    """A cache directory of prompts' KV chunks, and optionally the Redis
    tier below it (lib/cache/prefix.h, lib/model/model_remote.h).

    @directory: the cache directory (created 0700 if absent; one process
    at a time: EBUSY while another has it open).  The model's identity is
    @model (a name) or @model_file (the hash of the whole file, as
    `kvpager run --model` names its checkpoint); @geometry its KV
    geometry; @chunk_tokens C, the tokens per stored chunk (a power of two
    up to 256); @prefill_window: the tokens a prompt token attends to
    in the engine's prefill (0: all), which the keys bind too, as
    `kvpager run --model` binds its own.  @salt: the
    namespace (a tenant); chunks stored under one salt are never found
    under another.  @capacity: the directory's bytes at most (an int or
    text such as "64G"; 0: no limit), least recently used chunks removed
    first.  @key (64 hex digits) or @key_file: encrypt at rest
    (XChaCha20-Poly1305); the key is never shown.  @read_only: never
    write (puts are counted as failed).  @verify_at_open: read and verify
    every chunk at open instead of only its header.

    @remote: a URL (redis://host:port[/db], redis+cluster://...; see the
    README) of the tier below the directory: a chunk missing here is
    fetched from Redis (@remote_window chunks ahead, 0: 4) and kept in
    the directory; a chunk put goes to both, neither waiting.  A server
    that is down is not an error: its fetches are misses, counted.

    A context manager; close() waits for the chunks still being written
    (and up to @flush_timeout seconds for Redis publishes).
    """

    _closing = False  # close() began: no call may start

    def __init__(self, directory: str, *, geometry: KVGeometry,
                 model: str | None = None, model_file: str | None = None,
                 chunk_tokens: int = 64, prefill_window: int = 0,
                 salt: str | None = None, capacity: int | str = 0,
                 key: str | bytes | None = None, key_file: str | None = None,
                 read_only: bool = False, verify_at_open: bool = False,
                 remote: str | None = None, remote_window: int = 0,
                 queue_bytes: int = 0, flush_timeout: float = 30.0):
        call = "PrefixCache"
        C = int(chunk_tokens)
        if C < 1 or C > 256 or C & (C - 1):
            raise invalid(call, f"chunk_tokens {chunk_tokens}: a power of "
                          f"two up to 256")
        if (model is None) == (model_file is None):
            raise invalid(call, "name the model: model= (a name) or "
                          "model_file= (its weights' file), one of them")
        if not 0 <= remote_window <= _abi.MODEL_REMOTE_MAX_WINDOW:
            raise invalid(call, f"remote_window {remote_window}: 0 .. "
                          f"{_abi.MODEL_REMOTE_MAX_WINDOW}")
        g = geometry.c()
        ctx = RecKeyCtx()
        ident = _file_hash(model_file) if model_file is not None else \
            _hash(model.encode(), "model")
        ctx.model[:] = ident
        if salt is not None:
            ctx.salt[:] = _hash(salt.encode(), "salt")
        if not 0 <= int(prefill_window) < 1 << 32:
            raise invalid(call, f"prefill_window {prefill_window}: 0 .. "
                          f"2^32-1")
        # the chunk format's words, as kvpager run --model makes them
        lib.kvp_model_chunk_keygeo(byref(g), C, int(prefill_window),
                                   ctx.geo)
        if isinstance(capacity, str):
            v = ctypes.c_uint64()
            check(lib.kvp_parse_bytes(capacity.encode(), byref(v)), call,
                  f"capacity '{capacity}' is not a size (64G, 512M)")
            capacity = v.value
        u64(call, "capacity", integer(call, "capacity", capacity))
        cipher = _cipher(key, key_file)
        opts = CacheOpts(capacity_bytes=int(capacity),
                         cipher=ctypes.pointer(cipher) if cipher else None,
                         read_only=read_only, verify_at_open=verify_at_open)
        err = ctypes.create_string_buffer(ERR_MAX)
        warn = ctypes.create_string_buffer(ERR_MAX)
        self._cache = self._prefix = self._remote = None
        self.geometry = geometry
        self.directory = directory
        self.chunk_tokens = C
        self.flush_timeout = flush_timeout
        self._nkeys = 0
        self._ntokens = 0
        h = c_void_p()
        try:
            check(lib.kvp_cache_open(os.fsencode(directory), byref(opts),
                                     byref(h), err, ERR_MAX, warn, ERR_MAX),
                  "kvp_cache_open", err.value.decode() or directory)
            self._cache = h.value
            #: the cache's warning at open ("" when none): a read-only
            #: directory opened for reading only, say
            self.warning = warn.value.decode()
            po = PrefixOpts(cache=self._cache, ctx=ctx,
                            queue_bytes=int(queue_bytes))
            h = c_void_p()
            check(lib.kvp_prefix_create(byref(po), byref(h)),
                  "kvp_prefix_create")
            self._prefix = h.value
            self._h = self._prefix
            if remote is not None:
                ro = ModelRemoteOpts(
                    url=remote.encode(), prefix=self._prefix,
                    ctx=ctypes.pointer(ctx),
                    cipher=ctypes.pointer(cipher) if cipher else None,
                    window=remote_window)
                h = c_void_p()
                check(lib.kvp_model_remote_open(byref(ro), byref(h), err,
                                                ERR_MAX),
                      "kvp_model_remote_open", err.value.decode())
                self._remote = h.value
        except BaseException:
            self._shut(0)
            raise
        finally:
            if cipher:  # the cache and the tier keep copies
                ctypes.memset(byref(cipher), 0, ctypes.sizeof(cipher))
        # the hot calls: the tier's get and put when there is one
        self._get, self._put, self._arg = \
            (lib.kvp_model_remote_get, lib.kvp_model_remote_put,
             self._remote) if self._remote else \
            (lib.kvp_prefix_get, lib.kvp_prefix_put, self._prefix)
        #: bytes of one chunk's payload
        self.chunk_bytes = lib.kvp_model_chunk_bytes(byref(g), C)
        #: True: a payload is whole KV blocks in their format (G divides
        #: C); False: per token, K then V
        self.in_blocks = bool(lib.kvp_model_chunk_in_blocks(byref(g), C))
        self._tokens = np.empty(0, dtype=np.uint32)

    # --- the prompt ---------------------------------------------------------

    def set_prompt(self, tokens: Sequence[int] | np.ndarray) -> int:
        """The prompt whose chunks the next gets and puts name: the keys
        of its len(tokens) // C full chunks, returned.  Chunks already
        queued for writing keep their keys."""
        call = "PrefixCache.set_prompt"
        t = np.asarray(tokens)
        if t.ndim != 1 or (t.size and (t.dtype.kind not in "iu" or
                                       int(t.min()) < 0 or
                                       int(t.max()) >= 1 << 32)):
            raise invalid(call, "tokens must be a list of token ids "
                          "(0 .. 2^32-1)")
        t = np.ascontiguousarray(t, dtype=np.uint32)
        with self._call() as h:
            check(lib.kvp_prefix_set_prompt(
                h, t.ctypes.data_as(ctypes.POINTER(c_uint32)), t.size,
                self.chunk_tokens), "kvp_prefix_set_prompt",
                f"{t.size} tokens")
        self._tokens = t
        self._ntokens = t.size
        self._nkeys = t.size // self.chunk_tokens
        return self._nkeys

    @property
    def chunks(self) -> int:
        """Full chunks of the prompt: the ones get and put may name."""
        return self._nkeys

    @property
    def restorable(self) -> int:
        """The chunks before the one holding the prompt's last token: an
        engine takes at most these from the cache, because the last
        token's logits must be computed anyway."""
        return (self._ntokens - 1) // self.chunk_tokens \
            if self._ntokens else 0

    def key(self, chunk: int) -> str:
        """Chunk @chunk's key as 64 hex digits: its file in the directory
        is <key>.kvb."""
        k = RecKey()
        chunk = self._chunk("PrefixCache.key", chunk)
        with self._call() as h:
            check(lib.kvp_prefix_key(h, chunk, byref(k)), "kvp_prefix_key")
        out = ctypes.create_string_buffer(65)
        lib.kvp_rec_key_hex(byref(k), out)
        return out.value.decode()

    def cached_chunks(self) -> int:
        """How many leading chunks of the prompt the directory holds, by
        its index (no I/O; a get may still find one torn, and the remote
        tier is not asked)."""
        k = RecKey()
        n = 0
        with self._call() as h:
            while n < self._nkeys and \
                    not lib.kvp_prefix_key(h, n, byref(k)) and \
                    lib.kvp_cache_contains(self._cache, byref(k)):
                n += 1
        return n

    def _chunk(self, call: str, chunk: int) -> int:
        if not 0 <= chunk < self._nkeys:
            raise invalid(call, f"chunk {chunk}: the prompt has "
                          f"{self._nkeys} full chunks of "
                          f"{self.chunk_tokens} tokens")
        return int(chunk)

    def _buffer(self, call: str, a: np.ndarray, write: bool) -> int:
        if not isinstance(a, np.ndarray) or not a.flags.c_contiguous or \
                a.nbytes != self.chunk_bytes or \
                (write and not a.flags.writeable):
            raise invalid(call, f"the payload must be a C-contiguous"
                          f"{' writeable' if write else ''} array of "
                          f"{self.chunk_bytes} bytes (chunk_array())")
        return address(a)

    # --- chunks in and out --------------------------------------------------

    def _shape(self) -> tuple:
        g = self.geometry
        if self.in_blocks:
            return (g.layers, self.chunk_tokens // g.block_tokens,
                    g.block_stride // g.np_dtype.itemsize)
        return (g.layers, self.chunk_tokens, 2, g.kv_heads, g.head_dim)

    def chunk_array(self) -> np.ndarray:
        """A zeroed payload of one chunk in the geometry's type (bf16 as
        uint16): [layers, C / G, block_stride / itemsize], a KV block per
        row, when in_blocks; else [layers, C, 2, kv_heads, head_dim].
        chunk_kv() views its K and V."""
        return np.zeros(self._shape(), dtype=self.geometry.np_dtype)

    def chunk_kv(self, payload: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Views (no copy) of the K and V in @payload (a C-contiguous
        array of chunk_bytes in the geometry's type: chunk_array()'s):
        each [layers, C / G, kv_heads, G, head_dim], a KV block's order,
        when in_blocks; else [layers, C, kv_heads, head_dim]."""
        g = self.geometry
        self._buffer("PrefixCache.chunk_kv", payload, False)
        if payload.dtype != g.np_dtype:
            raise invalid("PrefixCache.chunk_kv", f"a payload of "
                          f"{payload.dtype}: the geometry's is {g.np_dtype}")
        a = payload.reshape(self._shape())
        if not self.in_blocks:
            return a[:, :, 0], a[:, :, 1]
        n = g.block_bytes // g.np_dtype.itemsize  # the padding left out
        b = a[:, :, :n].reshape(a.shape[:2] + block_view_shape(g))
        return b[:, :, 0], b[:, :, 1]

    def get(self, chunk: int, out: np.ndarray) -> bool:
        """Read chunk @chunk's payload into @out (any C-contiguous array
        of chunk_bytes; no copy on the way).  True: a hit, verified.
        False: a miss (absent, or dropped by verification as torn,
        tampered or foreign, or unreadable: the statistics count each);
        compute the chunk then.  With a remote tier a chunk missing in the
        directory is fetched from Redis and kept in the directory."""
        call = "PrefixCache.get"
        with self._call():
            rc = self._get(self._arg, self._chunk(call, chunk),
                           self._buffer(call, out, True), self.chunk_bytes)
        # Every error of a get is a miss by the cache's contract (the
        # read error included: the engine computes instead), but memory.
        if rc == -errno.ENOMEM:
            raise KvpagerError(errno.ENOMEM, "kvp_prefix_get",
                               f"chunk {chunk}")
        return rc == 0

    def put(self, chunk: int, payload: np.ndarray) -> None:
        """Offer chunk @chunk's payload (chunk_bytes, C-contiguous): it is
        copied into the writer's queue and stored behind the caller (and
        published to Redis); put waits only when the queue is full.
        Whether it was stored shows in stats()["prefix"] once drained."""
        call = "PrefixCache.put"
        with self._call():
            self._put(self._arg, self._chunk(call, chunk),
                      self._buffer(call, payload, False), self.chunk_bytes)

    def drain(self) -> None:
        """Wait until every chunk put is stored in the directory (or
        failed)."""
        with self._call() as h:
            lib.kvp_prefix_drain(h)

    # --- figures --------------------------------------------------------------

    def stats(self) -> dict:
        """{"cache": the directory's figures (blocks, bytes, hits_total,
        misses_total, dropped_torn_total, dropped_unauth_total,
        puts_total, ...: cache_dir.h's), "prefix": the chunks asked for
        and offered (lookups, hit_chunks, queued, stored, failed,
        queue_waits), and with a remote tier "remote": the tier's
        (hits_total, misses_total, verify_failed_total, errors_total,
        publishes_total, publishes_skipped_total, ..., fetch_latency_us)
        and the glue's (chunks_fetched, chunks_missed, chunks_published,
        publish_skipped, chunks_mapped, dir_skipped)}."""
        cs, ps = CacheStats(), PrefixStats()
        ms, rs = ModelRemoteStats(), RemoteStats()
        with self._call():
            lib.kvp_cache_stats(self._cache, byref(cs))
            lib.kvp_prefix_stats(self._prefix, byref(ps))
            if self._remote:
                lib.kvp_model_remote_stats(self._remote, byref(ms),
                                           byref(rs))
        out = {"cache": _stats(cs, _abi.CACHE_STATS), "prefix": as_dict(ps)}
        if self._remote:
            out["remote"] = {**_stats(rs, _abi.REMOTE_STATS),
                             "fetch_latency_us": list(rs.fetch_latency_us),
                             **as_dict(ms)}
        return out

    @property
    def remote_url(self) -> str | None:
        """The remote tier's URL without its password, or None."""
        return lib.kvp_model_remote_url(self._remote).decode() \
            if self._remote else None

    # --- lifetime -----------------------------------------------------------

    def _live(self) -> int:
        if not self._prefix or self._closing:
            raise closed("PrefixCache",
                         "the prefix cache is closed")
        return self._prefix

    def _shut(self, flush_ms: int) -> None:
        if self._remote:
            lib.kvp_model_remote_close(self._remote, flush_ms)
            self._remote = None
        if self._prefix:
            lib.kvp_prefix_destroy(self._prefix)
            self._prefix = None
        if self._cache:
            lib.kvp_cache_close(self._cache)
            self._cache = None
        self._h = None

    def close(self) -> None:
        """Wait for the chunks still queued (and up to flush_timeout
        seconds for Redis publishes, which another instance may be about
        to read), then close; the stored chunks stay for the next
        process.  EBUSY while a get, a put or a drain runs in another
        thread."""
        with self._lock:
            if not self._prefix or self._closing:
                return
            if self._busy:
                raise busy("PrefixCache.close", "a get, put or drain is in "
                           "progress in another thread: close it once "
                           "that call has returned")
            self._closing = True  # no call starts from here
        self._shut(max(1, int(self.flush_timeout * 1000)))
