"""The recipe's data from the config: the example spec, the train example order, the eval set spans, the loader."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from adapter_trainer.config import ConfigError, DataConfig, TrainConfig, shard_paths, shard_weights
from adapter_trainer.data.mixture import MixtureOrder, sample_weights, split_spans
from adapter_trainer.data.shards import ShardSet
from adapter_trainer.data.split_index import SplitIndex
from adapter_trainer.data.streaming import ExampleOrder, ExampleSpec, TrainBatches, train_loader
from adapter_trainer.data.token_layout import AudioVocab, Batch
from adapter_trainer.training.checkpoint import TrainingProgress


def example_spec(d: DataConfig, vocab: AudioVocab, *, bos_id: int, pad_id: int) -> ExampleSpec:
    """How one training or eval sequence is built: the data.* settings with the model's vocab and special ids."""
    return ExampleSpec(
        vocab=vocab,
        pattern=d.pattern,
        text=d.text,
        bos_id=bos_id,
        pad_id=pad_id,
        max_seq_len=d.max_seq_len,
        max_caption_tokens=d.max_caption_tokens,
        caption_dropout=d.caption_dropout,
        start_crop_prob=d.start_crop_prob,
        caption_word_dropout=d.caption_word_dropout,
    )


def train_order(cfg: TrainConfig, shard_sets: Sequence[ShardSet], train_index: SplitIndex) -> ExampleOrder | None:
    """None (concatenation, the order of TrainBatches) unless data.shards gives weights or a set's samples carry
    different `weight`s (format 3): then a MixtureOrder. Per-sample weights alone keep each set's share of the
    concatenation (its weight is its clip count)."""
    d = cfg.data
    spans = split_spans(shard_sets, d.train_split, len(train_index))
    per_sample = sample_weights(shard_sets, train_index, spans, d.train_split)
    weights = shard_weights(cfg)
    if weights is None and all(w is None for w in per_sample):
        return None
    if weights is None:  # a set without train clips (an eval-only set) weighs 0 here
        return MixtureOrder(cfg.trainer.seed, spans, [float(b - a) for a, b in spans], 0, per_sample)
    for path, (start, stop) in zip(shard_paths(cfg), spans):
        if stop == start:
            raise ConfigError(
                f"data.shards entry {path!r} has no clips in split data.train_split={d.train_split!r}, so a "
                f"weighted mixture cannot draw from it; remove it from data.shards or point it at a set with train clips"
            )
    return MixtureOrder(cfg.trainer.seed, spans, weights, d.mixture_epoch_size, per_sample)


def eval_set_spans(cfg: TrainConfig, shard_sets: Sequence[ShardSet], n_eval: int) -> list[tuple[str, int, int]]:
    """(data.shards path, start, stop) of each set's rows in the eval index: the held-out report's per-set figures."""
    spans = split_spans(shard_sets, cfg.data.eval_split, n_eval)
    return [(name, start, stop) for name, (start, stop) in zip(shard_paths(cfg), spans)]


def resumed_batches(
    train_data: TrainBatches,
    progress: TrainingProgress,
    *,
    n_micro_batches: int,
    num_workers: int,
    prefetch_factor: int,
    pin_memory: bool = False,
) -> Iterator[Batch]:
    """This rank's next n_micro_batches micro-batches from the saved data position, built ahead by DataLoader workers
    (in page-locked memory with pin_memory: for CUDA, whose copies from there are asynchronous).

    The position is the global example number n = epoch * E + index (E: all train clips, or a weighted mixture's
    epoch size; adapter_trainer/data/streaming.py): the same on
    every rank, advanced by the GLOBAL micro-batch, so resuming works with another world size too.
    """
    start = progress.epoch * train_data.epoch_size + progress.index
    return iter(
        train_loader(
            train_data,
            start=start,
            n_micro_batches=n_micro_batches,
            num_workers=num_workers,
            prefetch_factor=prefetch_factor,
            pin_memory=pin_memory,
        )
    )
