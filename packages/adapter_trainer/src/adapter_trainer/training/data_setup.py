"""The recipe's data from the config: the shard sets and split indexes, the example spec, the train example order,
the eval set spans, the loader, and what the run records and prints about its data."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from adapter_trainer.config import ConfigError, DataConfig, TrainConfig, shard_paths, shard_weights
from adapter_trainer.data.mixture import MixtureOrder, sample_weights, split_spans
from adapter_trainer.data.remote.cache import BOOKKEEPING_BYTES, ShardCache, cache_for
from adapter_trainer.data.remote.planner import Prefetcher, ShardPlanner
from adapter_trainer.data.remote.urls import is_url, pin_all
from adapter_trainer.data.shards import ShardSet, codec_notes, open_shard_sets
from adapter_trainer.data.split_index import SplitIndex, build_index
from adapter_trainer.data.streaming import ExampleOrder, ExampleSpec, TrainBatches, default_num_workers, train_loader
from adapter_trainer.data.token_layout import AudioVocab, Batch
from adapter_trainer.data.worker_lifetime import start_workers
from adapter_trainer.training.checkpoint import TrainingProgress
from adapter_trainer.training.distributed import RankInfo


def pinned_shard_paths(cfg: TrainConfig, dist: RankInfo) -> list[str]:
    """data.shards' paths with every Hub revision pinned to its commit by rank 0 and sent to all ranks, so every
    rank and worker of the run reads one revision (adapter_trainer.data.remote.urls.pin)."""
    paths = shard_paths(cfg)
    if not any(is_url(p) for p in paths):
        return paths
    return dist.broadcast_object(pin_all(paths, tries=cfg.data.cache.retries) if dist.is_main else None)


def ask_about_model_sources(cfg: TrainConfig, dist: RankInfo) -> None:
    """The towers named by Hub ids (model.hub_source): rank 0 asks the Hub once per id (check_model_sources, whose
    refusal is raised on every rank) and every rank adopts its answers: one request per id for the whole job."""
    from adapter_trainer.model import hub_source
    from adapter_trainer.model.builders import check_model_sources

    dist.run_on_main(lambda: check_model_sources(cfg))
    hub_source.adopt(dist.broadcast_object(hub_source.decisions() if dist.is_main else None))


def shard_cache(cfg: TrainConfig, paths: Sequence[str]) -> ShardCache | None:
    """The local cache for the remote sets among `paths` (data.cache.*); None when every set is a directory."""
    c = cfg.data.cache
    return cache_for(list(paths), cache_dir=c.dir, max_bytes=c.max_bytes, policy=c.policy, tries=c.retries)


def remote_sets_line(cfg: TrainConfig, shard_sets: Sequence[ShardSet], index: SplitIndex) -> str | None:
    """The startup line naming the remote sets (Hub revisions pinned) and their cache; None for local sets."""
    remote = [s for s in shard_sets if s.is_remote]
    if not remote:
        return None
    c = cfg.data.cache
    cache_dir = index.cache.root if index.cache is not None else "?"
    bound = f"{c.max_bytes:,} bytes" if c.max_bytes else "no bound"
    return (
        f"remote shard sets: {', '.join(str(s.root) for s in remote)}; cache {cache_dir} ({bound}, policy "
        f"{c.policy}, prefetch {c.prefetch} micro-batches), every tar checked against its sha256"
    )


def loader_workers(cfg: TrainConfig, dist: RankInfo) -> int:
    """DataLoader workers per rank: trainer.num_workers, or -1 = half this rank's share of the CPUs (1 to 8)."""
    t = cfg.trainer
    return t.num_workers if t.num_workers >= 0 else default_num_workers(dist.local_world_size)


def check_cache_bound(cfg: TrainConfig, shard_sets: Sequence[ShardSet], dist: RankInfo) -> str | None:
    """Before any tar is fetched: refuse a data.cache.max_bytes that cannot hold the largest remote shard beside the
    cache's own files (BOOKKEEPING_BYTES; ConfigError), and return a one-line note when it holds fewer shards than
    the node reads at once. Each reading process (a rank's workers, or the rank itself) holds one tar while reading a
    clip or reserves one download, and each rank's prefetcher one more: below (ranks x (workers + 1)) x the largest
    shard, downloads wait for readers."""
    bound = cfg.data.cache.max_bytes
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
    workers = loader_workers(cfg, dist)
    readers = dist.local_world_size * (max(workers, 1) + 1)
    if bound < readers * largest + BOOKKEEPING_BYTES:
        return (
            f"note: data.cache.max_bytes={bound} holds {(bound - BOOKKEEPING_BYTES) // largest} shard(s) of up to "
            f"{largest} bytes, but this node reads up to {readers} at once ({dist.local_world_size} rank(s) x "
            f"({max(workers, 1)} reader(s) + 1 prefetch)): downloads will wait for readers; "
            f"{readers * largest + BOOKKEEPING_BYTES} or more avoids it"
        )
    return None


def open_sets(cfg: TrainConfig, dist: RankInfo, *, n_codebooks: int, codebook_size: int) -> list[ShardSet]:
    """data.shards opened and checked against the audio LM's K codebooks of C codes and against each other's codec
    (before any weight is loaded); remote sets read through their cache, whose bound is checked before any tar is
    fetched (its note, and a note per set whose codec cannot be compared, on rank 0)."""
    paths = pinned_shard_paths(cfg, dist)  # a Hub revision: its commit, the same on every rank
    shard_sets = open_shard_sets(
        paths,
        model_n_codebooks=n_codebooks,
        model_codebook_size=codebook_size,
        audio_lm=cfg.model.audio_lm,
        cache=shard_cache(cfg, paths),
        tries=cfg.data.cache.retries,
    )
    note = check_cache_bound(cfg, shard_sets, dist)  # before any remote tar is fetched
    for line in [*codec_notes(shard_sets), *([note] if note else [])]:
        if dist.is_main:
            print(line)
    return shard_sets


def split_indexes(cfg: TrainConfig, shard_sets: list[ShardSet]) -> tuple[SplitIndex, SplitIndex]:
    """The train and eval splits' header-only indexes (~40 bytes per clip; codes are read per batch by DataLoader
    workers / per eval batch). An empty train split is a ConfigError that points at each set's failures.jsonl."""
    d = cfg.data
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
    """`; <set>/failures.jsonl lists N failed rows` for a local set whose stage-1 run recorded failures (why its clips
    are missing), else ''."""
    if shard_set.is_remote:
        return ""
    path = Path(shard_set.root) / "failures.jsonl"
    n = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip()) if path.is_file() else 0
    return f"; {path} lists {n} failed rows (why each clip is missing)" if n else ""


def data_lines(
    cfg: TrainConfig, train_data: TrainBatches, shard_sets: Sequence[ShardSet], index: SplitIndex
) -> list[str]:
    """The startup lines about the data after the run's own: a weighted mixture's shares, the remote sets."""
    lines = []
    order = train_data.order
    if isinstance(order, MixtureOrder):
        shares = ", ".join(f"{path}: {p:.3f}" for path, p in zip(shard_paths(cfg), order.p))
        lines.append(f"mixture: {order.epoch_size} examples per epoch; share per draw {shares}")
    remote = remote_sets_line(cfg, shard_sets, index)
    return lines + ([remote] if remote else [])


def write_data_sources(path: Path, cfg: TrainConfig, shard_sets: Sequence[ShardSet]) -> None:
    """data_sources.json: where each set was read (a URL with its Hub revision pinned to a commit) and the sha256
    of its manifest."""
    sources = [
        {"given": given, "read_from": str(s.root), "manifest_sha256": s.manifest_sha256}
        for given, s in zip(shard_paths(cfg), shard_sets)
    ]
    path.write_text(json.dumps(sources, indent=2, allow_nan=False) + "\n")


def plan_remote_reads(
    train_data: TrainBatches, index: SplitIndex, dist: RankInfo, lookahead: int, in_flight: int = 1
) -> Prefetcher | None:
    """For a remote train split: a ShardPlanner (eviction by next use in the example order, in this process and in
    every DataLoader worker) and this rank's Prefetcher thread. None for local sets. in_flight: micro-batches the
    DataLoader may build at once (workers x prefetch_factor, 1 without workers)."""
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
    on_position: Callable[[int], None] | None = None,
) -> Iterator[Batch]:
    """This rank's next n_micro_batches micro-batches from the saved data position, built ahead by DataLoader workers
    (in page-locked memory with pin_memory: for CUDA, whose copies from there are asynchronous). The caller ends
    the workers with data.worker_lifetime.closing_workers (an exit hook ends those of an iterator left alive).

    The position is the global example number n = epoch * E + index (E: all train clips, or a weighted mixture's
    epoch size; adapter_trainer/data/streaming.py): the same on
    every rank, advanced by the GLOBAL micro-batch, so resuming works with another world size too.
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
