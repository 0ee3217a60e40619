"""Summed CE over the scored code targets (`TargetCE`) per codebook, clip and window frame: accumulated over batches,
gathered across ranks in clip order, averaged over derangements; and the unigram CE on the same targets (nats)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from adapter_trainer.data.token_layout import AudioVocab


@dataclass
class TargetCE:
    """Summed CE over code targets per codebook and per example (as LossOutput's), optionally per window frame."""

    sum_per_codebook: np.ndarray  # [K] float64
    count_per_codebook: np.ndarray  # [K] int64
    sum_per_example: np.ndarray  # [B] float64
    count_per_example: np.ndarray  # [B] int64
    sum_per_frame: np.ndarray | None = None  # [B, F] float64, F = frames of the eval window
    count_per_frame: np.ndarray | None = None  # [B, F] int64


def per_frame_sums(ce_per_target: torch.Tensor, frames: torch.Tensor, n_frames: int) -> tuple[np.ndarray, np.ndarray]:
    """ce_per_target [B, S, J], frames [B, S, J] (-1: no code target; token_layout.target_frames) -> CE sums [B, F]
    float64 and counts [B, F] int64 per example and window frame (F = n_frames)."""
    ce = ce_per_target.detach().cpu().double().numpy()  # [B, S, J]; cast after the copy: MPS has no float64
    fr = frames.detach().cpu().numpy()  # [B, S, J]
    B = fr.shape[0]
    if fr.size and fr.max() >= n_frames:
        raise RuntimeError(f"a code target of frame {int(fr.max())} is outside the {n_frames}-frame eval window")
    b_idx = np.broadcast_to(np.arange(B)[:, None, None], fr.shape)[fr >= 0]  # [N]
    cell = b_idx * n_frames + fr[fr >= 0]  # [N] flat (example, frame)
    sums = np.bincount(cell, weights=ce[fr >= 0], minlength=B * n_frames).reshape(B, n_frames)  # [B, F]
    counts = np.bincount(cell, minlength=B * n_frames).reshape(B, n_frames).astype(np.int64)  # [B, F]
    return sums, counts


class CEAccumulator:
    """Sums TargetCE parts over eval batches (per-example parts are concatenated in batch order)."""

    def __init__(self, n_codebooks: int) -> None:
        self.sum_k = np.zeros(n_codebooks, dtype=np.float64)
        self.n_k = np.zeros(n_codebooks, dtype=np.int64)
        self.sum_b: list[np.ndarray] = []
        self.n_b: list[np.ndarray] = []
        self.sum_bf: list[np.ndarray] = []
        self.n_bf: list[np.ndarray] = []

    def add(
        self,
        sum_k: torch.Tensor | np.ndarray,
        n_k: torch.Tensor | np.ndarray,
        sum_b: torch.Tensor | np.ndarray,
        n_b: torch.Tensor | np.ndarray,
        frame_sums: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """sum_k/n_k [K], sum_b/n_b [B] (tensors or arrays); frame_sums from `per_frame_sums`, every batch or none."""
        self.sum_k += _np(sum_k, np.float64)
        self.n_k += _np(n_k, np.int64)
        self.sum_b.append(_np(sum_b, np.float64))
        self.n_b.append(_np(n_b, np.int64))
        if frame_sums is not None:
            self.sum_bf.append(np.asarray(frame_sums[0], np.float64))
            self.n_bf.append(np.asarray(frame_sums[1], np.int64))

    def result(self, n_frames: int = 0) -> TargetCE:
        """The sums so far (per-frame arrays [B, n_frames] when frame sums were added or n_frames > 0)."""
        sum_b = np.concatenate(self.sum_b) if self.sum_b else np.zeros(0, np.float64)
        n_b = np.concatenate(self.n_b) if self.n_b else np.zeros(0, np.int64)
        if self.sum_bf:
            sum_bf, n_bf = np.concatenate(self.sum_bf), np.concatenate(self.n_bf)  # [B, F]
        elif n_frames > 0:
            sum_bf, n_bf = np.zeros((0, n_frames), np.float64), np.zeros((0, n_frames), np.int64)
        else:
            sum_bf = n_bf = None
        return TargetCE(self.sum_k.copy(), self.n_k.copy(), sum_b, n_b, sum_bf, n_bf)


def gather_target_ce(
    part: TargetCE, clip_ids: np.ndarray, n_clips: int, all_gather: Callable[[Any], list[Any]]
) -> TargetCE:
    """Every rank's TargetCE over its clips (part.sum_per_example[j]: clip clip_ids[j]) -> the eval set's, per-example
    parts in clip order; every clip of 0..n_clips-1 scored by exactly one rank. all_gather: RankInfo's."""
    parts = all_gather((np.asarray(clip_ids, dtype=np.int64), part))
    ids = np.concatenate([p[0] for p in parts])  # [N]
    if not np.array_equal(np.sort(ids), np.arange(n_clips)):
        raise RuntimeError(
            f"eval gather: ranks scored clips {np.sort(ids).tolist()}, expected each of 0..{n_clips - 1} exactly once"
        )
    sum_b, n_b = np.zeros(n_clips, np.float64), np.zeros(n_clips, np.int64)
    sum_b[ids] = np.concatenate([p[1].sum_per_example for p in parts])
    n_b[ids] = np.concatenate([p[1].count_per_example for p in parts])
    sum_bf = n_bf = None
    if part.sum_per_frame is not None:
        F = part.sum_per_frame.shape[1]
        sum_bf, n_bf = np.zeros((n_clips, F), np.float64), np.zeros((n_clips, F), np.int64)  # [N, F]
        sum_bf[ids] = np.concatenate([p[1].sum_per_frame for p in parts])
        n_bf[ids] = np.concatenate([p[1].count_per_frame for p in parts])
    return TargetCE(
        np.sum([p[1].sum_per_codebook for p in parts], axis=0),
        np.sum([p[1].count_per_codebook for p in parts], axis=0).astype(np.int64),
        sum_b,
        n_b,
        sum_bf,
        n_bf,
    )


def _np(x: torch.Tensor | np.ndarray, dtype: type) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().to(torch.float64 if dtype is np.float64 else torch.int64).numpy()  # cast after the copy
    return np.asarray(x, dtype=dtype)


def unigram_ce(labels: torch.Tensor, vocab: AudioVocab, log_probs: np.ndarray) -> TargetCE:
    """Unigram CE (log_probs [K, C]) on exactly the code targets of labels [B, S, J] (`Batch.labels`); AUDIO_END
    targets are not codes and are left out, as in the model's per-codebook CE."""
    K, C = vocab.n_codebooks, vocab.codebook_size
    lab = labels.detach().cpu().long()  # [B, S, J]
    B = lab.shape[0]
    is_code = (lab >= vocab.audio_offset) & (lab < vocab.audio_offset + K * C)  # [B, S, J]
    b_idx = torch.arange(B)[:, None, None].expand_as(lab)[is_code].numpy()  # [N]
    rel = (lab[is_code] - vocab.audio_offset).numpy()  # [N] = k*C + c
    k_idx, c_idx = rel // C, rel % C  # [N], [N]
    nll = -log_probs[k_idx, c_idx]  # [N]
    return TargetCE(
        sum_per_codebook=np.bincount(k_idx, weights=nll, minlength=K),
        count_per_codebook=np.bincount(k_idx, minlength=K).astype(np.int64),
        sum_per_example=np.bincount(b_idx, weights=nll, minlength=B),
        count_per_example=np.bincount(b_idx, minlength=B).astype(np.int64),
    )


def average_runs(runs: list[TargetCE]) -> TargetCE:
    """Average several scorings of the SAME targets (e.g. one per caption derangement): sums averaged, counts kept."""
    first = runs[0]
    for r in runs[1:]:
        if not (
            np.array_equal(r.count_per_example, first.count_per_example)
            and np.array_equal(r.count_per_codebook, first.count_per_codebook)
        ):
            raise RuntimeError("average_runs: the runs scored different targets; they must share the eval crop")
    frames = first.sum_per_frame is not None
    if frames and not all(np.array_equal(r.count_per_frame, first.count_per_frame) for r in runs[1:]):
        raise RuntimeError("average_runs: the runs scored different frames; they must share the eval crop")
    return TargetCE(
        np.mean([r.sum_per_codebook for r in runs], axis=0),
        first.count_per_codebook.copy(),
        np.mean([r.sum_per_example for r in runs], axis=0),
        first.count_per_example.copy(),
        np.mean([r.sum_per_frame for r in runs], axis=0) if frames else None,
        first.count_per_frame.copy() if frames else None,
    )
