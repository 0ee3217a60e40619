"""Token layout: how caption tokens and raw [T, K] codes become one training sequence (the contract with the
model, its loss, the training step and generation; docs/architecture.md draws it).

Combined vocabulary (V text ids, K codebooks, C codes each): [0, V) text; V + k*C + c code c of codebook k;
V + K*C AUDIO_START; +1 AUDIO_END; +2 AUDIO_PAD (delay-pattern filler). Sequence: BOS, caption, AUDIO_START, audio,
AUDIO_END where the crop reaches the clip's end. Each position has J slots (1 for "flatten", K for "delay"); text
positions and AUDIO_START repeat their id in every slot.

AUDIO_END sits where frame T's codebook 0 would be ("no frame T"): flatten, one position after frame T-1's last code;
delay, slot 0 of step T while slots k >= 1 finish the delayed tail (T + max(K - 1, 1) steps), so head 0 is trained
to say END at step T-1. Labels are next-step targets where the target is a code or AUDIO_END, IGNORE_INDEX elsewhere:
the loss never sees text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

PatternName = Literal["flatten", "delay"]
PATTERNS: tuple[str, ...] = ("flatten", "delay")
IGNORE_INDEX = -100


@dataclass(frozen=True)
class AudioVocab:
    text_vocab_size: int  # V
    n_codebooks: int  # K
    codebook_size: int  # C

    def __post_init__(self) -> None:
        for name in ("text_vocab_size", "n_codebooks", "codebook_size"):
            if int(getattr(self, name)) <= 0:
                raise ValueError(f"AudioVocab.{name} must be > 0, got {getattr(self, name)}")

    def code_id(self, k: int, code: int) -> int:
        """Combined-vocab id of raw code `code` in codebook `k`."""
        if not (0 <= k < self.n_codebooks and 0 <= code < self.codebook_size):
            raise ValueError(
                f"code (k={k}, c={code}) out of range: k must be in [0, {self.n_codebooks}), "
                f"c in [0, {self.codebook_size}); check the shard's n_codebooks/codebook_size"
            )
        return self.text_vocab_size + k * self.codebook_size + code

    @property
    def audio_offset(self) -> int:
        """First id of the audio range (= V, the id of code 0 of codebook 0)."""
        return self.text_vocab_size

    @property
    def n_codes(self) -> int:
        """K * C, the number of code ids."""
        return self.n_codebooks * self.codebook_size

    @property
    def audio_start(self) -> int:
        return self.text_vocab_size + self.n_codes

    @property
    def audio_end(self) -> int:
        return self.text_vocab_size + self.n_codes + 1

    @property
    def audio_pad(self) -> int:
        return self.text_vocab_size + self.n_codes + 2

    @property
    def n_audio_ids(self) -> int:
        """Size of the audio range: K*C codes + START, END, PAD."""
        return self.n_codes + 3

    @property
    def size(self) -> int:
        return self.text_vocab_size + self.n_codes + 3  # V + K*C + 3


@dataclass
class Example:
    # [S, J] long, combined-vocab ids; J = 1 (flatten) or K (delay). Text positions repeat their id in every slot.
    tokens: torch.Tensor
    # [S] bool, True where the input token is in the audio range (AUDIO_START, codes, AUDIO_END, AUDIO_PAD)
    is_audio: torch.Tensor
    # [S, J] long, next-step target ids in the combined vocab, IGNORE_INDEX where no loss (text, pads)
    labels: torch.Tensor
    key: str  # sample key (ytid)


@dataclass
class Batch:
    tokens: torch.Tensor  # [B, S, J] long
    is_audio: torch.Tensor  # [B, S] bool
    labels: torch.Tensor  # [B, S, J] long
    attention_mask: torch.Tensor  # [B, S] bool, True = real token (right padding)
    keys: list[str]

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
        return Batch(fn(self.tokens), fn(self.is_audio), fn(self.labels), fn(self.attention_mask), list(self.keys))

    def to(self, device: torch.device | str) -> Batch:
        """Every tensor on `device`; non-blocking only from pinned memory to CUDA (on MPS a non-blocking copy can read
        freed host memory: pytorch#139550)."""
        device = torch.device(device)
        return self._map(lambda t: t.to(device, non_blocking=device.type == "cuda" and t.is_pinned()))

    def pin_memory(self) -> Batch:
        """Page-locked copies (the DataLoader calls this with pin_memory=True)."""
        return self._map(torch.Tensor.pin_memory)


class DelayPattern:
    """MusicGen's delay pattern: codebook k is delayed by k steps.

    `build` maps codes [T, K] -> [S, K] with S = T + K - 1, step s slot k = code[s - k, k] when
    0 <= s - k < T, else P. For K = 4, T = 5 (B = a code, subscript = frame; P = pad):

        step s:   0    1    2    3    4    5    6    7
        k = 0  [ B0,  B1,  B2,  B3,  B4,  P,   P,   P  ]
        k = 1  [ P,   B0,  B1,  B2,  B3,  B4,  P,   P  ]
        k = 2  [ P,   P,   B0,  B1,  B2,  B3,  B4,  P  ]
        k = 3  [ P,   P,   P,   B0,  B1,  B2,  B3,  B4 ]

    (drawn like transformers' `build_delay_pattern_mask`, without its BOS column; the tensors are step-major
    [S, K]). `revert` inverts `build` exactly.
    """

    def __init__(self, n_q: int) -> None:
        if n_q <= 0:
            raise ValueError(f"DelayPattern needs n_q >= 1, got {n_q}")
        self.n_q = n_q

    def num_steps(self, timesteps: int) -> int:
        """S = T + K - 1 (0 when T = 0)."""
        return timesteps + self.n_q - 1 if timesteps > 0 else 0

    def _index(self, timesteps: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.arange(timesteps, device=device)[:, None]  # [T, 1]
        k = torch.arange(self.n_q, device=device)[None, :]  # [1, K]
        return (t + k), k.expand(timesteps, self.n_q)  # [T, K] step index, [T, K] slot index

    def build(self, codes: torch.Tensor, pad_value: int = -1) -> torch.Tensor:
        """codes [T, K] -> delayed [T + K - 1, K]; non-code cells hold `pad_value`."""
        if codes.ndim != 2 or codes.shape[1] != self.n_q:
            raise ValueError(f"DelayPattern.build expects codes [T, {self.n_q}], got {tuple(codes.shape)}")
        timesteps = codes.shape[0]
        out = codes.new_full((self.num_steps(timesteps), self.n_q), pad_value)  # [S, K]
        steps, slots = self._index(timesteps, codes.device)  # [T, K], [T, K]
        out[steps, slots] = codes  # out[t + k, k] = codes[t, k]
        return out

    def revert(self, seq: torch.Tensor) -> torch.Tensor:
        """delayed [S, K] -> codes [S - K + 1, K] (the exact inverse of `build`)."""
        if seq.ndim != 2 or seq.shape[1] != self.n_q:
            raise ValueError(f"DelayPattern.revert expects [S, {self.n_q}], got {tuple(seq.shape)}")
        if seq.shape[0] == 0:
            return seq.new_zeros((0, self.n_q))
        timesteps = seq.shape[0] - self.n_q + 1
        if timesteps <= 0:
            raise ValueError(
                f"a delayed sequence with K={self.n_q} needs at least {self.n_q} steps, got {seq.shape[0]}"
            )
        steps, slots = self._index(timesteps, seq.device)  # [T, K], [T, K]
        return seq[steps, slots]  # [T, K]


def n_slots(pattern: PatternName, n_codebooks: int) -> int:
    """J: slots per position (1 for flatten, K for delay)."""
    _check_pattern(pattern)
    return n_codebooks if pattern == "delay" else 1


def _check_pattern(pattern: str) -> None:
    if pattern not in PATTERNS:
        raise ValueError(f"unknown token pattern {pattern!r}; allowed: {list(PATTERNS)}")


def audio_steps(n_frames: int, pattern: PatternName, n_codebooks: int, *, with_end: bool = False) -> int:
    """Positions the audio part of `n_frames` frames takes (without AUDIO_START; with AUDIO_END if `with_end`).

    flatten: T*K (+ 1 END position). delay: T + K - 1 (with END: T + max(K - 1, 1), END in slot 0 of step T).
    """
    _check_pattern(pattern)
    if n_frames <= 0:
        return 0
    if pattern == "flatten":
        return n_frames * n_codebooks + int(with_end)
    return n_frames + (max(n_codebooks - 1, 1) if with_end else n_codebooks - 1)


def max_frames(budget: int, pattern: PatternName, n_codebooks: int) -> int:
    """Most frames whose audio part including AUDIO_END fits in `budget` positions."""
    _check_pattern(pattern)
    if pattern == "flatten":
        return max(0, (budget - 1) // n_codebooks)  # T*K codes + 1 END <= budget
    return max(0, budget - max(n_codebooks - 1, 1))  # T + max(K - 1, 1) steps (END in slot 0 of step T) <= budget


def _offset_codes(codes: torch.Tensor, vocab: AudioVocab) -> torch.Tensor:
    """raw codes [T, K] -> combined-vocab ids [T, K] (V + k*C + c)."""
    offsets = vocab.audio_offset + vocab.codebook_size * torch.arange(vocab.n_codebooks)  # [K]
    return codes + offsets[None, :]  # [T, K]


def encode_example(
    caption_ids: list[int],  # caption tokens WITHOUT BOS
    codes: np.ndarray,  # [T, K] int16 raw codes, as stored in shards
    *,
    vocab: AudioVocab,
    pattern: PatternName,
    bos_id: int,
    max_seq_len: int,
    max_caption_tokens: int,
    crop: Literal["random", "start", "end"],
    rng: np.random.Generator,
    key: str = "",
) -> Example:
    """One (caption, codes) pair as a sequence of at most `max_seq_len` positions: tokens [S, J], is_audio [S],
    labels [S, J]. The caption is cut to `max_caption_tokens`, the codes cropped by whole frames leaving room for
    AUDIO_END (written only when the crop reaches the clip's end). crop: "random" (start drawn from `rng`), "start"
    (frame 0) or "end" (the last frames: the eval window that scores AUDIO_END)."""
    _check_pattern(pattern)
    if crop not in ("random", "start", "end"):
        raise ValueError(f"unknown crop {crop!r}; allowed: ['random', 'start', 'end']")
    codes_np = np.asarray(codes)
    K, C = vocab.n_codebooks, vocab.codebook_size
    if codes_np.ndim != 2 or codes_np.shape[1] != K:
        raise ValueError(
            f"sample {key!r}: codes must be [T, {K}] (frame-major, see docs/shard-format.md), got "
            f"{codes_np.shape}; the shard's n_codebooks must match the audio LM's"
        )
    if codes_np.size and (codes_np.min() < 0 or codes_np.max() >= C):
        raise ValueError(
            f"sample {key!r}: code values must be in [0, {C}), got [{codes_np.min()}, {codes_np.max()}]; "
            f"the shard's codebook_size must match the audio LM's"
        )
    bad_text = [i for i in caption_ids if not 0 <= int(i) < vocab.text_vocab_size]
    if bad_text or not 0 <= bos_id < vocab.text_vocab_size:
        raise ValueError(
            f"sample {key!r}: text ids must be in [0, {vocab.text_vocab_size}) (got bos={bos_id}, "
            f"bad caption ids {bad_text[:5]}); use the LLM's own tokenizer"
        )

    prefix = [int(bos_id)] + [int(i) for i in caption_ids[: max(0, max_caption_tokens)]] + [vocab.audio_start]
    n_frames = codes_np.shape[0]
    budget = max_seq_len - len(prefix)
    keep = min(n_frames, max_frames(budget, pattern, K))
    if n_frames > 0 and keep <= 0:
        need = len(prefix) + audio_steps(1, pattern, K, with_end=True)
        raise ValueError(
            f"max_seq_len={max_seq_len} leaves no room for audio after {len(prefix)} prefix tokens "
            f"(need >= {need} for one frame with pattern={pattern!r}); raise max_seq_len or lower "
            f"max_caption_tokens={max_caption_tokens}"
        )
    start = int(rng.integers(0, n_frames - keep + 1)) if crop == "random" and n_frames > keep else 0
    if crop == "end":
        start = n_frames - keep
    reaches_end = start + keep == n_frames

    window = torch.from_numpy(codes_np[start : start + keep].astype(np.int64))  # [T', K]
    ids = _offset_codes(window, vocab)  # [T', K] combined-vocab ids
    J = n_slots(pattern, K)
    if pattern == "flatten":
        audio = ids.reshape(-1, 1)  # [T', K] -> [T'*K, 1], frame-major c0_t0, c1_t0, ...
        if reaches_end:
            audio = torch.cat([audio, torch.full((1, 1), vocab.audio_end, dtype=torch.long)])  # [T'*K + 1, 1]
    else:
        audio = DelayPattern(K).build(ids, pad_value=vocab.audio_pad)  # [T'+K-1, K]
        if reaches_end:
            if K == 1:  # no delayed tail: step T' is a position of its own
                audio = torch.cat([audio, torch.full((1, 1), vocab.audio_pad, dtype=torch.long)])  # [T'+1, 1]
            audio[keep, 0] = vocab.audio_end  # slot 0 of step T': "no frame T'"; slots k >= 1 finish the tail

    head = torch.tensor(prefix, dtype=torch.long)[:, None].expand(-1, J)  # [P, J]
    tokens = torch.cat([head, audio], dim=0).contiguous()  # [S, J]
    S = tokens.shape[0]
    assert max_seq_len >= S, (S, max_seq_len)

    is_audio = tokens[:, 0] >= vocab.audio_offset  # [S]; every slot of a position is in the same range
    labels = torch.full_like(tokens, IGNORE_INDEX)  # [S, J]
    nxt = tokens[1:]  # [S-1, J] next-step ids
    is_code = (nxt >= vocab.audio_offset) & (nxt < vocab.audio_start)  # [S-1, J]
    trainable = is_code | (nxt == vocab.audio_end)  # [S-1, J]; PAD, START and text are never targets
    labels[:-1] = torch.where(trainable, nxt, torch.full_like(nxt, IGNORE_INDEX))
    return Example(tokens=tokens, is_audio=is_audio, labels=labels, key=key)


def target_frames(
    tokens: torch.Tensor, labels: torch.Tensor, *, vocab: AudioVocab, pattern: PatternName
) -> torch.Tensor:
    """The window frame each code target belongs to (the caption gain by position): tokens, labels [B, S, J] ->
    [B, S, J] long, -1 where a cell has no code target. With AUDIO_START at position a, code (t, k) is the label of
    position a + t + k, slot k (delay) or a + t*K + k (flatten); a delayed late codebook still counts as frame t."""
    _check_pattern(pattern)
    K = vocab.n_codebooks
    B, S, J = labels.shape
    is_code = (labels >= vocab.audio_offset) & (labels < vocab.audio_start)  # [B, S, J]
    is_start = tokens[..., 0] == vocab.audio_start  # [B, S]
    a = is_start.long().argmax(dim=1)  # [B] position of AUDIO_START (0 when a row has none: no code target either)
    rel = torch.arange(S, device=labels.device)[None, :] - a[:, None]  # [B, S] p - a
    if pattern == "delay":
        frame = rel[..., None] - torch.arange(J, device=labels.device)[None, None, :]  # [B, S, K] t = p - a - k
    else:
        frame = torch.div(rel, K, rounding_mode="floor")[..., None]  # [B, S, 1] t = (p - a) // K
    return torch.where(is_code & (frame >= 0), frame, torch.full_like(frame, -1))  # [B, S, J]


def collate(examples: list[Example], pad_id: int) -> Batch:
    """Right-pad to the longest example: tokens = pad_id, labels = IGNORE_INDEX, is_audio/attention_mask False."""
    if not examples:
        raise ValueError("collate got an empty list of examples")
    J = examples[0].tokens.shape[1]
    if any(e.tokens.shape[1] != J for e in examples):
        raise ValueError(f"all examples must share J (slots); got {[e.tokens.shape[1] for e in examples]}")
    B, S = len(examples), max(e.tokens.shape[0] for e in examples)
    tokens = torch.full((B, S, J), pad_id, dtype=torch.long)  # [B, S, J]
    labels = torch.full((B, S, J), IGNORE_INDEX, dtype=torch.long)  # [B, S, J]
    is_audio = torch.zeros((B, S), dtype=torch.bool)  # [B, S]
    attention_mask = torch.zeros((B, S), dtype=torch.bool)  # [B, S]
    for b, e in enumerate(examples):
        n = e.tokens.shape[0]
        tokens[b, :n] = e.tokens
        labels[b, :n] = e.labels
        is_audio[b, :n] = e.is_audio
        attention_mask[b, :n] = True
    return Batch(
        tokens=tokens, is_audio=is_audio, labels=labels, attention_mask=attention_mask, keys=[e.key for e in examples]
    )


def decode_audio_tokens(tokens: torch.Tensor, *, vocab: AudioVocab, pattern: PatternName) -> np.ndarray:
    """Inverse of the audio part: tokens [S_audio, J] after AUDIO_START -> codes [T, K], with or without the
    clip's AUDIO_END (and, under delay, the tail steps after it)."""
    _check_pattern(pattern)
    K, C = vocab.n_codebooks, vocab.codebook_size
    tokens = torch.as_tensor(tokens, dtype=torch.long).cpu()
    J = n_slots(pattern, K)
    if tokens.ndim != 2 or tokens.shape[1] != J:
        raise ValueError(
            f"decode_audio_tokens with pattern={pattern!r} expects [S_audio, {J}], got {tuple(tokens.shape)}"
        )
    end = (tokens[:, 0] == vocab.audio_end).nonzero()
    if len(end):  # flatten: the codes are the positions before END; delay: END at step T, codes in T + K - 1 steps
        e = int(end[0])
        tokens = tokens[:e] if pattern == "flatten" else tokens[: DelayPattern(K).num_steps(e)]
    if pattern == "flatten":
        if tokens.shape[0] % K:
            raise ValueError(f"flatten audio length {tokens.shape[0]} is not a multiple of K={K} (truncated frame?)")
        ids = tokens.reshape(-1, K)  # [T*K, 1] -> [T, K]
    else:
        ids = DelayPattern(K).revert(tokens)  # [S, K] -> [T, K]
    offsets = vocab.audio_offset + C * torch.arange(K)  # [K]
    codes = ids - offsets[None, :]  # [T, K] raw
    bad = (codes < 0) | (codes >= C)
    if bad.any():
        t, k = (int(x) for x in bad.nonzero()[0])
        raise ValueError(
            f"token {int(ids[t, k])} at frame {t} slot {k} is not a code of codebook {k} "
            f"(expected [{int(offsets[k])}, {int(offsets[k]) + C})); pass only the tokens between AUDIO_START and AUDIO_END"
        )
    return codes.numpy().astype(np.int16)  # [T, K]
