"""Training batches streamed from shards: a deterministic global example order, split across ranks, built in workers.

The order is a pure function of (seed, position): global example n is clip `perm_e[i]` of epoch e = n // N at
index i = n % N, where perm_e = default_rng([seed, e]).permutation(N), and its random crop uses
default_rng([seed, e, i]). A micro-batch is G = batch_size x world_size consecutive examples starting at a
position n; rank r builds examples [n + r*B, n + (r+1)*B). So 2 ranks x batch 4 see exactly the examples of
1 process x batch 8, resume is the single integer n (stored as (epoch, index)), and neither the number of
workers nor of shards changes anything (each item is built from the index by random access).

DataLoader items are whole micro-batches (`batch_size=None`): a worker reads the codes, crops, tokenizes the
captions and collates; `prefetch_factor` micro-batches per worker are built ahead of the step.

That is the order of concatenated sets (`ConcatOrder`, N = all train clips). A weighted mixture
(adapter_trainer.data.mixture.MixtureOrder) only changes which clip a position (epoch, index) holds and the epoch
length; positions, crops, rank slices and resume stay exactly as above.
"""

from __future__ import annotations

import hashlib
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from adapter_trainer.data.caption_dropout import drop_caption, drop_words
from adapter_trainer.data.clip_reader import ClipReader
from adapter_trainer.data.samples import Clip
from adapter_trainer.data.split_index import SplitIndex
from adapter_trainer.data.token_layout import AudioVocab, Batch, Example, collate, encode_example
from adapter_trainer.data.worker_lifetime import end_with_parent


@dataclass(frozen=True)
class ExampleSpec:
    """How a (caption, codes) pair becomes a training sequence (mirrors data.* and the model's vocab)."""

    vocab: AudioVocab
    pattern: str  # delay | flatten
    text: str  # caption | aspects
    bos_id: int
    pad_id: int
    max_seq_len: int
    max_caption_tokens: int
    caption_dropout: float = 0.0  # P(train caption -> empty caption), for classifier-free guidance (caption_dropout.py)
    start_crop_prob: float = 0.0  # P(train crop starts at the clip's first frame) instead of a random frame
    caption_word_dropout: float = 0.0  # P(each word of a train caption is left out), augmentation (caption_dropout.py)


def conditioning_text(caption: str, aspects: tuple[str, ...], text: str) -> str:
    """The conditioning text: the caption, or the aspect list joined with ", " (data.text)."""
    return caption if text == "caption" else ", ".join(aspects)


def text_of(clip: Clip, text: str) -> str:
    """The conditioning text of a clip (`conditioning_text`)."""
    return conditioning_text(clip.caption, clip.aspects, text)


def distinct_texts(index: SplitIndex, text: str) -> int:
    """How many distinct conditioning texts (data.text) the clips of `index` have, before any caption or word
    dropout. Reads each clip's json member alone (one seek and a few hundred bytes, in index order: tar order);
    no codes are read. Keeps a 16-byte digest per distinct text, not the texts. From format-5 index sidecars nothing
    is read: each clip's text digest is in the index."""
    digests = index.caption_digest if text == "caption" else index.aspects_digest
    if digests is not None:
        return int(np.unique(digests).size)
    reader = ClipReader(index)
    try:
        return len(
            {
                hashlib.blake2b(
                    conditioning_text(*reader.read_text_fields(i), text).encode("utf-8"), digest_size=16
                ).digest()
                for i in range(len(index))
            }
        )
    finally:
        reader.close()


def caption_ids(tokenizer: Any, clip: Clip, spec: ExampleSpec, text: str | None = None) -> list[int]:
    """Caption tokens without BOS (encode_example adds it), truncated to max_caption_tokens. `text` replaces the
    clip's conditioning text (a training caption after word dropout)."""
    text = text_of(clip, spec.text) if text is None else text
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])[: spec.max_caption_tokens]


def eval_example(spec: ExampleSpec, caption: list[int], clip: Clip, crop: Literal["start", "end"] = "start") -> Example:
    """The deterministic eval sequence of a clip: cropped at the clip start, with the same audio budget whatever the
    caption's length (max_seq_len - max_caption_tokens - 2 positions after BOS + AUDIO_START), so true and deranged
    captions score exactly the same code targets. crop="end" takes the clip's last frames instead: the window that
    holds its AUDIO_END target (the learning check's END CE)."""
    audio_budget = spec.max_seq_len - spec.max_caption_tokens - 2
    return encode_example(
        caption,
        clip.codes,
        vocab=spec.vocab,
        pattern=spec.pattern,
        bos_id=spec.bos_id,
        max_seq_len=len(caption) + 2 + audio_budget,
        max_caption_tokens=spec.max_caption_tokens,
        crop=crop,
        rng=np.random.default_rng(0),
        key=clip.key,
    )


def train_crop(start_crop_prob: float, rng: np.random.Generator) -> Literal["start", "random"]:
    """A training example's crop: "start" (the clip's first frames) with probability start_crop_prob, else "random".
    Drawn from its own stream (seed, epoch, index, 2), so with start_crop_prob=0 nothing is drawn and the crops are
    exactly those of a run without the option."""
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
        """order: which clip each position holds; None = ConcatOrder over the whole index."""
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
        """Positions per epoch: all train clips (concatenation) or the mixture's epoch size."""
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
            # caption word dropout and caption dropout draw from their own streams (seed, epoch, index, 3) and
            # (seed, epoch, index, 1): crops stay as without them, resume is exact
            text = drop_words(
                text_of(clip, s.text), s.caption_word_dropout, np.random.default_rng([self.seed, epoch, index, 3])
            )
            caption = drop_caption(
                caption_ids(self.tokenizer, clip, s, text),
                s.caption_dropout,
                np.random.default_rng([self.seed, epoch, index, 1]),
            )
            examples.append(
                encode_example(
                    caption,
                    clip.codes,
                    vocab=s.vocab,
                    pattern=s.pattern,
                    bos_id=s.bos_id,
                    max_seq_len=s.max_seq_len,
                    max_caption_tokens=s.max_caption_tokens,
                    crop=train_crop(s.start_crop_prob, np.random.default_rng([self.seed, epoch, index, 2])),
                    rng=rng,
                    key=clip.key,
                )
            )
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
    # a terminal's Ctrl-C reaches the workers too, and a job scheduler's SIGTERM every process of the job: the
    # training process decides (it finishes its step and checkpoints, training.interrupt), so a worker that died of
    # it does not break that last step. The worker ends with its parent instead (data.worker_lifetime).
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
    """Micro-batches starting at global positions start, start + G, ... (G = global batch), in order.
    on_position(start) is called as the loader hands each micro-batch to a worker (a remote set's prefetcher).
    Iterate it with data.worker_lifetime (`closing_workers(start_workers(loader))`): its workers ignore SIGTERM."""
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
