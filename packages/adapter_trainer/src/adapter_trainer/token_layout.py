"""Token layout: how caption tokens and raw [T, K] codes become one training sequence.

INTERFACE STUB (to be implemented). The names and shapes below are the contract with recipe.py.

Combined vocabulary (V = text vocab size, K codebooks, C codes per codebook):
    [0, V)                text ids (the LLM's tokenizer)
    V + k*C + c           audio code c of codebook k   (per-codebook offsets keep codebook identity)
    V + K*C               AUDIO_START
    V + K*C + 1           AUDIO_END
    V + K*C + 2           AUDIO_PAD  (delay-pattern filler)
Sequence: BOS, caption tokens, AUDIO_START, audio (pattern), [AUDIO_END if the crop reaches the clip's end].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

PatternName = Literal["flatten", "delay"]
IGNORE_INDEX = -100


@dataclass(frozen=True)
class AudioVocab:
    text_vocab_size: int  # V
    n_codebooks: int  # K
    codebook_size: int  # C

    def code_id(self, k: int, code: int) -> int: ...
    @property
    def audio_start(self) -> int: ...
    @property
    def audio_end(self) -> int: ...
    @property
    def audio_pad(self) -> int: ...
    @property
    def size(self) -> int: ...  # V + K*C + 3


@dataclass
class Example:
    tokens: torch.Tensor  # [S, J] long, combined-vocab ids; J = 1 (flatten) or K (delay). Text positions repeat their id in every slot.
    is_audio: torch.Tensor  # [S] bool, True where the input token is in the audio range (AUDIO_START, codes, AUDIO_END, AUDIO_PAD)
    labels: torch.Tensor  # [S, J] long, next-step target ids in the combined vocab, IGNORE_INDEX where no loss (text, pads)
    key: str  # sample key (ytid)


@dataclass
class Batch:
    tokens: torch.Tensor  # [B, S, J] long
    is_audio: torch.Tensor  # [B, S] bool
    labels: torch.Tensor  # [B, S, J] long
    attention_mask: torch.Tensor  # [B, S] bool, True = real token (right padding)
    keys: list[str]


def encode_example(
    caption_ids: list[int],  # caption tokens WITHOUT BOS
    codes: np.ndarray,  # [T, K] int16 raw codes, as stored in shards
    *,
    vocab: AudioVocab,
    pattern: PatternName,
    bos_id: int,
    max_seq_len: int,
    max_caption_tokens: int,
    crop: Literal["random", "start"],
    rng: np.random.Generator,
    key: str = "",
) -> Example: ...


def collate(examples: list[Example], pad_id: int) -> Batch: ...


def decode_audio_tokens(tokens: torch.Tensor, *, vocab: AudioVocab, pattern: PatternName) -> np.ndarray:
    """Inverse of the audio part: tokens [S_audio, J] (between AUDIO_START and AUDIO_END, exclusive) -> codes [T, K]."""
    ...
