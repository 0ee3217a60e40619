"""Weighted mixtures of shard sets: the global example order when data.shards gives weights.

lhotse's `CutSet.mux` over repeated sources: each draw picks set i with probability w_i / sum(w); within a set clips
come in seeded permutations that cycle. An epoch is E draws (data.mixture_epoch_size, or all train clips when 0).
Every draw is a pure function of (seed, epoch, index):

    counts_e  = default_rng([seed, e, MIX, 1, 1]).multinomial(E, p)                    draws of each set   [S]
    labels_e  = default_rng([seed, e, MIX, 2, 1]).permutation(repeat(S, counts_e))     set of each draw    [E]
    draw m of set s -> pass m // N_s, clip default_rng([seed, s, pass, MIX, 3]).permutation(N_s)[m % N_s]

Shuffled multinomial counts are i.i.d. categorical draws whose per-set totals before epoch e are a sum of counts.
The 5-word seeds ending in a non-zero word meet neither streaming.py's crop nor its caption-dropout streams (numpy
pads seed lists shorter than 4 words with zeros). A set whose samples weigh differently draws clip j with
probability weight_j / sum(weight), with replacement, from default_rng([seed, e, MIX, 4, 1]).random(E)[index].
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from adapter_trainer.data.shards import ShardFormatError, ShardSet
from adapter_trainer.data.split_index import SplitIndex, index_entry

MIX = 0x4D4958  # "MIX": the tag of this module's random streams


def split_spans(sets: Sequence[ShardSet], split: str, n_rows: int) -> list[tuple[int, int]]:
    """[start, stop) rows of each set in a `build_index(sets, split)` index of n_rows rows (data.shards order)."""
    spans, start = [], 0
    for s in sets:
        stop = min(start + sum(e.n_samples for e in s.splits.get(split, ())), n_rows)
        spans.append((start, stop))
        start = stop
    return spans


def _indexed_weights(s: ShardSet, entry: dict, index: SplitIndex, start: int, stop: int) -> np.ndarray | None:
    """A set's rows' weights from its index: None (uniform) when the manifest's weight_min == weight_max."""
    if entry.get("weight_min") == entry.get("weight_max"):
        return None
    w = index.weight[start:stop]
    if not np.isfinite(w).all() or (w <= 0).any():
        raise ShardFormatError(
            f"{s.root}/{entry['path']}: sample weights are not all finite numbers > 0 (docs/shard-format.md); "
            f"fix the source manifest's weight and regenerate the set"
        )
    return w.copy() if np.ptp(w) > 0 else None


def sample_weights(
    sets: Sequence[ShardSet], index: SplitIndex, spans: Sequence[tuple[int, int]], split: str
) -> list[np.ndarray | None]:
    """Per set: its rows' sample weights when they are not all equal (the manifest says), else None."""
    return [
        None if stop == start else _indexed_weights(s, index_entry(s, split), index, start, stop)
        for s, (start, stop) in zip(sets, spans)
    ]


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
