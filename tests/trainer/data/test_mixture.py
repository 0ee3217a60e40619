"""Weighted mixtures of shard sets (adapter_trainer.data.mixture): shares follow the weights, each set is drawn
without replacement and cycles, the sequence is a function of the seed, ranks and workers read disjoint slices of
it, a loader started mid-epoch continues it exactly, and per-sample weights are honoured within a set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adapter_trainer.data.mixture import MixtureOrder, sample_weights, split_spans
from adapter_trainer.data.shards import ShardFormatError, open_shard_sets
from adapter_trainer.data.split_index import build_index
from adapter_trainer.data.streaming import ConcatOrder, TrainBatches, epoch_permutation, train_loader
from tests.contract.shard_fixture import synthetic_clips, write_shard_set, write_synthetic_set
from tests.trainer.data.test_streaming import SPEC, _WordTokenizer

SHARE_TOL = 0.015  # |observed - expected| share; over 40,000 draws the standard error is ~0.0022


def _open(*roots: Path):
    return open_shard_sets([str(r) for r in roots], model_n_codebooks=4, model_codebook_size=2048)


@pytest.fixture(scope="module")
def two_sets(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Set a: 21 train clips in 6 shards; set b: 7 train clips in 3 shards (keys bb...)."""
    root = tmp_path_factory.mktemp("mix")
    a = write_synthetic_set(root / "a", n_train=21, n_eval=5, frames=(8, 30), samples_per_shard=4)
    b = write_shard_set(root / "b", {"train": synthetic_clips(7, seed=5, prefix="bb"), "eval": []}, samples_per_shard=3)
    return [a, b]


def _draws(order, n: int) -> list[int]:
    return [order.clip(*divmod(k, order.epoch_size)) for k in range(n)]


def test_concat_order_is_todays_epoch_permutation() -> None:
    order = ConcatOrder(seed=3, n_clips=28)
    assert _draws(order, 56) == [*epoch_permutation(3, 0, 28).tolist(), *epoch_permutation(3, 1, 28).tolist()]


def test_shares_follow_the_weights_over_many_draws() -> None:
    spans = [(0, 100), (100, 110), (110, 140)]
    order = MixtureOrder(seed=0, spans=spans, weights=[3.0, 1.0, 0.5], epoch_size=1000)
    rows = np.array(_draws(order, 40_000))
    shares = [float(((rows >= a) & (rows < b)).mean()) for a, b in spans]
    for got, want in zip(shares, [3 / 4.5, 1 / 4.5, 0.5 / 4.5]):
        assert abs(got - want) <= SHARE_TOL, (shares, want)
    # per epoch, the counts sum to the epoch size and the labels are what clip() draws from
    for e in range(3):
        counts = order.counts(e)
        assert counts.sum() == 1000 and np.array_equal(np.bincount(order.labels(e), minlength=3), counts)


def test_each_set_is_drawn_without_replacement_and_cycles_across_epochs() -> None:
    spans = [(0, 5), (5, 25)]  # a small set with a big weight: it is exhausted and restarted several times
    order = MixtureOrder(seed=1, spans=spans, weights=[1.0, 1.0], epoch_size=12)
    rows = _draws(order, 120)  # 10 epochs
    small = [r for r in rows if r < 5]
    big = [r - 5 for r in rows if r >= 5]
    for draws, n in ((small, 5), (big, 20)):
        for p in range(len(draws) // n):  # every complete pass is a permutation of the set
            assert sorted(draws[p * n : (p + 1) * n]) == list(range(n)), (n, p)
    assert len(small) >= 15  # several passes of the small set happened across epoch ends


def test_the_sequence_is_a_function_of_the_seed() -> None:
    spans, weights = [(0, 30), (30, 40)], [3.0, 1.0]
    a = _draws(MixtureOrder(7, spans, weights), 200)
    assert a == _draws(MixtureOrder(7, spans, weights), 200)
    assert a != _draws(MixtureOrder(8, spans, weights), 200)
    # random access = sequential access (a fresh order asked for a late position first)
    late = MixtureOrder(7, spans, weights)
    assert [late.clip(*divmod(k, 40)) for k in range(199, -1, -1)] == a[::-1]


def test_equal_weights_on_equal_sets_are_not_the_concatenation_order_but_cover_both(two_sets) -> None:
    sets = _open(*two_sets)
    index = build_index(sets, "train")
    spans = split_spans(sets, "train", len(index))
    assert spans == [(0, 21), (21, 28)]
    order = MixtureOrder(0, spans, [1.0, 1.0])
    assert order.epoch_size == 28
    assert {order.set_of(0, i) for i in range(28)} == {0, 1}


def test_two_ranks_and_workers_read_disjoint_covering_slices_of_one_mixture(two_sets) -> None:
    """1 process x batch 8 = 2 ranks x batch 4 (rank r reads its slice of each global batch), with workers."""
    index = build_index(_open(*two_sets), "train")
    spans = split_spans(_open(*two_sets), "train", len(index))

    def batches(bs: int, rank: int, world: int, workers: int, start: int = 0, n: int = 9) -> list[list[str]]:
        order = MixtureOrder(3, spans, [3.0, 1.0], epoch_size=20)
        ds = TrainBatches(
            index, _WordTokenizer(), SPEC, seed=3, batch_size=bs, rank=rank, world_size=world, order=order
        )
        return [
            b.keys for b in train_loader(ds, start=start, n_micro_batches=n, num_workers=workers, prefetch_factor=2)
        ]

    one = batches(8, 0, 1, 0)  # 72 examples: more than 3 mixture epochs of 20
    ranks = [batches(4, r, 2, 2) for r in (0, 1)]
    assert [r0 + r1 for r0, r1 in zip(*ranks)] == one
    expected = MixtureOrder(3, spans, [3.0, 1.0], epoch_size=20)
    assert sum(one, []) == [index.key(i) for i in _draws(expected, 72)]
    # exact resume: a loader started at a later global position (mid-epoch) continues the same stream
    assert batches(4, 1, 2, 2, start=3 * 8, n=6) == ranks[1][3:]


def test_a_mixture_epoch_drives_the_recorded_position(two_sets) -> None:
    index = build_index(_open(*two_sets), "train")
    order = MixtureOrder(0, [(0, 21), (21, 28)], [1.0, 1.0], epoch_size=10)
    ds = TrainBatches(index, _WordTokenizer(), SPEC, seed=0, batch_size=4, order=order)
    assert ds.epoch_size == 10 and ds.position(23) == (2, 3, order.clip(2, 3))


def _weighted_set(root: Path, weights: dict[int, float]) -> Path:
    """A set of 6 train clips (shards of 4 + 2) whose sample i has weight weights.get(i, 1.0)."""
    train = synthetic_clips(6, prefix="tr")
    return write_shard_set(
        root,
        {"train": train, "eval": synthetic_clips(2, seed=1, prefix="ev")},
        samples_per_shard=4,
        weights={train[i][0]: w for i, w in weights.items()},
    )


def test_per_sample_weights_are_honoured_within_their_set(tmp_path: Path) -> None:
    weighted = _weighted_set(tmp_path / "w", {5: 9.0})  # clip 5 weighs 9, the others 1: P(clip 5) = 9/14
    uniform = write_shard_set(tmp_path / "u", {"train": synthetic_clips(4, seed=9, prefix="uu")})
    sets = _open(weighted, uniform)
    index = build_index(sets, "train")
    spans = split_spans(sets, "train", len(index))
    per_sample = sample_weights(sets, index, spans, "train")
    assert per_sample[0] is not None and per_sample[0].tolist() == [1, 1, 1, 1, 1, 9.0]
    assert per_sample[1] is None  # all weights equal (1.0): a permutation, as without weights
    order = MixtureOrder(0, spans, [1.0, 1.0], epoch_size=100, sample_weights=per_sample)
    rows = np.array(_draws(order, 20_000))
    in_set = rows[rows < 6]
    assert abs(float((in_set == 5).mean()) - 9 / 14) <= SHARE_TOL
    assert abs(float((rows < 6).mean()) - 0.5) <= SHARE_TOL  # the set's share is still its mixture weight
    other = rows[rows >= 6] - 6
    assert all(sorted(other[p * 4 : (p + 1) * 4].tolist()) == [0, 1, 2, 3] for p in range(len(other) // 4))


@pytest.mark.parametrize("bad", [0, -1.0])
def test_a_bad_sample_weight_is_refused_naming_the_index(tmp_path: Path, bad: float) -> None:
    sets = _open(_weighted_set(tmp_path / "bad", {2: bad}))
    index = build_index(sets, "train")
    with pytest.raises(
        ShardFormatError, match=r"train/index.safetensors: sample weights are not all finite numbers > 0"
    ):
        sample_weights(sets, index, split_spans(sets, "train", len(index)), "train")
