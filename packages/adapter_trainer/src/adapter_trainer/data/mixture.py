"""Weighted mixtures of shard sets: the global example order when data.shards gives weights.

The convention is lhotse's `CutSet.mux` / webdataset's `RandomMix` (each example picks its source set at random,
set i with probability w_i / sum(w)) over infinite sources, like lhotse's `.repeat()`: within a set, clips come
in a seeded permutation without replacement and a set that runs out starts a new permutation (it cycles). As in
audiocraft, whose epoch is a fixed number of samples, a mixture epoch is a fixed number of draws E:
data.mixture_epoch_size, or the sum of the sets' train clips when that is 0.

Every draw is a pure function of (seed, epoch, index), so resume is the same one integer as for concatenation,
and ranks / DataLoader workers read disjoint slices of one global sequence (adapter_trainer.data.streaming):

    counts_e  = default_rng([seed, e, MIX, 1, 1]).multinomial(E, p)        draws of each set in epoch e   [S]
    labels_e  = default_rng([seed, e, MIX, 2, 1]).permutation(repeat(S, counts_e))   set of each draw  [E]
    draw m of set s (m counts set s's draws over all epochs) -> pass m // N_s, clip perm_s,pass[m % N_s],
    perm_s,pass = default_rng([seed, s, pass, MIX, 3]).permutation(N_s)

Multinomial counts shuffled into a sequence are exactly i.i.d. categorical draws, but they make "how many draws
of set s came before epoch e" a sum of S-vectors instead of a replay of every earlier draw. The streams are
seeded with 5-word lists ending in a non-zero word: numpy's SeedSequence pads lists shorter than 4 words with
zeros (so [a, b, c] and [a, b, c, 0] are one stream), and a 5-word list meets neither the crop stream
(seed, epoch, index) nor the caption-dropout stream (seed, epoch, index, 1) of streaming.py.

Per-sample weights (format v3's optional `weight`, audiocraft's per-row weight): in a set whose train samples
do not all weigh the same, each draw of that set takes clip j with probability weight_j / sum(weight), with
replacement (audiocraft's `sample_on_weight`), from u = default_rng([seed, e, MIX, 4, 1]).random(E)[index].
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from adapter_trainer.data.shards import ShardEntry, ShardFormatError, ShardSet
from adapter_trainer.data.split_index import SplitIndex, default_index_cache, index_entry

MIX = 0x4D4958  # "MIX": the tag of this module's random streams


def split_spans(sets: Sequence[ShardSet], split: str, n_rows: int) -> list[tuple[int, int]]:
    """[start, stop) rows of each set in a `build_index(sets, split)` index of n_rows rows (data.shards order)."""
    spans, start = [], 0
    for s in sets:
        stop = min(start + sum(e.n_samples for e in s.splits.get(split, ())), n_rows)
        spans.append((start, stop))
        start = stop
    return spans


def _weight_of(meta: object, path: str, key: str) -> float:
    """A v3 sample's optional `weight` (default 1.0). Raises ShardFormatError if it is not a finite number > 0."""
    w = meta.get("weight", 1.0) if isinstance(meta, dict) else None
    if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
        raise ShardFormatError(
            f"{path}: sample {key!r} has weight={w!r}; a sample weight is a finite number > 0 "
            f"(docs/shard-format.md); fix the source manifest's weight and regenerate the set"
        )
    return float(w)


def read_sample_weights(index: SplitIndex, rows: np.ndarray) -> np.ndarray:
    """[len(rows)] float64 `weight` of these rows of `index`, read from each sample's json member only."""
    out = np.empty(len(rows), dtype=np.float64)
    files: dict[int, object] = {}
    try:
        for j, i in enumerate(int(r) for r in rows):
            shard = int(index.shard[i])
            f = files.get(shard)
            if f is None:
                f = files[shard] = index.open_shard(shard)  # closed below
            f.seek(int(index.json_offset[i]))  # type: ignore[attr-defined]
            raw = f.read(int(index.json_size[i]))  # type: ignore[attr-defined]
            try:
                meta = json.loads(raw.decode("utf-8"))
            except ValueError as e:
                raise ShardFormatError(f"{index.shard_paths[shard]}: sample {index.key(i)!r} json: {e}") from e
            out[j] = _weight_of(meta, index.shard_paths[shard], index.key(i))
    finally:
        for f in files.values():
            f.close()  # type: ignore[attr-defined]
    return out


def _cached_shard_weights(index: SplitIndex, rows: np.ndarray, entry: ShardEntry, cache: Path | None) -> np.ndarray:
    """read_sample_weights of one whole shard, cached like the header scan (by the shard's sha256 + size)."""
    f = cache / f"{entry.sha256}-{entry.bytes}.weights.npy" if cache is not None else None
    if f is not None and len(rows) == entry.n_samples and f.is_file():
        try:
            return np.load(f, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise ShardFormatError(
                f"{f}: unreadable sample-weight cache entry for {entry.location} ({e}); delete the file (it is rebuilt "
                f"from the shard) or set ADAPTER_TRAINER_INDEX_CACHE=''"
            ) from e
    w = read_sample_weights(index, rows)
    if f is not None and len(rows) == entry.n_samples:
        cache.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
        tmp = f.with_name(f".{f.name}.{os.getpid()}.tmp.npy")
        np.save(tmp, w)
        os.replace(tmp, f)
    return w


def _indexed_weights(s: ShardSet, entry: dict, index: SplitIndex, start: int, stop: int) -> np.ndarray | None:
    """A format-5 set's rows' weights from its index: None (uniform) when the manifest's weight_min == weight_max."""
    if entry.get("weight_min") == entry.get("weight_max"):
        return None
    w = index.weight[start:stop] if index.weight is not None else None
    if w is None or not np.isfinite(w).all() or (w <= 0).any():
        raise ShardFormatError(
            f"{s.root}/{entry['path']}: sample weights are not all finite numbers > 0 (docs/shard-format.md); "
            f"fix the source manifest's weight and regenerate the set"
        )
    return w.copy() if np.ptp(w) > 0 else None


def sample_weights(
    sets: Sequence[ShardSet],
    index: SplitIndex,
    spans: Sequence[tuple[int, int]],
    split: str,
    cache: Path | None | str = "default",
) -> list[np.ndarray | None]:
    """Per set: its rows' sample weights when they are not all equal, else None (uniform: permutations).

    Only format-3 sets can carry weights; older sets are uniform without reading anything. A v3 set's weights are
    read once per shard from the samples' json members and cached next to the header scans
    (`default_index_cache()` for "default"; None = no cache).
    """
    cache_dir = default_index_cache() if cache == "default" else (Path(cache) if cache is not None else None)
    out: list[np.ndarray | None] = []
    for s, (start, stop) in zip(sets, spans):
        # a MusicCaps sample has no `weight` (docs/shard-format.md): its set is uniform without reading anything
        if s.format_version < 3 or stop == start or (s.manifest.get("source") or {}).get("kind") == "musiccaps":
            out.append(None)
            continue
        entry = index_entry(s, split)
        if entry is not None:  # format 5: the manifest says whether the weights differ, the index holds them
            out.append(_indexed_weights(s, entry, index, start, stop))
            continue
        entries = {e.location: e for e in s.splits[split]}
        shard_of_row = index.shard[start:stop]  # [n] shard ids, ascending (the index keeps shard order)
        parts = [
            _cached_shard_weights(
                index, start + np.flatnonzero(shard_of_row == sid), entries[index.shard_paths[sid]], cache_dir
            )
            for sid in np.unique(shard_of_row)
        ]
        w = np.concatenate(parts)  # [n]
        out.append(w if np.ptp(w) > 0 else None)
    return out


class MixtureOrder:
    """(epoch, index) -> clip row of a weighted mixture of sets (see the module docstring for the streams)."""

    def __init__(
        self,
        seed: int,
        spans: Sequence[tuple[int, int]],
        weights: Sequence[float],
        epoch_size: int = 0,
        sample_weights: Sequence[np.ndarray | None] | None = None,
    ) -> None:
        sizes = np.array([stop - start for start, stop in spans], dtype=np.int64)  # [S]
        w = np.asarray(weights, dtype=np.float64)  # [S]
        if len(w) != len(sizes) or (w < 0).any() or ((w > 0) & (sizes == 0)).any() or not w.sum() > 0:
            raise ValueError(f"a mixture needs a weight > 0 per non-empty set (0 for an empty one): {w}, sizes {sizes}")
        self.seed, self.spans, self.sizes = seed, list(spans), sizes
        self.p = w / w.sum()  # [S] probability of each set per draw
        self.epoch_size = int(epoch_size) or int(sizes.sum())
        sw = sample_weights or [None] * len(sizes)
        self.cum_weights = [None if x is None else np.cumsum(x) for x in sw]  # [N_s] per weighted set
        self._offsets: list[np.ndarray] = [np.zeros(len(sizes), np.int64)]  # draws of each set before epoch e
        self._epoch: tuple[int, np.ndarray, np.ndarray, np.ndarray | None] | None = None
        self._perms: dict[int, tuple[int, np.ndarray]] = {}

    def counts(self, epoch: int) -> np.ndarray:
        """[S] draws of each set in `epoch` (sums to epoch_size)."""
        return np.random.default_rng([self.seed, epoch, MIX, 1, 1]).multinomial(self.epoch_size, self.p)

    def offsets(self, epoch: int) -> np.ndarray:
        """[S] draws of each set in epochs 0..epoch-1 (cached, so a long run sums each epoch once)."""
        while len(self._offsets) <= epoch:
            e = len(self._offsets) - 1
            self._offsets.append(self._offsets[-1] + self.counts(e))
        return self._offsets[epoch]

    def labels(self, epoch: int) -> np.ndarray:
        """[E] the set of each draw of `epoch`."""
        sets = np.repeat(np.arange(len(self.sizes)), self.counts(epoch))
        return np.random.default_rng([self.seed, epoch, MIX, 2, 1]).permutation(sets)

    def _epoch_arrays(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(labels [E], occurrence of each draw within its set [E], uniforms [E] or None), cached for one epoch."""
        if self._epoch is None or self._epoch[0] != epoch:
            labels = self.labels(epoch)
            order = np.argsort(labels, kind="stable")  # draws grouped by set, in sequence order
            first = np.concatenate([[0], np.cumsum(np.bincount(labels, minlength=len(self.sizes)))[:-1]])  # [S]
            occ = np.empty_like(order)
            occ[order] = np.arange(len(labels)) - first[labels[order]]
            u = None
            if any(c is not None for c in self.cum_weights):
                u = np.random.default_rng([self.seed, epoch, MIX, 4, 1]).random(self.epoch_size)  # [E]
            self._epoch = (epoch, labels, occ, u)
        return self._epoch[1], self._epoch[2], self._epoch[3]

    def _perm(self, s: int, rep: int) -> np.ndarray:
        """[N_s] the order of set s's clips in its pass `rep` (the latest pass per set is cached)."""
        cached = self._perms.get(s)
        if cached is None or cached[0] != rep:
            perm = np.random.default_rng([self.seed, s, rep, MIX, 3]).permutation(int(self.sizes[s]))
            self._perms[s] = cached = (rep, perm)
        return cached[1]

    def set_of(self, epoch: int, index: int) -> int:
        """The set that draw `index` of `epoch` comes from."""
        return int(self._epoch_arrays(epoch)[0][index])

    def clip(self, epoch: int, index: int) -> int:
        """The index row of draw `index` (0 <= index < epoch_size) of `epoch`."""
        labels, occ, u = self._epoch_arrays(epoch)
        s = int(labels[index])
        start = self.spans[s][0]
        cum = self.cum_weights[s]
        if cum is not None:  # per-sample weights: with replacement, P(j) = w_j / sum(w)
            j = int(np.searchsorted(cum, u[index] * cum[-1], side="right"))  # type: ignore[index]
            return start + min(j, int(self.sizes[s]) - 1)
        rep, q = divmod(int(self.offsets(epoch)[s] + occ[index]), int(self.sizes[s]))
        return start + int(self._perm(s, rep)[q])
