"""PrefixCache: prompts' KV chunks in a cache directory, found again by
content; verified when read (torn, tampered, foreign: a counted miss);
namespaces; encryption; errors with their errno."""

import errno
import os

import numpy as np
import pytest

import kvpager
from kvpager import KvpagerError

# A small geometry: 2 layers, 2 KV heads of 8, fp16; chunks of 16 tokens
# are 2 * 16 * 2 * 2 * 8 * 2 = 2 KiB of payload.
GEO = kvpager.KVGeometry(layers=2, q_heads=4, kv_heads=2, head_dim=8,
                         dtype="fp16", block_tokens=4)
C = 16
PROMPT = list(range(1, 5 * C + 4))  # 5 full chunks and 3 tokens


def payload(px, chunk, seed=0):
    """The chunk's K and V, a function of the prompt's tokens (so that a
    chunk served under the wrong key would show)."""
    a = px.chunk_array()
    a[:] = np.random.default_rng([seed, chunk]).standard_normal(
        a.shape).astype(a.dtype)
    return a


def open_px(d, **kw):
    kw = {"model": "test-model", "chunk_tokens": C, **kw}
    return kvpager.PrefixCache(str(d), geometry=GEO, **kw)


def fill(d, prompt=PROMPT, **kw):
    """Store every full chunk of @prompt in directory @d."""
    with open_px(d, **kw) as px:
        n = px.set_prompt(prompt)
        for i in range(n):
            px.put(i, payload(px, i))
        px.drain()
        assert px.stats()["prefix"]["stored"] == n
        return n


def test_chunks_are_found_again_by_another_opening(tmp_path):
    tmp_path = tmp_path / "cache"  # made by the cache
    assert fill(tmp_path) == 5
    assert oct(os.stat(tmp_path).st_mode & 0o777) == "0o700"
    with open_px(tmp_path) as px:
        assert px.set_prompt(PROMPT) == 5
        assert px.chunks == 5 and px.restorable == 5
        assert px.cached_chunks() == 5
        buf = px.chunk_array()
        for i in range(5):
            assert px.get(i, buf)
            assert np.array_equal(buf, payload(px, i))
            assert os.path.exists(tmp_path / f"{px.key(i)}.kvb")
        st = px.stats()
        assert st["cache"]["hits_total"] >= 5  # read ahead, maybe more
        assert st["cache"]["blocks"] == 5
        assert st["prefix"]["hit_chunks"] == st["prefix"]["lookups"] == 5
        # the chunk of the last token is never restorable
        px.set_prompt(PROMPT[:5 * C])
        assert px.chunks == 5 and px.restorable == 4


def test_a_key_binds_every_token_before_it(tmp_path):
    fill(tmp_path)
    other = list(PROMPT)
    other[C + 3] += 1000  # chunk 1 differs: chunks 1.. are another prefix
    with open_px(tmp_path) as px:
        px.set_prompt(other)
        buf = px.chunk_array()
        assert px.cached_chunks() == 1
        assert px.get(0, buf)
        assert not px.get(1, buf) and not px.get(4, buf)
        st = px.stats()
        assert st["prefix"]["lookups"] == 3
        assert st["prefix"]["hit_chunks"] == 1
        assert st["cache"]["misses_total"] >= 2


@pytest.mark.parametrize("change", [{"salt": "tenant-b"},
                                    {"model": "another-model"},
                                    {"prefill_window": 1}])
def test_another_namespace_model_or_window_finds_nothing(tmp_path, change):
    fill(tmp_path, salt="tenant-a")
    kw = {"salt": "tenant-a", **change}
    model = kw.pop("model", "test-model")
    with kvpager.PrefixCache(str(tmp_path), geometry=GEO, model=model,
                             chunk_tokens=C, **kw) as px:
        px.set_prompt(PROMPT)
        assert px.cached_chunks() == 0
        assert not px.get(0, px.chunk_array())


def test_model_file_names_the_model_by_its_bytes(tmp_path):
    w = tmp_path / "weights.bin"
    w.write_bytes(b"\x01" * 10000)
    d = tmp_path / "cache"
    with kvpager.PrefixCache(str(d), geometry=GEO, model_file=str(w),
                             chunk_tokens=C) as px:
        px.set_prompt(PROMPT)
        px.put(0, payload(px, 0))
        px.drain()
    w.write_bytes(b"\x02" * 10000)  # other weights: other keys
    with kvpager.PrefixCache(str(d), geometry=GEO, model_file=str(w),
                             chunk_tokens=C) as px:
        px.set_prompt(PROMPT)
        assert px.cached_chunks() == 0


def test_torn_chunk_is_a_counted_miss_never_served(tmp_path):
    fill(tmp_path)
    with open_px(tmp_path) as px:
        px.set_prompt(PROMPT)
        f = tmp_path / f"{px.key(2)}.kvb"
    data = bytearray(f.read_bytes())
    data[200] ^= 0xFF  # a bit of the payload flipped on the disk
    f.write_bytes(bytes(data))
    with open_px(tmp_path) as px:
        px.set_prompt(PROMPT)
        buf = px.chunk_array()
        assert px.get(1, buf)
        assert not px.get(2, buf)
        assert st_of(px)["dropped_torn_total"] == 1
        assert not f.exists()  # removed: the next get is a plain miss
        assert px.cached_chunks() == 2
        assert px.get(3, buf)  # the chunks after it are whole


def st_of(px):
    return px.stats()["cache"]


def test_encrypted_chunks_need_their_key(tmp_path):
    key = "ab" * 32
    fill(tmp_path, key=key)
    with open_px(tmp_path, key=key) as px:
        px.set_prompt(PROMPT)
        buf = px.chunk_array()
        assert px.get(0, buf) and np.array_equal(buf, payload(px, 0))
    # another key, or none, names its chunks apart: a miss that drops
    # nothing, and its own chunks take no place of the key's
    for other in ("cd" * 32, None):
        with open_px(tmp_path, key=other) as px:
            px.set_prompt(PROMPT)
            buf = px.chunk_array()
            assert not px.get(0, buf)
            assert st_of(px)["dropped_unauth_total"] == 0
            px.put(0, payload(px, 0))
            px.drain()
            assert st_of(px)["puts_total"] == 1
    with open_px(tmp_path, key=key) as px:
        px.set_prompt(PROMPT)
        buf = px.chunk_array()
        assert px.get(0, buf) and np.array_equal(buf, payload(px, 0))
    kf = tmp_path / "key"
    kf.write_text(key + "\n")
    kf.chmod(0o644)
    with pytest.raises(KvpagerError) as e:
        open_px(tmp_path / "c2", key_file=str(kf))
    assert e.value.errno == errno.EACCES and "chmod" in str(e.value)
    kf.chmod(0o600)
    with open_px(tmp_path, key_file=str(kf)) as px:
        px.set_prompt(PROMPT)
        assert px.get(2, px.chunk_array())


def test_capacity_evicts_a_prompts_last_chunks_first(tmp_path):
    # each chunk's file is its 128-byte header and 2 KiB, padded to 4 KiB
    with open_px(tmp_path, capacity="12K") as px:
        px.set_prompt(PROMPT)
        for i in range(5):
            px.put(i, payload(px, i))
        px.drain()
        st = st_of(px)
        assert st["blocks"] < 5 and st["evictions_total"] >= 2
        assert st["bytes"] <= 12 << 10
        # a prompt's last chunks go first: its first ones are what the
        # next prompt sharing a prefix reads
        assert px.cached_chunks() == st["blocks"]
        assert not px.get(4, px.chunk_array())


def test_read_only_stores_nothing(tmp_path):
    fill(tmp_path, prompt=PROMPT[:C + 1])
    with open_px(tmp_path, read_only=True) as px:
        px.set_prompt(PROMPT)
        assert px.get(0, px.chunk_array())
        px.put(1, payload(px, 1))
        px.drain()
        assert px.stats()["prefix"]["failed"] == 1
        assert st_of(px)["read_only"] == 1


def test_errors_carry_errno(tmp_path):
    def refused(err, fn, *a, **kw):
        with pytest.raises(KvpagerError) as e:
            fn(*a, **kw)
        assert e.value.errno == err, str(e.value)
        return e.value

    with open_px(tmp_path / "a") as px:
        e = refused(errno.EBUSY, open_px, tmp_path / "a")
        assert e.call == "kvp_cache_open" and e.detail
        refused(errno.EINVAL, px.get, 0, px.chunk_array())  # no prompt
        px.set_prompt(PROMPT)
        refused(errno.EINVAL, px.get, 5, px.chunk_array())
        refused(errno.EINVAL, px.get, 0, np.empty(10, np.uint8))
        refused(errno.EINVAL, px.put, 0, px.chunk_array()[:, :2])
        refused(errno.EINVAL, px.set_prompt, [1, -2])
    refused(errno.EBADF, px.get, 0, px.chunk_array())
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x").write_text("not a cache")
    refused(errno.ENOTEMPTY, open_px, tmp_path / "b")
    assert (tmp_path / "b" / "x").read_text() == "not a cache"
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "kvpcache").write_text("kvpager-cache 99\n")
    refused(errno.EPROTONOSUPPORT, open_px, tmp_path / "c")
    refused(errno.EINVAL, open_px, tmp_path / "d", chunk_tokens=24)
    refused(errno.EINVAL, open_px, tmp_path / "d", capacity="lots")
    # ctypes kept the low 64 bits: a capacity of 16 KiB, without a word
    refused(errno.EINVAL, open_px, tmp_path / "d", capacity=2**64 + 16384)
    refused(errno.EINVAL, open_px, tmp_path / "d", capacity=-1)
    assert not (tmp_path / "d").exists()
    refused(errno.EINVAL, open_px, tmp_path / "d", key="00")
    refused(errno.EINVAL, kvpager.PrefixCache, str(tmp_path / "d"),
            geometry=GEO)  # no model named
    refused(errno.ENOENT, kvpager.PrefixCache, str(tmp_path / "d"),
            geometry=GEO, model_file=str(tmp_path / "absent"))


def test_chunk_format_is_the_c_tools(tmp_path):
    """The payload's format comes from lib/model/model.h: whole KV blocks
    when G divides C (the key says so), else per token; chunk_kv views
    either (python/tests/test_examples.py: kvpager run reads them)."""
    with open_px(tmp_path / "a") as px:  # G = 4 divides 16
        assert px.in_blocks
        a = px.chunk_array()
        assert a.shape == (2, 4, GEO.block_stride // 2) and not a.any()
        assert a.nbytes == px.chunk_bytes == 2 * 4 * GEO.block_stride
        k, v = px.chunk_kv(a)
        assert k.shape == v.shape == (2, 4, 2, 4, 8)
        k[1, 2, 1, 3, 5] = 7  # layer 1, block 2 (token 11), head 1, dim 5
        blk = a[1, 2].view(np.uint8)
        off = ((1 * 4 + 3) * 8 + 5) * 2  # K[head][slot][dim], fp16
        assert np.frombuffer(blk[off:off + 2], np.float16)[0] == 7
        v[0, 0, 0, 0, 0] = 9  # V follows K: half a block in
        assert a[0, 0, GEO.block_bytes // 4] == 9
    with open_px(tmp_path / "b", chunk_tokens=2) as px:  # G = 4 does not
        assert not px.in_blocks
        a = px.chunk_array()
        assert a.shape == (2, 2, 2, 2, 8) and a.nbytes == px.chunk_bytes
        k, v = px.chunk_kv(a)
        assert k.shape == (2, 2, 2, 8)
        with pytest.raises(KvpagerError):
            px.chunk_kv(np.zeros(a.shape, np.float32))


def test_close_refused_while_a_call_runs(tmp_path):
    """A get, put or drain in one thread while another closes: close
    freed the prefix cache and its directory under the call.  The call
    in progress is held open here by the binding's own count (what a
    get in another thread holds while in C); close is EBUSY meanwhile,
    and no call starts once close has begun."""
    px = open_px(str(tmp_path))
    px.set_prompt(PROMPT)
    with px._call():
        with pytest.raises(KvpagerError) as e:
            px.close()
        assert e.value.errno == errno.EBUSY
        assert "in progress in another thread" in str(e.value)
    assert px.get(0, px.chunk_array()) is False  # still open
    px.close()
    with pytest.raises(KvpagerError) as e:
        px.get(0, px.chunk_array())
    assert e.value.errno == errno.EBADF
