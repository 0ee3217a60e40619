"""The recipe's data from the config: the shard sets and split indexes, the example spec, the train example order,
the eval set spans, the loader, and what the run records and prints about its data."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from adapter_trainer.config import CacheConfig, ConfigError, DataConfig, ModelConfig, shard_paths, shard_weights
from adapter_trainer.data.mixture import MixtureOrder, sample_weights, split_spans
from adapter_trainer.data.remote.cache import BOOKKEEPING_BYTES, ShardCache, cache_for
from adapter_trainer.data.remote.planner import Prefetcher, ShardPlanner
from adapter_trainer.data.remote.urls import is_url, pin_all
from adapter_trainer.data.shards import ShardFormatError, ShardSet, codec_notes, local_set_problem, open_shard_sets
from adapter_trainer.data.split_index import SplitIndex, build_index
from adapter_trainer.data.streaming import ExampleOrder, ExampleSpec, TrainBatches, default_num_workers, train_loader
from adapter_trainer.data.token_layout import AudioVocab, Batch
from adapter_trainer.data.worker_lifetime import start_workers
from adapter_trainer.training.checkpoint import TrainingProgress
from adapter_trainer.training.distributed import RankInfo


def pinned_shard_paths(d: DataConfig, dist: RankInfo) -> list[str]:
    """data.shards' paths with every Hub revision pinned to its commit by rank 0 and sent to all ranks."""
    paths = shard_paths(d.shards)
    if not any(is_url(p) for p in paths):
        return paths
    return dist.broadcast_object(pin_all(paths, tries=d.cache.retries) if dist.is_main else None)


def check_local_sets(d: DataConfig) -> None:
    """Every local entry of data.shards is a directory holding a manifest (data.shards.local_set_problem), before any
    model is looked at; remote sets are read when opened."""
    for path in shard_paths(d.shards):
        if not is_url(path) and (problem := local_set_problem(path)):
            raise ShardFormatError(problem)


def ask_about_model_sources(model: ModelConfig, dist: RankInfo) -> None:
    """Rank 0 asks the Hub once per tower id (its refusal raised on every rank); every rank adopts the answers."""
    from adapter_trainer.model import hub_source
    from adapter_trainer.model.builders import check_model_sources

    dist.run_on_main(lambda: check_model_sources(model))
    hub_source.adopt(dist.broadcast_object(hub_source.decisions() if dist.is_main else None))


def shard_cache(c: CacheConfig, paths: Sequence[str]) -> ShardCache | None:
    """The local cache for the remote sets among `paths` (data.cache.*); None when every set is a directory."""
    return cache_for(list(paths), cache_dir=c.dir, max_bytes=c.max_bytes, policy=c.policy, tries=c.retries)


def remote_sets_line(c: CacheConfig, shard_sets: Sequence[ShardSet], index: SplitIndex) -> str | None:
    """The startup line naming the remote sets (Hub revisions pinned) and their cache; None for local sets."""
    remote = [s for s in shard_sets if s.is_remote]
    if not remote:
        return None
    cache_dir = index.cache.root if index.cache is not None else "?"
    bound = f"{c.max_bytes:,} bytes" if c.max_bytes else "no bound"
    return (
        f"remote shard sets: {', '.join(str(s.root) for s in remote)}; cache {cache_dir} ({bound}, policy "
        f"{c.policy}, prefetch {c.prefetch} micro-batches), every tar checked against its sha256"
    )


def loader_workers(num_workers: int, dist: RankInfo) -> int:
    """DataLoader workers per rank: trainer.num_workers, or -1 = half this rank's share of the CPUs (1 to 8)."""
    return num_workers if num_workers >= 0 else default_num_workers(dist.local_world_size)


def check_cache_bound(bound: int, workers: int, shard_sets: Sequence[ShardSet], dist: RankInfo) -> str | None:
    """Refuse a data.cache.max_bytes (`bound`) that cannot hold the largest remote shard and the cache's own files;
    a note when it holds fewer shards than the node reads at once (each reader and prefetcher holds one tar)."""
    sizes = [e.bytes for s in shard_sets if s.is_remote for entries in s.splits.values() for e in entries]
    if not bound or not sizes:
        return None
    largest = max(sizes)
    if bound < largest + BOOKKEEPING_BYTES:
        raise ConfigError(
            f"data.cache.max_bytes={bound} cannot hold the largest remote shard ({largest} bytes) and the cache's own "
            f"files (up to {BOOKKEEPING_BYTES} bytes); set it to at least {largest + BOOKKEEPING_BYTES}, better "
            f"several shards"
        )
    readers = dist.local_world_size * (max(workers, 1) + 1)
    if bound < readers * largest + BOOKKEEPING_BYTES:
        return (
            f"note: data.cache.max_bytes={bound} holds {(bound - BOOKKEEPING_BYTES) // largest} shard(s) of up to "
            f"{largest} bytes, but this node reads up to {readers} at once ({dist.local_world_size} rank(s) x "
            f"({max(workers, 1)} reader(s) + 1 prefetch)): downloads will wait for readers; "
            f"{readers * largest + BOOKKEEPING_BYTES} or more avoids it"
        )
    return None


def open_sets(
    d: DataConfig, dist: RankInfo, audio_lm: str, n_codebooks: int, codebook_size: int, *, workers: int
) -> list[ShardSet]:
    """data.shards opened and checked against the audio LM's K x C and each other's codec, before any weight loads;
    remote sets read through their cache (bound checked first; notes printed on rank 0)."""
    paths = pinned_shard_paths(d, dist)  # a Hub revision: its commit, the same on every rank
    shard_sets = open_shard_sets(
        paths,
        model_n_codebooks=n_codebooks,
        model_codebook_size=codebook_size,
        audio_lm=audio_lm,
        cache=shard_cache(d.cache, paths),
        tries=d.cache.retries,
    )
    note = check_cache_bound(d.cache.max_bytes, workers, shard_sets, dist)  # before any remote tar is fetched
    for line in [*codec_notes(shard_sets), *([note] if note else [])]:
        if dist.is_main:
            print(line)
    return shard_sets


def split_indexes(d: DataConfig, shard_sets: list[ShardSet]) -> tuple[SplitIndex, SplitIndex]:
    """The train and eval splits' header-only indexes; an empty train split is a ConfigError naming failures.jsonl."""
    train_index = build_index(shard_sets, d.train_split, sha256=d.verify_sha256)
    eval_index = build_index(shard_sets, d.eval_split, max_clips=d.eval_max_clips, sha256=d.verify_sha256)
    if not len(train_index):
        raise ConfigError(
            f"split data.train_split={d.train_split!r} is empty in {d.shards}"
            + "".join(_failures_note(s) for s in shard_sets)
            + "; check a set with python -m tokenizer_pipeline.verify DIR, fix its input and encode it again"
        )
    return train_index, eval_index


def _failures_note(shard_set: ShardSet) -> str:
    """`; <set>/failures.jsonl lists N failed rows` for a local set with recorded failures, else ''."""
    if shard_set.is_remote:
        return ""
    path = Path(shard_set.root) / "failures.jsonl"
    n = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip()) if path.is_file() else 0
    return f"; {path} lists {n} failed rows (why each clip is missing)" if n else ""


def data_lines(d: DataConfig, train_data: TrainBatches, shard_sets: Sequence[ShardSet], index: SplitIndex) -> list[str]:
    """The startup lines about the data after the run's own: a weighted mixture's shares, the remote sets."""
    lines = []
    order = train_data.order
    if isinstance(order, MixtureOrder):
        shares = ", ".join(f"{path}: {p:.3f}" for path, p in zip(shard_paths(d.shards), order.p))
        lines.append(f"mixture: {order.epoch_size} examples per epoch; share per draw {shares}")
    remote = remote_sets_line(d.cache, shard_sets, index)
    return lines + ([remote] if remote else [])


def write_data_sources(path: Path, shards: list, shard_sets: Sequence[ShardSet]) -> None:
    """data_sources.json: where each set was read (Hub revisions pinned) and its manifest's sha256."""
    sources = [
        {"given": given, "read_from": str(s.root), "manifest_sha256": s.manifest_sha256}
        for given, s in zip(shard_paths(shards), shard_sets)
    ]
    path.write_text(json.dumps(sources, indent=2, allow_nan=False) + "\n")


def plan_remote_reads(
    train_data: TrainBatches, index: SplitIndex, dist: RankInfo, lookahead: int, in_flight: int = 1
) -> Prefetcher | None:
    """For a remote train split: a ShardPlanner (eviction by next use) and this rank's Prefetcher (None for local
    sets). in_flight: micro-batches the DataLoader may build at once."""
    cache = index.cache
    if cache is None or not index.shard_remote:
        return None
    first = dist.rank - dist.local_rank  # torchrun numbers a node's ranks consecutively
    planner = ShardPlanner(
        train_data.order,
        index.shard,
        [r.sha256 if r is not None else None for r in index.shard_remote],
        batch_size=train_data.batch_size,
        world_size=train_data.world_size,
        node_ranks=range(first, first + dist.local_world_size),
        in_flight=in_flight,
    )
    train_data.planner = planner
    cache.next_use = planner.next_use
    if lookahead <= 0:
        return None
    return Prefetcher(cache, planner, index.shard_remote, dist.rank, lookahead)


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
    )


def train_order(
    d: DataConfig, seed: int, shard_sets: Sequence[ShardSet], train_index: SplitIndex
) -> ExampleOrder | None:
    """None (concatenation) unless data.shards gives weights or samples carry `weight`s: then a MixtureOrder
    (per-sample weights alone keep each set's share of the concatenation)."""
    spans = split_spans(shard_sets, d.train_split, len(train_index))
    per_sample = sample_weights(shard_sets, train_index, spans, d.train_split)
    weights = shard_weights(d.shards)
    if weights is None and all(w is None for w in per_sample):
        return None
    if weights is None:  # a set without train clips (an eval-only set) weighs 0 here
        return MixtureOrder(seed, spans, [float(b - a) for a, b in spans], 0, per_sample)
    for path, (start, stop) in zip(shard_paths(d.shards), spans):
        if stop == start:
            raise ConfigError(
                f"data.shards entry {path!r} has no clips in split data.train_split={d.train_split!r}, so a "
                f"weighted mixture cannot draw from it; remove it from data.shards or point it at a set with train clips"
            )
    return MixtureOrder(seed, spans, weights, d.mixture_epoch_size, per_sample)


def eval_set_spans(d: DataConfig, shard_sets: Sequence[ShardSet], n_eval: int) -> list[tuple[str, int, int]]:
    """(data.shards path, start, stop) of each set's rows in the eval index: the held-out report's per-set figures."""
    spans = split_spans(shard_sets, d.eval_split, n_eval)
    return [(name, start, stop) for name, (start, stop) in zip(shard_paths(d.shards), spans)]


def resumed_batches(
    train_data: TrainBatches,
    progress: TrainingProgress,
    *,
    n_micro_batches: int,
    num_workers: int,
    prefetch_factor: int,
    pin_memory: bool = False,
    on_position: Callable[[int], None] | None = None,
) -> Iterator[Batch]:
    """This rank's next n_micro_batches micro-batches from the saved position, built ahead by DataLoader workers;
    the caller ends them with data.worker_lifetime.closing_workers. The position is the global example number
    epoch * E + index, the same on every rank, so a resume may change the world size.
    """
    start = progress.epoch * train_data.epoch_size + progress.index
    if train_data.planner is not None:  # a remote set: no shard is needed, nor prefetched, past the last micro-batch
        train_data.planner.stop_at(start + n_micro_batches * train_data.global_batch)
    return start_workers(
        train_loader(
            train_data,
            start=start,
            n_micro_batches=n_micro_batches,
            num_workers=num_workers,
            prefetch_factor=prefetch_factor,
            pin_memory=pin_memory,
            on_position=on_position,
        )
    )
