"""Which shards this node reads next: the example order (a pure function of position) read ahead.

From a micro-batch start every process of a node lists, without talking to the others, the shards its ranks read in
the next H positions: `ShardPlanner.next_use` is Belady's distance for eviction, `upcoming` what the prefetcher
fetches. Shards outside the train order (eval) are infinitely far.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Sequence

import numpy as np

from adapter_trainer.data.remote.cache import RemoteShard, ShardCache
from adapter_trainer.errors import UserError


def epoch_clips(order: object, epoch: int) -> np.ndarray:
    """[E] the clip at every index of `epoch` (ConcatOrder's permutation at once; other orders clip by clip)."""
    perm = getattr(order, "epoch_clips", None)
    if perm is not None:
        return perm(epoch)
    return np.fromiter((order.clip(epoch, i) for i in range(order.epoch_size)), np.int64, order.epoch_size)  # type: ignore[attr-defined]


class ShardPlanner:
    """Next uses of train shards by the ranks of one node, from a micro-batch start `position`."""

    def __init__(
        self,
        order: object,
        clip_shard: np.ndarray,
        shard_sha: Sequence[str | None],
        *,
        batch_size: int,
        world_size: int,
        node_ranks: range,
        horizon: int = 0,
        in_flight: int = 1,
    ) -> None:
        """in_flight: micro-batches a rank's DataLoader may build at once (workers x prefetch_factor, or 1)."""
        self.order, self.clip_shard, self.shard_sha = order, clip_shard, list(shard_sha)
        self.in_flight = max(1, in_flight)
        self.B, self.G, self.node_ranks = batch_size, batch_size * world_size, node_ranks
        self.E: int = order.epoch_size  # type: ignore[attr-defined]
        self.horizon = horizon or min(self.E, 1 << 16)  # positions looked ahead (later reads: LRU among them)
        self.position = 0  # the micro-batch start this process works at
        self.end: int | None = None  # the first position the run does not read (`stop_at`); None: no end
        self.cursor: int | None = None  # the example being read (position <= cursor < position + G); None: position
        self._first: tuple[int, dict[str, np.ndarray]] | None = None
        self._epochs: dict[int, np.ndarray] = {}

    def _shards_of_epoch(self, epoch: int) -> np.ndarray:
        if epoch not in self._epochs:
            if len(self._epochs) > 2:
                self._epochs.pop(min(self._epochs))
            self._epochs[epoch] = self.clip_shard[epoch_clips(self.order, epoch)]
        return self._epochs[epoch]

    def stop_at(self, end: int) -> None:
        """The run reads no position >= `end` (trainer.max_steps); set before the workers copy the planner."""
        self.end, self._first = end, None

    def finish(self) -> None:
        """The loop is over: every train shard is as far as an eval shard, so the closing eval evicts them first."""
        self.stop_at(0)

    def window(self, start: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        """(shard id [L], read by this node [L]) of positions start .. start + length - 1 (none at or past `end`)."""
        parts, n = [], start
        while n < start + length:
            e, i = divmod(n, self.E)
            take = min(self.E - i, start + length - n)
            parts.append(self._shards_of_epoch(e)[i : i + take])
            n += take
        shards = np.concatenate(parts)
        rank = (np.arange(length) % self.G) // self.B  # relative to a micro-batch start
        mine = (rank >= self.node_ranks.start) & (rank < self.node_ranks.stop)
        if self.end is not None:
            mine &= np.arange(start, start + length) < self.end
        return shards, mine

    def reference(self) -> tuple[int, int]:
        """(where next uses are measured from, the micro-batch start the rank slices align to). A reader (`cursor`
        set) measures from the example it reads; the prefetcher from the oldest micro-batch that may still be in
        flight, so a prefetch never evicts what the workers are reading."""
        if self.cursor is not None:
            return self.cursor, self.position
        floor = max(0, self.position - (self.in_flight - 1) * self.G)
        return floor, floor

    def _uses(self, base: int) -> dict[str, np.ndarray]:
        """sha256 -> sorted offsets from the micro-batch start `base` at which this node reads the shard (cached)."""
        if self._first is None or self._first[0] != base:
            shards, mine = self.window(base, self.horizon)
            offsets = np.flatnonzero(mine)  # [M] ascending
            ids = shards[offsets]
            order = np.argsort(ids, kind="stable")  # grouped by shard, ascending offsets within a shard
            uniq, starts = np.unique(ids[order], return_index=True)
            groups = np.split(offsets[order], starts[1:])
            self._first = (
                base,
                {self.shard_sha[int(s)]: g for s, g in zip(uniq, groups) if self.shard_sha[int(s)] is not None},
            )
        return self._first[1]

    def next_use(self, sha256: str) -> float:
        """Positions from `reference()` until this node next reads the shard; inf beyond the horizon."""
        ref, base = self.reference()
        uses = self._uses(base).get(sha256)
        if uses is None:
            return math.inf
        k = ref - base
        i = int(np.searchsorted(uses, k))
        return math.inf if i == len(uses) else float(uses[i] - k)

    def upcoming(self, start: int, n_batches: int, ranks: range) -> list[tuple[int, int]]:
        """(shard id, position offset) of the shards `ranks` read in n_batches micro-batches from `start`, in order
        of first use."""
        shards, _ = self.window(start, n_batches * self.G)
        rank = (np.arange(len(shards)) % self.G) // self.B
        mine = (rank >= ranks.start) & (rank < ranks.stop)
        if self.end is not None:
            mine &= np.arange(start, start + len(shards)) < self.end
        ids = shards[mine]
        uniq, first = np.unique(ids, return_index=True)
        pos = np.flatnonzero(mine)[first]
        return sorted(((int(s), int(p)) for s, p in zip(uniq, pos)), key=lambda t: t[1])


class Prefetcher:
    """A background thread that fetches the shards this rank reads in the next `lookahead` micro-batches (in order
    of first use, without evicting a shard needed sooner); `advance(start)` says where the DataLoader is. A failed
    prefetch prints one line and is counted in `failures`: the reader fetches the shard itself and raises."""

    def __init__(
        self, cache: ShardCache, planner: ShardPlanner, shards: Sequence[RemoteShard | None], rank: int, lookahead: int
    ) -> None:
        self.cache, self.planner, self.shards, self.lookahead = cache, planner, list(shards), lookahead
        self.ranks = range(rank, rank + 1)
        self.failures = 0
        self._start: int | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shard-prefetch", daemon=True)
        self._thread.start()

    def advance(self, start: int) -> None:
        self._start = start
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            start = self._start
            if start is None or self._stop.is_set():
                continue
            self.planner.position, self.planner.cursor = start, None
            ahead = start - self.planner.reference()[0]  # distances count from the oldest batch in flight
            for sid, offset in self.planner.upcoming(start, self.lookahead, self.ranks):
                shard = self.shards[sid]
                if shard is None or self.cache.present(shard.sha256):
                    continue
                if self._stop.is_set() or self._start != start:
                    break  # the loader moved on: plan again from there
                what = f"shard {shard.path or shard.url}"
                try:
                    if not self.cache.fetch(shard, what=what, admit_within=float(ahead + offset)):
                        break  # full of shards needed sooner
                except UserError as e:  # the reader fetches it again and raises it if it persists
                    self.failures += 1
                    print(f"adapter_trainer: prefetch of {what} failed, its reader will fetch it: {e}", file=sys.stderr)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread; a download still running after `timeout_s` is left to the daemon thread (a process that
        exits first leaves a .part, which the cache reclaims)."""
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=timeout_s)
