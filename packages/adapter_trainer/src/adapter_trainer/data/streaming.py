"""Training batches streamed from shards: a deterministic global example order, split across ranks, built in workers.

Global example n is clip `order.clip(e, i)` at epoch e = n // E, index i = n % E (ConcatOrder: a seeded permutation
of all clips; a weighted `MixtureOrder` changes only which clip a position holds); its crop draws from
default_rng([seed, e, i]). A micro-batch of G = batch_size x world_size examples starts at n and rank r builds
[n + r*B, n + (r+1)*B), so 2 ranks x batch 4 see the examples of 1 process x batch 8 and resume is one integer.
DataLoader items are whole micro-batches (`batch_size=None`), read, cropped, tokenized and collated in workers.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from adapter_trainer.data.caption_dropout import drop_caption
from adapter_trainer.data.clip_reader import ClipReader
from adapter_trainer.data.samples import Clip
from adapter_trainer.data.split_index import SplitIndex
from adapter_trainer.data.token_layout import AudioVocab, Batch, Example, collate, encode_example
from adapter_trainer.data.worker_lifetime import end_with_parent


@dataclass(frozen=True)
class ExampleSpec:
    """How a (caption, codes) pair becomes a training sequence."""

    vocab: AudioVocab
    pattern: str  # delay | flatten
    text: str  # caption | aspects
    bos_id: int
    pad_id: int
    max_seq_len: int
    max_caption_tokens: int
    caption_dropout: float = 0.0  # P(train caption -> empty caption), for classifier-free guidance (caption_dropout.py)
    start_crop_prob: float = 0.0  # P(train crop starts at the clip's first frame) instead of a random frame


def conditioning_text(caption: str, aspects: tuple[str, ...], text: str) -> str:
    """The conditioning text: the caption, or the aspect list joined with ", " (data.text)."""
    return caption if text == "caption" else ", ".join(aspects)


def text_of(clip: Clip, text: str) -> str:
    """The conditioning text of a clip (`conditioning_text`)."""
    return conditioning_text(clip.caption, clip.aspects, text)


def distinct_texts(index: SplitIndex, text: str) -> int:
    """Distinct conditioning texts (data.text) of the clips of `index`, by their digests."""
    return int(np.unique(index.caption_digest if text == "caption" else index.aspects_digest).size)


def caption_ids(tokenizer: Any, clip: Clip, spec: ExampleSpec, text: str | None = None) -> list[int]:
    """Caption tokens without BOS, cut to max_caption_tokens; `text` replaces the clip's conditioning text."""
    text = text_of(clip, spec.text) if text is None else text
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])[: spec.max_caption_tokens]


Crop = Literal["random", "start", "end"]  # token_layout.encode_example's crops


def eval_example(spec: ExampleSpec, caption: list[int], clip: Clip, crop: Literal["start", "end"] = "start") -> Example:
    """A clip's deterministic eval sequence, with one audio budget whatever the caption's length, so true and
    deranged captions score the same code targets. crop="end": the last frames (the window with AUDIO_END)."""
    audio_budget = spec.max_seq_len - spec.max_caption_tokens - 2
    return _encode(spec, caption, clip, len(caption) + 2 + audio_budget, crop, np.random.default_rng(0))


def _encode(
    spec: ExampleSpec, caption: list[int], clip: Clip, max_seq_len: int, crop: Crop, rng: np.random.Generator
) -> Example:
    """`clip` as one sequence of at most max_seq_len tokens reading `caption` (token_layout.encode_example)."""
    return encode_example(
        caption,
        clip.codes,
        vocab=spec.vocab,
        pattern=spec.pattern,
        bos_id=spec.bos_id,
        max_seq_len=max_seq_len,
        max_caption_tokens=spec.max_caption_tokens,
        crop=crop,
        rng=rng,
        key=clip.key,
    )


def train_crop(start_crop_prob: float, rng: np.random.Generator) -> Literal["start", "random"]:
    """The crop: "start" with probability start_crop_prob, else "random" (p = 0 draws nothing)."""
    if start_crop_prob <= 0.0:
        return "random"
    return "start" if rng.random() < start_crop_prob else "random"


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The seeded order of the train clips in `epoch` ([N] int64)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


class ExampleOrder(Protocol):
    """Which train clip each position (epoch, index) of the global example sequence holds."""

    epoch_size: int  # positions per epoch

    def clip(self, epoch: int, index: int) -> int: ...


class ConcatOrder:
    """Concatenated sets: epoch e is `epoch_permutation(seed, e, N)` of all N train clips."""

    def __init__(self, seed: int, n_clips: int) -> None:
        self.seed, self.epoch_size = seed, n_clips
        self._perm: tuple[int, np.ndarray] | None = None

    def epoch_clips(self, epoch: int) -> np.ndarray:
        """[N] the clip at every index of `epoch`."""
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, epoch_permutation(self.seed, epoch, self.epoch_size))
        return self._perm[1]

    def clip(self, epoch: int, index: int) -> int:
        return int(self.epoch_clips(epoch)[index])


class TrainBatches(Dataset):
    """Item `start` (a global example position) -> this rank's share of the micro-batch that starts there."""

    def __init__(
        self,
        index: SplitIndex,
        tokenizer: Any,
        spec: ExampleSpec,
        *,
        seed: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        order: ExampleOrder | None = None,
    ) -> None:
        if len(index) == 0:
            raise ValueError("TrainBatches needs at least one train clip")
        self.reader = ClipReader(index)
        self.tokenizer = tokenizer
        self.spec = spec
        self.seed, self.batch_size, self.rank, self.world_size = seed, batch_size, rank, world_size
        self.n_clips = len(index)
        self.order = order if order is not None else ConcatOrder(seed, self.n_clips)
        self.planner: Any = None  # a remote set's ShardPlanner (data.remote.planner): told where this item starts

    @property
    def epoch_size(self) -> int:
        return self.order.epoch_size

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size

    def position(self, n: int) -> tuple[int, int, int]:
        """Global example n -> (epoch, index in that epoch's permutation, clip id)."""
        epoch, index = divmod(n, self.epoch_size)
        return epoch, index, self.order.clip(epoch, index)

    def rank_positions(self, start: int) -> range:
        """Global example positions this rank builds for the micro-batch starting at `start`."""
        first = start + self.rank * self.batch_size
        return range(first, first + self.batch_size)

    def __getitem__(self, start: int) -> Batch:
        s = self.spec
        if self.planner is not None:
            self.planner.position = start  # eviction in this process measures next uses from the example read
        examples = []
        for n in self.rank_positions(start):
            if self.planner is not None:
                self.planner.cursor = n
            epoch, index, i = self.position(n)
            clip = self.reader.read(i)
            rng = np.random.default_rng([self.seed, epoch, index])
            # caption dropout draws from its own stream (seed, epoch, index, 1): crops stay as without it
            caption = drop_caption(
                caption_ids(self.tokenizer, clip, s),
                s.caption_dropout,
                np.random.default_rng([self.seed, epoch, index, 1]),
            )
            crop = train_crop(s.start_crop_prob, np.random.default_rng([self.seed, epoch, index, 2]))
            examples.append(_encode(s, caption, clip, s.max_seq_len, crop, rng))
        return collate(examples, pad_id=s.pad_id)  # tokens/labels [B, S, J] long, masks [B, S] bool


class AnnouncedPositions:
    """A sampler over `positions` that tells `announce` each one as the DataLoader takes it."""

    def __init__(self, positions: range, announce: Callable[[int], None]) -> None:
        self.positions, self.announce = positions, announce

    def __len__(self) -> int:
        return len(self.positions)

    def __iter__(self) -> Iterator[int]:
        for p in self.positions:
            self.announce(p)
            yield p


def default_num_workers(local_world_size: int = 1) -> int:
    """Workers per rank when trainer.num_workers=-1: half this rank's share of the CPUs, at least 1, at most 8."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no sched_getaffinity
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus // max(1, local_world_size) // 2))


def _worker_init(_: int) -> None:
    torch.set_num_threads(1)  # batch building is light; leave the cores to the training process
    # the training process decides on Ctrl-C / SIGTERM (training.interrupt); a worker ends with its parent instead
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    end_with_parent()


def train_loader(
    dataset: TrainBatches,
    *,
    start: int,
    n_micro_batches: int,
    num_workers: int,
    prefetch_factor: int,
    pin_memory: bool = False,
    on_position: Callable[[int], None] | None = None,
) -> DataLoader:
    """Micro-batches at positions start, start + G, ... in order; on_position(start) as each is handed out (a
    remote set's prefetcher). Iterate it with `closing_workers(start_workers(loader))`: its workers ignore SIGTERM."""
    positions = range(start, start + n_micro_batches * dataset.global_batch, dataset.global_batch)
    return DataLoader(
        dataset,
        batch_size=None,
        sampler=positions if on_position is None else AnnouncedPositions(positions, on_position),
        num_workers=num_workers,
        prefetch_factor=prefetch_factor if num_workers > 0 else None,
        worker_init_fn=_worker_init if num_workers > 0 else None,
        pin_memory=pin_memory,
        persistent_workers=False,
    )
