"""The shard planner reads the example order ahead: next uses (Belady's distance) equal a brute-force scan of the
order for the node's ranks from the example being read, and `upcoming` lists a rank's shards in order of first use."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adapter_trainer.data.remote.cache import BOOKKEEPING_BYTES, RemoteShard, ShardCache
from adapter_trainer.data.remote.planner import ShardPlanner
from adapter_trainer.data.streaming import ConcatOrder

N_CLIPS, N_SHARDS, B = 60, 12, 4


def brute_next_use(order, clip_shard, shard, cursor, batch_start, world, node_ranks, horizon) -> float:
    """The first position p >= cursor (p < batch_start + horizon) whose clip is in `shard` and that a node rank reads."""
    G = B * world
    for p in range(cursor, batch_start + horizon):
        rank = ((p - batch_start) % G) // B
        e, i = divmod(p, order.epoch_size)
        if rank in node_ranks and clip_shard[order.clip(e, i)] == shard:
            return float(p - cursor)
    return math.inf


@pytest.mark.parametrize("world, node_ranks", [(1, range(0, 1)), (2, range(0, 2)), (4, range(2, 4))])
def test_next_use_is_the_brute_force_distance_from_the_example_read(world, node_ranks) -> None:
    rng = np.random.default_rng(0)
    clip_shard = rng.integers(0, N_SHARDS, N_CLIPS)
    order = ConcatOrder(seed=3, n_clips=N_CLIPS)
    shas = [f"{s:064x}" for s in range(N_SHARDS)]
    planner = ShardPlanner(order, clip_shard, shas, batch_size=B, world_size=world, node_ranks=node_ranks, horizon=70)
    G = B * world
    for batch_start in (0, 3 * G, 7 * G):  # crosses into epoch 1 (60 clips per epoch)
        planner.position = batch_start
        for cursor in (None, batch_start + 1, batch_start + B - 1):
            planner.cursor = cursor
            at = batch_start if cursor is None else cursor
            for s in range(N_SHARDS):
                want = brute_next_use(order, clip_shard, s, at, batch_start, world, node_ranks, 70)
                assert planner.next_use(shas[s]) == want, (batch_start, cursor, s)


def test_upcoming_lists_a_ranks_shards_in_order_of_first_use() -> None:
    clip_shard = np.arange(N_CLIPS) % N_SHARDS
    order = ConcatOrder(seed=1, n_clips=N_CLIPS)
    planner = ShardPlanner(order, clip_shard, [str(s) for s in range(N_SHARDS)], batch_size=B, world_size=2,
                           node_ranks=range(0, 2))  # fmt: skip
    got = planner.upcoming(8, n_batches=2, ranks=range(1, 2))
    perm = order.epoch_clips(0)
    rank1 = [p for p in range(8, 8 + 16) if ((p - 8) % 8) // 4 == 1]
    want, seen = [], set()
    for p in rank1:
        s = int(clip_shard[perm[p]])
        if s not in seen:
            seen.add(s)
            want.append((s, p - 8))
    assert got == want


def test_an_lru_prefetch_only_fills_free_room(tmp_path) -> None:
    cache = ShardCache(tmp_path / "c", max_bytes=2 * 60_000 + BOOKKEEPING_BYTES, policy="lru")  # two tars' room
    cache._ready()
    for name in ("a", "b"):
        (tmp_path / "c" / f"{name * 64}.tar").write_bytes(b"x" * 60_000)
    shard = RemoteShard("http://127.0.0.1:9/never", "c" * 64, 60_000)  # never fetched: no room without evicting
    assert not cache.fetch(shard, what="prefetch", admit_within=5.0)
    assert cache.present("a" * 64) and cache.present("b" * 64)


def test_the_prefetcher_measures_from_the_oldest_batch_that_may_be_in_flight() -> None:
    """cursor None (the prefetcher) with 3 micro-batches in flight: distances count from position - 2 x G, so the
    shards of the batches the workers are still building are needed now."""
    rng = np.random.default_rng(1)
    clip_shard = rng.integers(0, N_SHARDS, N_CLIPS)
    order = ConcatOrder(seed=2, n_clips=N_CLIPS)
    shas = [f"{s:064x}" for s in range(N_SHARDS)]
    planner = ShardPlanner(order, clip_shard, shas, batch_size=B, world_size=2, node_ranks=range(0, 2), horizon=70,
                           in_flight=3)  # fmt: skip
    G = 2 * B
    planner.position, planner.cursor = 5 * G, None
    assert planner.reference() == (3 * G, 3 * G)
    for s in range(N_SHARDS):
        assert planner.next_use(shas[s]) == brute_next_use(order, clip_shard, s, 3 * G, 3 * G, 2, range(0, 2), 70)
    planner.position = G  # near the start: never before position 0
    assert planner.reference() == (0, 0)


@pytest.mark.parametrize("cursor", [None, 2 * B + 1])
def test_past_the_runs_end_no_shard_is_needed_nor_prefetched(cursor) -> None:
    """stop_at(end): positions at or past the run's last micro-batch are never read, so a shard read only there is
    as far as an eval shard (infinite distance: evicted first, by age) and the prefetcher lists only what the
    remaining micro-batches read."""
    rng = np.random.default_rng(3)
    clip_shard = rng.integers(0, N_SHARDS, N_CLIPS)
    order = ConcatOrder(seed=4, n_clips=N_CLIPS)
    shas = [f"{s:064x}" for s in range(N_SHARDS)]
    planner = ShardPlanner(order, clip_shard, shas, batch_size=B, world_size=2, node_ranks=range(0, 2), horizon=70)
    G = 2 * B
    planner.position, planner.cursor = G, cursor
    before = [planner.next_use(sha) for sha in shas]  # cached per micro-batch start: stop_at must drop it
    planner.stop_at(3 * G)  # two micro-batches left from position G
    at = G if cursor is None else cursor
    got = [planner.next_use(sha) for sha in shas]
    assert got == [brute_next_use(order, clip_shard, s, at, G, 2, range(0, 2), 2 * G) for s in range(N_SHARDS)]
    assert math.inf in got and got != before
    assert planner.upcoming(G, n_batches=8, ranks=range(1, 2)) == planner.upcoming(G, n_batches=2, ranks=range(1, 2))
