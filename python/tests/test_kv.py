"""The KV cache through the binding: K/V appended from numpy, decode steps
whose attention matches a numpy reference on every backend, forks, frees,
predictors, a source that fails, and Attention over a region."""

import errno

import numpy as np
import pytest

import kvpager
from kvpager import KVCache, KVGeometry, KvpagerError

from conftest import run_python

G = KVGeometry.preset("tiny")  # 2 layers, 4 q heads, 2 KV heads, dim 16


def ref_attention(g, K, V, q):
    """Plain numpy decode attention: K, V [tokens, kv_heads, dim] (float64
    accumulation), q [q_heads, dim] -> [q_heads, dim]."""
    K = K.astype(np.float64)
    V = V.astype(np.float64)
    group = g.q_heads // g.kv_heads
    out = np.empty((g.q_heads, g.head_dim))
    for h in range(g.q_heads):
        s = K[:, h // group, :] @ q[h] / np.sqrt(g.head_dim)
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ V[:, h // group, :]
    return out


class ArraySource:
    """K, V and queries from arrays: kv [layers, tokens, kv_heads, dim]."""

    def __init__(self, g, ntokens, seed):
        rng = np.random.default_rng(seed)
        shape = (g.layers, ntokens, g.kv_heads, g.head_dim)
        self.k = rng.standard_normal(shape, dtype=np.float32)
        self.v = rng.standard_normal(shape, dtype=np.float32)
        self.q = rng.standard_normal((g.layers, ntokens + 1, g.q_heads,
                                      g.head_dim), dtype=np.float32)
        self.calls = []

    def kv(self, seq, layer, token):
        self.calls.append(("kv", layer))
        return self.k[layer, token], self.v[layer, token]

    def query(self, seq, layer, pos):
        self.calls.append(("query", layer))
        return self.q[layer, pos]


def check_step(cache, seq, src, n):
    """Step @seq (holding tokens 0..n-1 of src) with token n; compare
    every layer with the reference over tokens 0..n."""
    out = cache.step(seq, src)
    for layer in range(G.layers):
        want = ref_attention(G, src.k[layer, :n + 1], src.v[layer, :n + 1],
                             src.q[layer, n + 1])
        np.testing.assert_allclose(out[0, layer], want, rtol=2e-5,
                                   atol=2e-6)
    return out


@pytest.mark.parametrize("backend", ["pager", "ram", "mmap"])
@pytest.mark.parametrize("n", [1, 4, 37])
def test_append_then_step_matches_numpy(backend, n, tmp_path):
    src = ArraySource(G, n + 1, seed=n)
    with KVCache(G, capacity_tokens=256, backend=backend, budget="2M",
                 directory=str(tmp_path), pool_prefault_bytes=0) as c:
        s = c.new_sequence()
        c.append(s, src.k[:, :n], src.v[:, :n])
        assert c.tokens(s) == n
        check_step(c, s, src, n)
        assert c.tokens(s) == n + 1
        assert c.step_stats["steps"] == 1 and c.step_stats["tokens"] == 1


def test_pager_under_budget_is_bit_identical_to_ram():
    """4 sequences of 900 tokens (7 MiB of KV) under the smallest budget
    (2 MiB), pager blocks of 64 KiB: every step evicts and reloads, and
    the outputs equal the all-in-RAM cache's bit for bit."""
    g = KVGeometry.preset("tiny", head_dim=64)  # 1 KiB per token and layer
    srcs = [ArraySource(g, 912, seed=s) for s in range(4)]
    outs = {}
    for backend in ("ram", "pager"):
        with KVCache(g, capacity_tokens=4 * 1024, max_seqs=4,
                     backend=backend, budget="2M", pager_block_bytes=64 << 10,
                     pool_prefault_bytes=0) as c:
            ids = [c.new_sequence() for _ in srcs]
            for s, src in zip(ids, srcs):
                c.append(s, src.k[:, :900], src.v[:, :900])
            res = []
            for t in range(900, 906):
                class Batch:  # sequence id -> its source
                    def kv(self, seq, layer, token):
                        return srcs[seq].kv(seq, layer, token)

                    def query(self, seq, layer, pos):
                        return srcs[seq].query(seq, layer, pos)
                res.append(c.step(ids, Batch()).copy())
            if backend == "pager":
                assert c.pager_stats()["bytes_read_total"] > 6 * (2 << 20)
            outs[backend] = np.stack(res)
    assert np.array_equal(outs["ram"], outs["pager"])


def test_layer_order_lets_a_model_use_the_previous_output():
    """The source is asked for layer l after layer l-1's output is in the
    step's array: what a real model's forward pass needs."""
    src = ArraySource(G, 9, seed=3)
    seen = []
    with KVCache(G, capacity_tokens=64, backend="ram") as c:
        s = c.new_sequence()
        c.append(s, src.k[:, :8], src.v[:, :8])
        out = np.full((1, G.layers, G.q_heads, G.head_dim), np.nan,
                      dtype=np.float32)

        class Model(ArraySource):
            def kv(self, seq, layer, token):
                seen.append((layer, bool(np.isnan(out[0, layer - 1]).any())
                             if layer else None))
                return super().kv(seq, layer, token)
        m = Model(G, 9, seed=3)
        c.step(s, m, out=out)
    assert seen == [(0, None), (1, False)]


def test_fork_shares_and_copies_on_write():
    src = ArraySource(G, 11, seed=5)
    other = ArraySource(G, 11, seed=6)
    other.k[:, :6] = src.k[:, :6]
    other.v[:, :6] = src.v[:, :6]
    with KVCache(G, capacity_tokens=256, max_seqs=3, budget="2M",
                 pool_prefault_bytes=0) as c:
        a = c.new_sequence()
        c.append(a, src.k[:, :10], src.v[:, :10])
        b = c.fork(a, 6)
        assert c.tokens(b) == 6 and sorted(c.sequences()) == [a, b]
        assert list(c.block_table(b)) == list(c.block_table(a)[:2])
        c.append(b, other.k[:, 6:10], other.v[:, 6:10])
        assert c.stats()["cow_copies"] == 1  # block 1 was shared, partial
        assert c.block_table(b)[1] != c.block_table(a)[1]
        check_step(c, b, other, 10)
        check_step(c, a, src, 10)  # the parent did not change
        c.free(a)
        assert c.sequences() == [b]
        with pytest.raises(KvpagerError) as e:
            c.tokens(a)
        assert e.value.errno == errno.EINVAL
        with pytest.raises(KvpagerError) as e:
            c.fork(b, 100)
        assert e.value.errno == errno.EINVAL


def test_too_many_sequences_and_no_room():
    with KVCache(G, capacity_tokens=16, max_seqs=2, backend="ram") as c:
        a = c.new_sequence()
        c.new_sequence()
        with pytest.raises(KvpagerError) as e:
            c.new_sequence()
        assert e.value.errno == errno.ENOSPC
        src = ArraySource(G, 64, seed=1)
        with pytest.raises(KvpagerError) as e:
            c.append(a, src.k, src.v)
        assert e.value.errno == errno.ENOSPC


@pytest.mark.parametrize("bad", [
    lambda s: (s.k[:, :4, :, :8], s.v[:, :4, :, :8]),  # head_dim wrong
    lambda s: (s.k[:1, :4], s.v[:1, :4]),  # one layer missing
    lambda s: (s.k[:, :4], s.v[:, :5]),  # K and V disagree
    lambda s: (s.k[:, :4].astype(np.int32), s.v[:, :4]),  # not floats
])
def test_bad_appends_refused_and_change_nothing(bad):
    src = ArraySource(G, 8, seed=2)
    with KVCache(G, capacity_tokens=64, backend="ram") as c:
        s = c.new_sequence()
        with pytest.raises(KvpagerError) as e:
            c.append(s, *bad(src))
        assert e.value.errno == errno.EINVAL
        assert c.tokens(s) == 0


def test_source_exception_propagates():
    src = ArraySource(G, 8, seed=2)

    class Broken(ArraySource):
        def kv(self, seq, layer, token):
            if layer == 1:
                raise ValueError("the model broke")
            return super().kv(seq, layer, token)

    with KVCache(G, capacity_tokens=64, max_seqs=2, backend="ram") as c:
        s = c.new_sequence()
        c.append(s, src.k[:, :4], src.v[:, :4])
        with pytest.raises(ValueError, match="the model broke"):
            c.step(s, Broken(G, 8, seed=2))

        class BadQuery(ArraySource):
            def query(self, seq, layer, pos):
                return np.zeros(3)
        t = c.new_sequence()
        c.append(t, src.k[:, :4], src.v[:, :4])
        with pytest.raises(KvpagerError, match="query of layer 0"):
            c.step(t, BadQuery(G, 8, seed=2))


def test_fp16_geometry_converts_float32_once():
    g = KVGeometry(layers=1, q_heads=2, kv_heads=1, head_dim=8,
                   dtype="fp16", block_tokens=4)
    rng = np.random.default_rng(4)
    k = rng.standard_normal((1, 6, 1, 8), dtype=np.float32)
    v = rng.standard_normal((1, 6, 1, 8), dtype=np.float32)
    q = rng.standard_normal((2, 8), dtype=np.float32)
    with KVCache(g, capacity_tokens=64, budget="2M",
                 pool_prefault_bytes=0) as c:
        s = c.new_sequence()
        c.append(s, k[:, :5], v[:, :5].astype(np.float16))
        blk = c.kv_block(0, int(c.block_table(s)[0]))
        assert blk.dtype == np.float16
        assert np.array_equal(blk[0, 0], k[0, :4, 0].astype(np.float16))
        del blk

        class One:
            def kv(self, seq, layer, token):
                return k[0, token], v[0, token]

            def query(self, seq, layer, pos):
                return q
        out = c.step(s, One())
    want = ref_attention(g, k[0].astype(np.float16), v[0].astype(np.float16),
                         q)
    np.testing.assert_allclose(out[0, 0], want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("predictor", ["exact", "window", "lowrank"])
def test_predictors_with_the_synthetic_source(predictor):
    g = KVGeometry.preset("tiny", head_dim=32)
    with kvpager.SynthSource(g, seed=7) as syn, \
            KVCache(g, capacity_tokens=2048, budget="2M",
                    predictor=predictor, predict_budget_tokens=64,
                    lowrank_rank=8, pool_prefault_bytes=0) as c:
        s = c.new_sequence()
        c.step(s, syn)  # a first token, then a prefill through steps
        for _ in range(3):
            c.step(s, syn)
        chosen = c.step_stats["chosen_blocks"]
        assert chosen >= 0
    # The cache over 1000 tokens: sparse predictors choose fewer blocks.
    with kvpager.SynthSource(g, seed=7) as syn, \
            KVCache(g, capacity_tokens=2048, budget="2M",
                    predictor=predictor, predict_budget_tokens=64,
                    lowrank_rank=8, pool_prefault_bytes=0) as c:
        s = c.new_sequence()
        for _ in range(260):
            c.step(s, syn)
        per_layer = c.step_stats["chosen_blocks"] / g.layers
        if predictor == "exact":  # the region's blocks, not the newest
            assert per_layer == (260 - 1) // 4
        else:
            assert per_layer <= 64 // 4 + 1


@pytest.mark.parametrize("kw,what", [
    ({"predictor": "oracle"}, "predictor"),
    ({"predict_budget_tokens": 1}, "predict_budget_tokens"),
    ({"backend": "disk"}, "backend"),
    ({"capacity_tokens": 0}, "kvp_kvcache_create"),
])
def test_bad_cache_options_refused(kw, what):
    opts = {"capacity_tokens": 64, "backend": "ram", **kw}
    with pytest.raises(KvpagerError) as e:
        KVCache(G, **opts)
    assert e.value.errno == errno.EINVAL and what in str(e.value)


def test_bad_geometry_refused():
    with pytest.raises(KvpagerError) as e:
        KVGeometry(layers=1, q_heads=3, kv_heads=2, head_dim=8).c()
    assert e.value.errno == errno.EINVAL
    with pytest.raises(KvpagerError) as e:
        KVGeometry.preset("gpt5")
    assert e.value.errno == errno.ENOENT and "gpt5" in str(e.value)
    assert "one of llama3-8b, qwen3-8b, tiny" in str(e.value)


def test_cache_on_a_given_pager_closes_with_it():
    p = kvpager.Pager(budget="4M", pool_prefault_bytes=0)
    c = KVCache(G, capacity_tokens=64, pager=p)
    s = c.new_sequence()
    src = ArraySource(G, 8, seed=1)
    c.append(s, src.k[:, :8], src.v[:, :8])
    with pytest.raises(KvpagerError) as e:
        KVCache(G, capacity_tokens=64, pager=p, budget="8M")
    assert e.value.errno == errno.EINVAL  # the budget is the pager's
    blk = c.kv_block(0, 0)
    with pytest.raises(KvpagerError) as e:
        p.close()
    assert e.value.errno == errno.EBUSY
    del blk
    p.close()
    with pytest.raises(KvpagerError) as e:
        c.tokens(s)
    assert e.value.errno == errno.EBADF


def test_attention_over_a_region_matches_numpy(pager):
    """Attention over KV blocks that live in a region (evicted and faulted
    back), chosen by index, the last one partly valid."""
    g = KVGeometry(layers=1, q_heads=8, kv_heads=2, head_dim=64,
                   dtype="fp32", block_tokens=16)
    stride = g.block_stride
    nblocks = (8 << 20) // stride  # twice the 4 MiB budget
    rng = np.random.default_rng(9)
    q = rng.standard_normal((g.q_heads, g.head_dim), dtype=np.float32)
    with pager.region(nblocks * stride, block_bytes=64 << 10) as r:
        kv = r.array(np.float32).reshape(nblocks, 2, g.kv_heads,
                                         g.block_tokens, g.head_dim)
        kv[:] = rng.standard_normal(kv.shape, dtype=np.float32)
        index = np.array([3, 0, nblocks - 1, 100])
        ntok = np.array([16, 16, 16, 5])
        with kvpager.Attention(g, threads=2) as attn:
            out = attn(kv, q, index=index, ntokens=ntok)
        K = np.concatenate([kv[i, 0, :, :n].swapaxes(0, 1)
                            for i, n in zip(index, ntok)])
        V = np.concatenate([kv[i, 1, :, :n].swapaxes(0, 1)
                            for i, n in zip(index, ntok)])
        np.testing.assert_allclose(out, ref_attention(g, K, V, q),
                                   rtol=2e-5, atol=2e-6)
        assert r.stats()["evictions_dirty_total"] > 0
        with kvpager.Attention(g, threads=1) as attn:
            with pytest.raises(KvpagerError) as e:
                attn(kv, q, index=[nblocks])
            assert e.value.errno == errno.EINVAL
            with pytest.raises(KvpagerError) as e:
                attn(kv, q, index=[0], ntokens=[17])
            assert e.value.errno == errno.EINVAL
        del kv, e  # the traceback's frames hold the view too


def test_attention_rows_may_be_padded():
    """Each KV block may sit at the start of a larger row (a pager block of
    its own); the result equals the packed layout's."""
    g = G  # 1 KiB KV blocks
    rng = np.random.default_rng(11)
    packed = rng.standard_normal((8, g.block_stride // 4),
                                 dtype=np.float32).view(np.uint8)
    padded = np.zeros((8, 4096), dtype=np.uint8)
    padded[:, :g.block_stride] = packed
    q = rng.standard_normal((g.q_heads, g.head_dim), dtype=np.float32)
    with kvpager.Attention(g, threads=1) as attn:
        want = attn(packed, q, index=[1, 5, 2])
        got = attn(padded, q, index=[1, 5, 2])
        assert np.array_equal(got, want)
        for bad in (np.empty((g.q_heads, g.head_dim), np.float64),
                    np.empty(3, np.float32)):
            with pytest.raises(KvpagerError) as e:
                attn(packed, q, out=bad)
            assert e.value.errno == errno.EINVAL
        with pytest.raises(KvpagerError) as e:
            attn(packed[:, :512], q)  # rows shorter than a KV block
        assert e.value.errno == errno.EINVAL
        with pytest.raises(KvpagerError) as e:
            attn(packed, q, index=[-1])
        assert e.value.errno == errno.EINVAL


@pytest.mark.parametrize("what", ["cache", "pager"])
def test_close_from_a_source_callback_is_refused(what):
    """A source's kv() that closes the cache (or the pager under it)
    while step() runs in C: the close used to free the cache under the
    step.  Now it raises EBUSY, which comes out of step(); the cache is
    whole and closes afterwards.  In a subprocess: a crash fails the
    test instead of ending the run."""
    code = f"""
import numpy as np
import kvpager
from kvpager import KVCache, KVGeometry, KvpagerError
g = KVGeometry.preset("tiny")
p = kvpager.Pager(budget="4M", pool_prefault_bytes=0)
c = KVCache(g, capacity_tokens=64, pager=p)
victim = {{"cache": c, "pager": p}}["{what}"]
rng = np.random.default_rng(1)
k = rng.standard_normal((g.layers, 8, g.kv_heads, g.head_dim),
                        dtype=np.float32)
s = c.new_sequence()
c.append(s, k, k)

class Closer:
    def kv(self, seq, layer, token):
        victim.close()
        return k[layer, 0], k[layer, 0]
    def query(self, seq, layer, pos):
        return np.ones((g.q_heads, g.head_dim), dtype=np.float32)

try:
    c.step(s, Closer())
    print("step returned")
except KvpagerError as e:
    print("refused:", e.errno, e)
print("tokens", c.tokens(s), flush=True)
c.close(); p.close()
print("closed")
"""
    res = run_python(code, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"refused: {errno.EBUSY} " in res.stdout, res.stdout
    assert "in use by a call in progress" in res.stdout or \
        "is in progress" in res.stdout
    assert "closed" in res.stdout


@pytest.mark.parametrize("make,what", [
    (lambda: KVCache(G, capacity_tokens=-1, backend="ram"),
     "capacity_tokens: -1"),
    (lambda: KVCache(G, capacity_tokens=(1 << 64) + 64, backend="ram"),
     "capacity_tokens"),
    (lambda: KVCache(G, capacity_tokens=64, max_seqs=(1 << 32) + 1,
                     backend="ram"), "max_seqs"),
    (lambda: KVCache(KVGeometry(layers=-1, q_heads=4, kv_heads=2,
                                head_dim=16, dtype="fp32"),
                     capacity_tokens=64, backend="ram"), "layers: -1"),
])
def test_counts_past_their_c_type_refused(make, what):
    """ctypes keeps an int's low bits: capacity_tokens=-1 made a cache,
    2**64 + 64 a cache of 64 tokens, max_seqs=2**32 + 1 one of 1
    sequence, layers=-1 asked for 2^32-1 layers (ENOMEM)."""
    with pytest.raises(KvpagerError) as e:
        make().close()
    assert e.value.errno == errno.EINVAL
    assert what in str(e.value) and "out of range" in str(e.value)


def test_sequence_arguments_checked():
    src = ArraySource(G, 8, seed=3)
    with KVCache(G, capacity_tokens=64, max_seqs=2, backend="ram") as c:
        s = c.new_sequence()
        c.append(s, src.k[:, :4], src.v[:, :4])
        with pytest.raises(KvpagerError) as e:
            c.fork(s, -1)  # was 2^64-1: "all", a fork of every token
        assert e.value.errno == errno.EINVAL and "ntokens" in str(e.value)
        assert c.sequences() == [s]
        with pytest.raises(TypeError, match="KVCache.append: the sequence"):
            c.append(float(s), src.k[:, 4:5], src.v[:, 4:5])
        with pytest.raises(TypeError, match="KVCache: name must be a str"):
            KVCache(G, capacity_tokens=64, backend="ram", name=5)


@pytest.mark.parametrize("threads", [2**32 + 1, -1])
def test_attention_threads_past_unsigned_refused(threads):
    """ctypes kept the low 32 bits: threads=2**32 + 1 made a pool of one
    thread, -1 asked for 2^32-1 (EINVAL from C, naming no argument)."""
    with pytest.raises(KvpagerError) as e:
        kvpager.Attention(G, threads=threads).close()
    assert e.value.errno == errno.EINVAL
    assert "threads" in str(e.value) and "out of range" in str(e.value)
    with pytest.raises(TypeError, match="Attention: threads"):
        kvpager.Attention(G, threads=1.5)


def test_attention_after_close_is_ebadf():
    """Attention ran on after close (with no pool: on the caller)."""
    g = G
    a = kvpager.Attention(g, threads=1)
    kv = np.zeros((4, g.block_stride), dtype=np.uint8)
    q = np.ones((g.q_heads, g.head_dim), np.float32)
    a(kv, q)
    a.close()
    with pytest.raises(KvpagerError) as e:
        a(kv, q)
    assert e.value.errno == errno.EBADF


def test_region_over_a_caches_store_bytes_refused():
    """A KVCache on a Store holds bytes [0, its region's size) of it: a
    region made there afterwards wrote back over the cache's K and V (and
    the cache's over the region's), without an error.  Refused (EBUSY,
    naming the cache), as for two regions; free once the cache closes."""
    p = kvpager.Pager(budget="8M", pool_prefault_bytes=0)
    with kvpager.Store.memory(8 << 20) as st:
        c = KVCache(G, capacity_tokens=64, pager=p, store=st, name="kvA")
        with pytest.raises(KvpagerError) as e:
            p.region(1 << 20, block_bytes=64 << 10, store=st,
                     name="B").close()
        assert e.value.errno == errno.EBUSY
        assert "of region kvA" in str(e.value)
        c.close()
        p.region(1 << 20, block_bytes=64 << 10, store=st, name="B").close()
    p.close()
    # and a second cache on the same bytes
    with kvpager.Store.memory(8 << 20) as st:
        c = KVCache(G, capacity_tokens=64, budget="8M",
                    store=st, name="kvA")
        with pytest.raises(KvpagerError) as e:
            KVCache(G, capacity_tokens=64, store=st, name="kvB").close()
        assert e.value.errno == errno.EBUSY
        assert str(e.value).startswith("KVCache: bytes [0, ")
        c.close()


@pytest.mark.parametrize("call, c_name", [
    (lambda c, s: c.tokens(s), "kvp_kvcache_seq_tokens"),
    (lambda c, s: c.block_table(s), "kvp_kvcache_seq_table"),
    (lambda c, s: c.sequences(), "kvp_kvcache_seq_list"),
    (lambda c, s: c.stats(), "kvp_kvcache_stats"),
    (lambda c, s: c.kv_bytes, "kvp_kvcache_kv_bytes"),
    (lambda c, s: c.free(s), "kvp_kvcache_seq_free"),
])
def test_close_during_a_short_call_refused(monkeypatch, call, c_name):
    """The short calls (tokens, sequences, stats...) took the handle and
    made their C call uncounted: a close from another thread meanwhile
    freed the cache under the call.  Here the close comes from inside
    the C call (the library function wrapped) and must be refused."""
    from kvpager import _native
    c = KVCache(G, capacity_tokens=64, backend="ram")
    s = c.new_sequence()
    real = getattr(_native.lib, c_name)
    seen = []

    def closing(*args):
        try:
            c.close()
            seen.append("closed")
            return 0  # not the real call: the handle is freed
        except KvpagerError as e:
            seen.append(e.errno)
        return real(*args)

    monkeypatch.setattr(_native.lib, c_name, closing)
    call(c, s)
    monkeypatch.undo()
    assert seen == [errno.EBUSY], f"close during {c_name}: {seen}"
    c.close()
