"""PrefixCache(remote=URL): the Redis tier below the cache directory,
against a real redis-server of the test's own on a free loopback port:
instance A's chunks reach instance B through Redis; tenants do not meet;
a server that is down is a miss, never a hang."""

import numpy as np
import pytest

import kvpager

from conftest import free_port
from test_prefix import PROMPT, open_px, payload


def publish(d, url, **kw):
    """Instance A: every chunk of PROMPT into directory @d and Redis."""
    with open_px(d, remote=url, **kw) as px:
        n = px.set_prompt(PROMPT)
        for i in range(n):
            px.put(i, payload(px, i))
        px.drain()
    # close() waited for the publishes


def test_instance_b_fetches_instance_a_chunks(tmp_path, redis):
    publish(tmp_path / "a", redis)
    with open_px(tmp_path / "b", remote=redis) as px:
        assert px.remote_url == redis
        px.set_prompt(PROMPT)
        assert px.cached_chunks() == 0  # B's own directory is empty
        buf = px.chunk_array()
        for i in range(px.restorable):
            assert px.get(i, buf), i
            assert np.array_equal(buf, payload(px, i))
        st = px.stats()
        r = st["remote"]
        assert r["chunks_fetched"] == 5 and r["hits_total"] >= 5
        assert r["verify_failed_total"] == 0
        assert st["cache"]["misses_total"] >= 5  # the directory missed
        px.drain()
        assert px.cached_chunks() == 5  # and keeps them for next time


def test_tenants_do_not_meet_on_one_server(tmp_path, redis):
    publish(tmp_path / "a", redis, salt="tenant-a")
    with open_px(tmp_path / "b", remote=redis, salt="tenant-b") as px:
        px.set_prompt(PROMPT)
        assert not px.get(0, px.chunk_array())
        assert px.stats()["remote"]["chunks_fetched"] == 0
    with open_px(tmp_path / "c", remote=redis, salt="tenant-a") as px:
        px.set_prompt(PROMPT)
        assert px.get(0, px.chunk_array())


def test_encrypted_values_need_the_key(tmp_path, redis):
    publish(tmp_path / "a", redis, key="ab" * 32)
    # another key's chunks have other Redis keys: a miss, not a failure
    with open_px(tmp_path / "b", remote=redis, key="cd" * 32) as px:
        px.set_prompt(PROMPT)
        assert not px.get(0, px.chunk_array())
        assert px.stats()["remote"]["chunks_fetched"] == 0
        assert px.stats()["remote"]["verify_failed_total"] == 0
    with open_px(tmp_path / "c", remote=redis, key="ab" * 32) as px:
        px.set_prompt(PROMPT)
        buf = px.chunk_array()
        assert px.get(0, buf) and np.array_equal(buf, payload(px, 0))


def test_server_down_is_a_miss_not_a_hang(tmp_path):
    port = free_port()  # nothing listens there
    url = f"redis://127.0.0.1:{port}?timeout_ms=500&connect_timeout_ms=500"
    with open_px(tmp_path, remote=url, flush_timeout=1) as px:
        px.set_prompt(PROMPT)
        buf = px.chunk_array()
        for i in range(px.restorable):
            assert not px.get(i, buf)
        px.put(0, payload(px, 0))  # the directory still takes it
        px.drain()
        assert px.get(0, buf)
        r = px.stats()["remote"]
        assert r["connect_errors_total"] + r["errors_total"] >= 1
    # a hang would be caught by the runner's timeout: no duration judged


def test_bad_url_raises_einval_without_the_password(tmp_path):
    with pytest.raises(kvpager.KvpagerError) as e:
        open_px(tmp_path, remote="rediss://user:s3cret@127.0.0.1:1")
    assert e.value.errno == 22
    assert "s3cret" not in str(e.value)
    with pytest.raises(kvpager.KvpagerError):
        open_px(tmp_path, remote_window=99)
