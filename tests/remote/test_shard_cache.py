"""The local shard cache (adapter_trainer.data.remote.cache) against a real HTTP server on 127.0.0.1: verified,
atomic, resumed after a cut, retried on 429/503 and not on 404, bounded in bytes, never evicting a shard being read,
order-aware or LRU, cleaning dead downloads, shared by processes without downloading a shard twice, and never stalled
by a forked worker's fetch."""

from __future__ import annotations

import gc
import hashlib
import multiprocessing as mp
import os
import threading
from pathlib import Path

import pytest

from adapter_trainer.data.remote.cache import BOOKKEEPING_BYTES, RemoteShard, ShardCache, ShardCacheError
from adapter_trainer.data.remote.retry import RemoteReadError, with_retries
from tests.remote.disk import du_bytes
from tests.remote.servers import FaultyHTTPServer

SIZE = 40_000


@pytest.fixture()
def served(tmp_path: Path):
    """Six 40 kB files under a FaultyHTTPServer: (server, [RemoteShard])."""
    root = tmp_path / "srv"
    root.mkdir()
    shards = []
    for i in range(6):
        data = os.urandom(SIZE)
        (root / f"s{i}.tar").write_bytes(data)
        shards.append((f"s{i}.tar", hashlib.sha256(data).hexdigest()))
    with FaultyHTTPServer(root) as srv:
        yield srv, [RemoteShard(srv.url_of(name), sha, SIZE) for name, sha in shards]


def test_fetch_is_verified_and_leaves_no_partial_file(served, tmp_path):
    srv, shards = served
    cache = ShardCache(tmp_path / "c")
    assert cache.fetch(shards[0], what="s0")
    local = cache.path(shards[0].sha256)
    assert hashlib.sha256(local.read_bytes()).hexdigest() == shards[0].sha256
    assert not list((tmp_path / "c").glob("*.part"))
    cache.fetch(shards[0], what="s0")  # present: no second request
    assert srv.count("/s0.tar") == 1 or srv.count("s0.tar") >= 1
    assert cache.stats()["downloads"] == 1


def test_a_flipped_byte_is_fetched_again_once_then_refused(served, tmp_path):
    srv, shards = served
    cache = ShardCache(tmp_path / "c")
    srv.flip("s1.tar", offset=1234, times=1)
    cache.fetch(shards[1], what="s1")  # the second download is clean
    assert hashlib.sha256(cache.path(shards[1].sha256).read_bytes()).hexdigest() == shards[1].sha256
    srv.flip("s2.tar", offset=99, times=10)
    with pytest.raises(ShardCacheError, match=r"s2: .*s2\.tar has sha256 .* manifest lists") as e:
        cache.fetch(shards[2], what="s2")
    assert "\n" not in str(e.value)
    assert not cache.present(shards[2].sha256) and not list((tmp_path / "c").glob("*.part"))


def test_a_cut_transfer_resumes_and_transient_statuses_are_retried(served, tmp_path):
    srv, shards = served
    cache = ShardCache(tmp_path / "c", tries=4)
    srv.truncate("s0.tar", n_bytes=10_000)
    srv.fail("s1.tar", 503, times=2)
    srv.fail("s2.tar", 429, times=1, retry_after=0)
    for s in shards[:3]:
        cache.fetch(s, what=s.url)
        assert hashlib.sha256(cache.path(s.sha256).read_bytes()).hexdigest() == s.sha256
    # the cut GET is asked again (fsspec reads whole blocks, so a retry resumes at the first byte not delivered:
    # here the start, a 40 kB file being one block)
    assert srv.count("*s0.tar") >= 2 and srv.count("*s1.tar", method=None) >= 3 and srv.count("*s2.tar", None) >= 2


def test_permanent_errors_are_not_retried_and_the_last_status_is_named(served, tmp_path):
    srv, shards = served
    cache = ShardCache(tmp_path / "c", tries=3)
    missing = RemoteShard(srv.url_of("nope.tar"), "0" * 64, 10)
    with pytest.raises(RemoteReadError, match="nope.tar") as e:
        cache.fetch(missing, what="shard train/nope.tar")
    assert srv.count("*nope.tar", method=None) <= 2  # HEAD and/or GET once: no retries
    assert "\n" not in str(e.value)
    srv.fail("s3.tar", 503, times=100)
    with pytest.raises(RemoteReadError, match=r"shard s3: .*s3\.tar failed 3 times, last HTTP 503"):
        cache.fetch(shards[3], what="shard s3")


def test_the_bound_holds_and_a_shard_being_read_is_never_evicted(served, tmp_path):
    srv, shards = served
    cache = ShardCache(tmp_path / "c", max_bytes=int(2.5 * SIZE) + BOOKKEEPING_BYTES)
    held = cache.open(shards[0], what="s0")  # a reader holds s0
    for s in shards[1:]:
        cache.fetch(s, what=s.url)
        assert cache.used_bytes() <= cache.max_bytes
    assert cache.present(shards[0].sha256)  # never evicted while held
    assert held.read(5) == cache.path(shards[0].sha256).read_bytes()[:5]
    held.close()
    assert cache.stats()["peak_bytes"] <= cache.max_bytes
    with pytest.raises(ShardCacheError, match="max_bytes"):
        ShardCache(tmp_path / "d", max_bytes=SIZE - 1).fetch(shards[0], what="s0")


def test_order_policy_evicts_the_farthest_next_use_and_lru_the_oldest(served, tmp_path):
    srv, shards = served
    a, b, c = shards[:3]
    order = ShardCache(tmp_path / "o", max_bytes=2 * SIZE + BOOKKEEPING_BYTES)
    order.next_use = {a.sha256: 1.0, b.sha256: 50.0, c.sha256: 2.0}.get
    lru = ShardCache(tmp_path / "l", max_bytes=2 * SIZE + BOOKKEEPING_BYTES, policy="lru")
    for cache in (order, lru):
        cache.fetch(a, what="a")
        cache.fetch(b, what="b")
        os.utime(cache.path(a.sha256), (1, 1))  # a is the least recently used
        cache.fetch(c, what="c")
    assert order.present(a.sha256) and not order.present(b.sha256)  # b is needed last
    assert lru.present(b.sha256) and not lru.present(a.sha256)
    # a prefetch does not evict a shard needed sooner than the one it would fetch
    order.next_use = {a.sha256: 1.0, c.sha256: 2.0, shards[3].sha256: 10.0}.get
    assert not order.fetch(shards[3], what="d", admit_within=10.0)
    assert order.present(a.sha256) and order.present(c.sha256)


def test_a_dead_download_is_cleaned_and_a_live_one_kept(served, tmp_path):
    srv, shards = served
    cache = ShardCache(tmp_path / "c")
    cache._ready()
    dead = tmp_path / "c" / f"{'a' * 64}-{SIZE}.999999.0.part"  # two shards of different lock stripes
    live = tmp_path / "c" / f"{'b' * 64}-{SIZE}.999998.0.part"
    dead.write_bytes(b"x" * 100)
    live.write_bytes(b"y" * 100)
    with cache._shard_lock("b" * 64):  # a download in flight holds its shard lock
        ShardCache(tmp_path / "c")._ready()
        assert not dead.exists() and live.exists()
    assert cache.used_bytes() == du_bytes(tmp_path / "c") - 100 + SIZE  # a reservation counts its full size


def _fetch_all(root: str, shards: list[RemoteShard]) -> None:
    cache = ShardCache(root)
    for s in shards:
        cache.open(s, what=s.url).close()


def test_processes_sharing_a_cache_download_each_shard_once(served, tmp_path):
    srv, shards = served
    srv.delay("*.tar", 0.2, times=6)  # slow downloads: the processes meet on the same shard
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_fetch_all, args=(str(tmp_path / "c"), shards)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert ShardCache(tmp_path / "c").stats()["downloads"] == len(shards)
    assert all(srv.count(f"*s{i}.tar") == 1 for i in range(6)), srv.requests


def _forked_worker_fetch(root: str, max_bytes: int, shard: RemoteShard) -> None:
    """A forked DataLoader worker's first read: fsspec drops the instances the fork copied (the parent's clients)."""
    ShardCache(root, max_bytes).open(shard, what=shard.url).close()
    gc.collect()  # now, rather than whenever the worker's collector runs


def test_a_forked_workers_fetch_does_not_stall_the_parents_next_download(served, tmp_path):
    """The training process downloads (its prefetch thread, its eval reads) over a connection that fsspec keeps in its
    event loop, and forks its DataLoader workers with that connection open. A worker's fetch must leave the parent's
    client alone: closing the copy in the worker unregistered the parent's socket from the event loop's epoll instance,
    which fork shares, so the parent's next download heard no answer until aiohttp's 5-minute timeout. Two cache users
    at a bound of one tar, as in a tight torchrun run: the parent, then a forked worker, then the parent again."""
    srv, shards = served
    root = tmp_path / "c"
    cache = ShardCache(root, max_bytes=SIZE + BOOKKEEPING_BYTES)  # room for one tar
    cache.open(shards[0], what="s0").close()  # the parent's connection stays open in fsspec's pool
    worker = mp.get_context("fork").Process(target=_forked_worker_fetch, args=(str(root), cache.max_bytes, shards[1]))
    worker.start()
    worker.join(60)
    assert worker.exitcode == 0
    done: list[object] = []

    def parent_fetch() -> None:
        try:
            cache.open(shards[2], what="s2").close()
            done.append("ok")
        except BaseException as e:  # reported by the assertion below
            done.append(e)

    reader = threading.Thread(target=parent_fetch, daemon=True)  # a stalled read cannot be interrupted: left behind
    reader.start()
    reader.join(20)
    assert done == ["ok"], done or "the parent's download after a forked worker's fetch stalled (no answer in 20 s)"
    assert cache.present(shards[2].sha256) and cache.used_bytes() <= cache.max_bytes
    assert srv.count("*s2.tar", method=None) >= 1


def test_retry_after_is_honoured_and_backoff_is_capped():
    class Busy(Exception):
        def __init__(self, status: int, headers: dict | None = None) -> None:
            super().__init__(f"status {status}")
            self.status, self.headers = status, headers or {}

    waits: list[float] = []
    calls = iter([Busy(429, {"Retry-After": "7"}), Busy(503), Busy(503), "ok"])

    def fn():
        x = next(calls)
        if isinstance(x, Exception):
            raise x
        return x

    assert with_retries(fn, what="w", url="u", tries=4, base_s=1.0, cap_s=3.0, sleep=waits.append) == "ok"
    assert waits[0] == 3.0  # Retry-After 7 capped at 3
    assert all(0 <= w <= 3.0 for w in waits[1:]) and len(waits) == 3
    with pytest.raises(RemoteReadError, match="HTTP 404"):
        with_retries(lambda: (_ for _ in ()).throw(Busy(404)), what="w", url="u", sleep=waits.append)
    assert len(waits) == 3  # no wait for a 404


def test_the_configs_policy_choices_are_the_caches() -> None:
    """config.py imports no room, so it lists data.cache.policy's choices itself: they must be the cache's."""
    from adapter_trainer.config import CACHE_POLICIES
    from adapter_trainer.data.remote.cache import POLICIES

    assert CACHE_POLICIES == POLICIES
