"""Evaluation math: unigram baseline on the exact scored targets, caption derangement, bootstrap interval,
and the report the recipe prints as its "learning check". No model code here; the recipe runs the model.

Units: cross-entropies are in nats per code target; perplexity = exp(CE).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from adapter_trainer.data.token_layout import AudioVocab
from adapter_trainer.errors import UserError

MIN_GAIN_CLIPS = 30  # fewer eval clips: the caption-gain bootstrap interval is not trusted, the verdict is INSUFFICIENT


TARGET_REL_PCT = 10.0  # the learning check's target: eval CE at least this % under the unigram baseline

# The caption gain by position: frames [lo, hi) of the eval window (hi None = to the window's end). 10 frames =
# 0.2 s at 50 frames/s: the window's first frames, where the caption is all the model has (no audio yet).
FRAME_BINS: tuple[tuple[str, int, int | None], ...] = (
    ("frames_0_10", 0, 10),
    ("frames_10_50", 10, 50),
    ("frames_50_end", 50, None),
)


class EvalOverlapError(UserError, ValueError):
    """Eval clips are also train clips, so the eval would not be held-out; the message names the fix."""


def check_held_out(train_keys: Iterable[str], eval_keys: Iterable[str], *, allow_overlap: bool, where: str) -> int:
    """Refuse eval clips whose keys are also train keys (unless `allow_overlap`). Returns the overlap count.

    Args:
        where: the shard sets / splits, for the message (e.g. "data.train_split='train' / data.eval_split='train'").
    Raises:
        EvalOverlapError: the splits overlap and `allow_overlap` is False.
    """
    eval_set = set(eval_keys)
    overlap = sorted(set(train_keys) & eval_set)
    eval_n = len(eval_set)
    if overlap and not allow_overlap:
        raise EvalOverlapError(
            f"train/eval overlap: {len(overlap)} of {eval_n} eval clips are also train clips ({where}; first keys: "
            f"{overlap[:5]}), so the eval would not be held-out. Fix: point data.eval_split (or the eval shard set) "
            f"at clips disjoint from training, or pass data.allow_eval_overlap=true to run anyway (the report then "
            f"says the check is NOT held-out)"
        )
    return len(overlap)


def caption_gain_verdict(n_clips: int, lo: float) -> str:
    """PASS when the bootstrap interval's lower end is above 0 over >= MIN_GAIN_CLIPS clips; FAIL when it is not;
    INSUFFICIENT with fewer clips (a percentile bootstrap over a handful of clips is too narrow to trust)."""
    if n_clips < MIN_GAIN_CLIPS:
        return "INSUFFICIENT"
    return "PASS" if lo > 0.0 else "FAIL"


def unigram_log_probs(codes: Iterable[np.ndarray], n_codebooks: int, codebook_size: int) -> np.ndarray:
    """Per-codebook unigram log-probabilities with add-one smoothing, from train-split codes.

    Args:
        codes: arrays [T, K] of raw codes (the train split).
    Returns:
        [K, C] float64 natural-log probabilities; each row sums to 1 in probability space.
    """
    counts = np.ones((n_codebooks, codebook_size), dtype=np.float64)  # add-one: no code gets probability 0
    for c in codes:  # c: [T, K]
        for k in range(n_codebooks):
            counts[k] += np.bincount(c[:, k].astype(np.int64), minlength=codebook_size)
    return np.log(counts / counts.sum(axis=1, keepdims=True))  # [K, C]


@dataclass
class TargetCE:
    """Summed CE over code targets, split per codebook and per example (same fields as LossOutput's), and
    optionally per example and audio frame of the eval window (token_layout.target_frames: frame t = its K codes)."""

    sum_per_codebook: np.ndarray  # [K] float64
    count_per_codebook: np.ndarray  # [K] int64
    sum_per_example: np.ndarray  # [B] float64
    count_per_example: np.ndarray  # [B] int64
    sum_per_frame: np.ndarray | None = None  # [B, F] float64, F = frames of the eval window
    count_per_frame: np.ndarray | None = None  # [B, F] int64


def per_frame_sums(ce_per_target: torch.Tensor, frames: torch.Tensor, n_frames: int) -> tuple[np.ndarray, np.ndarray]:
    """CE summed per example and window frame.

    Args:
        ce_per_target: [B, S, J] CE of each label cell (LossOutput.ce_per_target).
        frames: [B, S, J] the frame of each cell's code target, -1 where none (token_layout.target_frames).
        n_frames: F, frames of the eval window; targets of frames >= F are refused (the window is fixed).
    Returns:
        sums [B, F] float64, counts [B, F] int64.
    """
    ce = ce_per_target.detach().to("cpu", torch.float64).numpy()  # [B, S, J]
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
        """sum_k/n_k: [K]; sum_b/n_b: [B] (tensors on any device, or arrays); frame_sums: ([B, F], [B, F]) from
        `per_frame_sums`, given for every batch or for none."""
        self.sum_k += _np(sum_k, np.float64)
        self.n_k += _np(n_k, np.int64)
        self.sum_b.append(_np(sum_b, np.float64))
        self.n_b.append(_np(n_b, np.int64))
        if frame_sums is not None:
            self.sum_bf.append(np.asarray(frame_sums[0], np.float64))
            self.n_bf.append(np.asarray(frame_sums[1], np.int64))

    def result(self, n_frames: int = 0) -> TargetCE:
        """The sums so far (a rank with no eval clips has empty per-example arrays; per-frame arrays [B, n_frames]
        when frame sums were added, or when none were and n_frames > 0)."""
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
    """Every rank's TargetCE over its eval clips -> the whole eval set's, per-example parts in clip order.

    Args:
        part: this rank's sums; part.sum_per_example[j] belongs to clip clip_ids[j].
        clip_ids: [b] this rank's clip ids.
        n_clips: size of the eval set; every clip must be scored by exactly one rank.
        all_gather: RankInfo.all_gather_object (returns [obj] for one process).
    The result equals one process's up to float summation order, so the bootstrap over clips is the same.
    """
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
        x = x.detach().to("cpu", torch.float64 if dtype is np.float64 else torch.int64).numpy()
    return np.asarray(x, dtype=dtype)


def unigram_ce(labels: torch.Tensor, vocab: AudioVocab, log_probs: np.ndarray) -> TargetCE:
    """Unigram CE on EXACTLY the code targets the model is scored on.

    Args:
        labels: [B, S, J] combined-vocab target ids (IGNORE_INDEX where not scored), as in `Batch.labels`.
        log_probs: [K, C] from `unigram_log_probs`.
    Code targets are labels in [V, V + K*C); AUDIO_END targets are not codes and are left out, as in the model's
    per-codebook CE.
    """
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


def derangement(n: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random permutation p of range(n) with p[i] != i for all i (rejection sampling; ~e tries)."""
    if n < 2:
        raise ValueError(f"a derangement needs at least 2 items, got {n}; the caption-gain check needs >= 2 eval clips")
    while True:
        p = rng.permutation(n)
        if not np.any(p == np.arange(n)):
            return p


def bootstrap_mean_ci(
    values: np.ndarray, n_resamples: int, seed: int, level: float = 0.95
) -> tuple[float, float, float]:
    """Mean of `values` and a percentile-bootstrap interval over them (resampling the items with replacement)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("bootstrap over an empty set of values")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, v.size, size=(n_resamples, v.size))  # [R, N]
    means = v[idx].mean(axis=1)  # [R]
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [a, 1.0 - a])
    return float(v.mean()), float(lo), float(hi)


def bootstrap_ratio_ci(
    num: np.ndarray, den: np.ndarray, n_resamples: int, seed: int, level: float = 0.95
) -> tuple[float, float, float]:
    """sum(num) / sum(den) and a percentile-bootstrap interval resampling the items (clips) with replacement.

    The caption gain of a frame range: num = per-clip summed CE difference over the range's codes, den = their count,
    so the point is the code-weighted mean gain (= the mean of per-clip means when every clip has the same count).
    nan (and a nan interval) when den sums to 0: no code of the range was scored.
    """
    n, d = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    if n.size == 0:
        raise ValueError("bootstrap over an empty set of values")
    if d.sum() <= 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n.size, size=(n_resamples, n.size))  # [R, N]
    dens = d[idx].sum(axis=1)  # [R]
    ratios = n[idx].sum(axis=1) / np.where(dens > 0, dens, np.nan)  # [R]; a resample without codes is left out
    a = (1.0 - level) / 2.0
    lo, hi = np.nanquantile(ratios, [a, 1.0 - a])
    return float(n.sum() / d.sum()), float(lo), float(hi)


def caption_gain_by_position(
    model_true: TargetCE, model_shuf: TargetCE, n_bootstrap: int, seed: int
) -> tuple[dict[str, dict[str, Any]], list[float]]:
    """The caption gain per frame range of the eval window (FRAME_BINS) with bootstrap intervals over clips, and
    the gain curve by frame.

    Each range's gain is sum over clips of (CE deranged - CE true) over the range's codes / their count, so the
    ranges weighted by their code counts add up to the code-weighted whole-window gain (equal to the headline
    `caption_gain`, a mean of per-clip means, whenever every clip fills the window, as in the demo).
    Returns:
        ({key: {"gain", "ci95": [lo, hi], "n_codes"}}, [F] gain per frame (nan where no code was scored)).
    """
    diff = model_shuf.sum_per_frame - model_true.sum_per_frame  # [N, F] summed CE difference per clip and frame
    counts = model_true.count_per_frame  # [N, F]
    F = diff.shape[1]
    out: dict[str, dict[str, Any]] = {}
    for key, lo_f, hi_f in FRAME_BINS:
        sl = slice(min(lo_f, F), F if hi_f is None else min(hi_f, F))
        num, den = diff[:, sl].sum(axis=1), counts[:, sl].sum(axis=1)  # [N], [N]
        gain, lo, hi = bootstrap_ratio_ci(num, den, n_bootstrap, seed)
        out[key] = {"gain": gain, "ci95": [lo, hi], "n_codes": int(den.sum())}
    tot = counts.sum(axis=0)  # [F]
    curve = [float(diff[:, t].sum() / tot[t]) if tot[t] else float("nan") for t in range(F)]
    return out, curve


@dataclass
class EvalReport:
    """One evaluation of the eval split (all CE in nats per code target)."""

    step: int
    n_clips: int
    n_code_targets: int
    ce: float  # model CE over all code targets (token-weighted)
    ce_per_codebook: list[float]
    ppl_per_codebook: list[float]
    end_ce: float  # CE on AUDIO_END targets (nan if none)
    unigram_ce: float  # add-one unigram baseline on the same targets
    unigram_ce_per_codebook: list[float]
    rel_to_unigram_pct: float  # (unigram - model) / unigram * 100; > 0 = better than unigram
    ce_shuffled: float  # model CE with deranged captions, same targets
    caption_gain: float  # mean over clips of (CE_shuffled - CE_true), per-clip token means
    caption_gain_lo: float  # bootstrap interval over clips
    caption_gain_hi: float
    caption_gain_verdict: str = "INSUFFICIENT"  # PASS | FAIL | INSUFFICIENT (< MIN_GAIN_CLIPS clips)
    held_out: bool = True  # False when data.allow_eval_overlap let eval clips that are also train clips through
    n_overlap_clips: int = 0  # eval clips whose keys are also train keys
    # what training saw (None: not known, e.g. a report built outside a run); set by the recipe
    n_train_clips: int | None = None  # clips of the train split
    n_train_captions: int | None = None  # distinct conditioning texts (data.text) among them
    train_windows: int | None = None  # training windows (examples, all ranks) up to this report's step
    train_end_targets: int | None = None  # those with an AUDIO_END target in their loss mask
    train_counted_from_step: int = 0  # > 0: the counts start at this step (resumed from a checkpoint without them)
    # FRAME_BINS key -> {"gain", "ci95": [lo, hi], "n_codes"}: the caption gain over those frames of the window
    caption_gain_by_position: dict = field(default_factory=dict)
    caption_gain_by_frame: list = field(default_factory=list)  # [F] gain per window frame (nan: no code scored)
    # what the bins add back to (weighted by n_codes): the code-weighted gain over the window; caption_gain is a mean
    # of per-clip means, equal to it only when every clip has the same code count
    caption_gain_by_position_total: float = float("nan")
    extra: dict = field(default_factory=dict)
    # per entry of data.shards (its path as written): ce, n_clips, n_code_targets, unigram_ce, rel_to_unigram_pct,
    # ce_shuffled, caption_gain; from the same per-clip sums as the overall figures (`per_set_figures`)
    per_shard_set: dict = field(default_factory=dict)

    def scalars(self, prefix: str = "eval/") -> dict[str, float]:
        """Flat dict for MetricLogger.log_dict."""
        out = {
            f"{prefix}ce": self.ce,
            f"{prefix}end_ce": self.end_ce,
            f"{prefix}unigram_ce": self.unigram_ce,
            f"{prefix}rel_to_unigram_pct": self.rel_to_unigram_pct,
            f"{prefix}ce_shuffled": self.ce_shuffled,
            f"{prefix}caption_gain": self.caption_gain,
            f"{prefix}caption_gain_lo": self.caption_gain_lo,
            f"{prefix}caption_gain_hi": self.caption_gain_hi,
        }
        for key, g in self.caption_gain_by_position.items():
            out[f"{prefix}caption_gain_{key}"] = g["gain"]
            out[f"{prefix}caption_gain_{key}_lo"], out[f"{prefix}caption_gain_{key}_hi"] = g["ci95"]
        for k, (ce, ppl, uni) in enumerate(
            zip(self.ce_per_codebook, self.ppl_per_codebook, self.unigram_ce_per_codebook)
        ):
            out[f"{prefix}ce_cb{k}"] = ce
            out[f"{prefix}ppl_cb{k}"] = ppl
            out[f"{prefix}unigram_ce_cb{k}"] = uni
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def safe_div(a: float, b: float) -> float:
    return a / b if b else float("nan")


def make_report(
    *,
    step: int,
    model_true: TargetCE,
    model_shuf: TargetCE,
    unigram: TargetCE,
    end_ce_sum: float,
    end_count: int,
    n_bootstrap: int,
    seed: int,
    n_overlap_clips: int = 0,
) -> EvalReport:
    """Combine per-target sums into the report. Raises if the three runs did not score the same targets."""
    for name, other in (("shuffled-caption", model_shuf), ("unigram", unigram)):
        if not (
            np.array_equal(model_true.count_per_codebook, other.count_per_codebook)
            and np.array_equal(model_true.count_per_example, other.count_per_example)
        ):
            raise RuntimeError(
                f"the {name} run scored different targets than the true-caption run "
                f"({other.count_per_example.tolist()} vs {model_true.count_per_example.tolist()}); "
                f"eval codes must be trimmed so every caption fits"
            )
    K = len(model_true.sum_per_codebook)
    ce_k = [safe_div(model_true.sum_per_codebook[k], model_true.count_per_codebook[k]) for k in range(K)]
    uni_k = [safe_div(unigram.sum_per_codebook[k], unigram.count_per_codebook[k]) for k in range(K)]
    n_targets = int(model_true.count_per_codebook.sum())
    ce = safe_div(float(model_true.sum_per_codebook.sum()), n_targets)
    uni = safe_div(float(unigram.sum_per_codebook.sum()), n_targets)
    per_clip_true = model_true.sum_per_example / model_true.count_per_example  # [N] mean CE per clip
    per_clip_shuf = model_shuf.sum_per_example / model_shuf.count_per_example  # [N]
    gain, lo, hi = bootstrap_mean_ci(per_clip_shuf - per_clip_true, n_bootstrap, seed)
    by_position, by_frame = (
        caption_gain_by_position(model_true, model_shuf, n_bootstrap, seed)
        if model_true.sum_per_frame is not None and model_shuf.sum_per_frame is not None
        else ({}, [])
    )
    return EvalReport(
        step=step,
        n_clips=len(per_clip_true),
        n_code_targets=n_targets,
        ce=ce,
        ce_per_codebook=ce_k,
        ppl_per_codebook=[math.exp(x) if math.isfinite(x) else float("nan") for x in ce_k],
        end_ce=safe_div(end_ce_sum, end_count),
        unigram_ce=uni,
        unigram_ce_per_codebook=uni_k,
        rel_to_unigram_pct=100.0 * (uni - ce) / uni,
        ce_shuffled=safe_div(float(model_shuf.sum_per_codebook.sum()), n_targets),
        caption_gain=gain,
        caption_gain_lo=lo,
        caption_gain_hi=hi,
        caption_gain_verdict=caption_gain_verdict(len(per_clip_true), lo),
        held_out=n_overlap_clips == 0,
        n_overlap_clips=n_overlap_clips,
        caption_gain_by_position=by_position,
        caption_gain_by_frame=by_frame,
        caption_gain_by_position_total=safe_div(
            sum(g["gain"] * g["n_codes"] for g in by_position.values() if g["n_codes"]),
            sum(g["n_codes"] for g in by_position.values()),
        )
        if by_position
        else float("nan"),
    )


def _set_figures(true: TargetCE, shuf: TargetCE, uni: TargetCE, rows: slice) -> dict[str, Any]:
    """The figures of one shard set's eval clips (rows of the per-clip arrays)."""
    n = int(true.count_per_example[rows].sum())
    ce = safe_div(float(true.sum_per_example[rows].sum()), n)
    uni_ce = safe_div(float(uni.sum_per_example[rows].sum()), n)
    counts = true.count_per_example[rows]
    gain = shuf.sum_per_example[rows] / counts - true.sum_per_example[rows] / counts  # [n_clips] per-clip means
    return {
        "ce": ce,
        "n_clips": int(counts.shape[0]),
        "n_code_targets": n,
        "unigram_ce": uni_ce,
        "rel_to_unigram_pct": 100.0 * (uni_ce - ce) / uni_ce if n else float("nan"),
        "ce_shuffled": safe_div(float(shuf.sum_per_example[rows].sum()), n),
        "caption_gain": float(gain.mean()) if gain.size else float("nan"),
    }


def per_set_figures(
    true: TargetCE, shuf: TargetCE, uni: TargetCE, spans: list[tuple[str, int, int]]
) -> dict[str, dict[str, Any]]:
    """{set name: figures} over the clip rows [start, stop) of each set (`spans`: (name, start, stop) in clip
    order). A set with no eval clips (e.g. cut off by data.eval_max_clips) reports n_clips 0 and NaN figures."""
    return {name: _set_figures(true, shuf, uni, slice(start, stop)) for name, start, stop in spans}


def learning_check_summary(r: EvalReport, *, target_rel_pct: float = TARGET_REL_PCT) -> dict[str, Any]:
    """The `learning_check` block of final_metrics.json: the headline figures and their verdicts."""
    return {
        "eval_ce": r.ce,
        "unigram_ce": r.unigram_ce,
        "rel_to_unigram_pct": r.rel_to_unigram_pct,
        "target_rel_pct": target_rel_pct,
        "rel_pass": r.rel_to_unigram_pct >= target_rel_pct,
        "caption_gain": r.caption_gain,
        "caption_gain_ci95": [r.caption_gain_lo, r.caption_gain_hi],
        "caption_gain_pass": r.caption_gain_verdict == "PASS",
        "caption_gain_verdict": r.caption_gain_verdict,
        # the same gain over the window's first 10 frames, frames 10-49 and the rest (FRAME_BINS)
        "caption_gain_by_position": {
            k: {"gain": g["gain"], "ci95": list(g["ci95"]), "n_codes": g["n_codes"]}
            for k, g in r.caption_gain_by_position.items()
        },
        # the bins add back (weighted by n_codes) to this code-weighted gain, not to caption_gain (per-clip means)
        "caption_gain_by_position_total": r.caption_gain_by_position_total,
        "held_out": r.held_out,
        "eval_overlap_clips": r.n_overlap_clips,
        "per_shard_set": r.per_shard_set,
        # what training saw: train clips and their distinct captions (data.text), training windows and those with
        # an AUDIO_END target (from step train_counted_from_step on; 0 = the whole run); null outside a run
        "n_train_clips": r.n_train_clips,
        "n_train_captions": r.n_train_captions,
        "train_windows": r.train_windows,
        "train_end_targets": r.train_end_targets,
        "train_counted_from_step": r.train_counted_from_step,
    }


def _per_set_lines(per_set: dict[str, dict[str, Any]]) -> list[str]:
    """One line per shard set when there are several (one set's figures are the overall ones)."""
    if len(per_set) < 2:
        return []
    return [
        f"  set {name}: CE {f['ce']:.4f} (unigram {f['unigram_ce']:.4f}, {f['rel_to_unigram_pct']:+.1f}%), "
        f"caption gain {f['caption_gain']:+.4f}, {f['n_clips']} clips"
        if f["n_clips"]
        else f"  set {name}: no eval clips (it adds train clips only)"
        for name, f in per_set.items()
    ]


def _trained_on(r: EvalReport) -> str:
    """The header's "; trained on N clips with M distinct captions" (empty outside a run)."""
    if r.n_train_clips is None or r.n_train_captions is None:
        return ""
    return f"; trained on {r.n_train_clips} clips with {r.n_train_captions} distinct captions"


def _end_seen(r: EvalReport) -> str:
    """The END CE line's note on how often training saw AUDIO_END as a target (empty outside a run)."""
    if r.train_windows is None or r.train_end_targets is None:
        return ""
    if r.train_counted_from_step:
        s = r.train_counted_from_step
        return (
            f"  (AUDIO_END was a training target in {r.train_end_targets} of {r.train_windows} windows since step "
            f"{s}; the checkpoint this run resumed at step {s} did not count its earlier windows)"
        )
    if r.train_windows == 0:
        return "  (no training window yet)"
    return f"  (AUDIO_END was a training target in {r.train_end_targets} of {r.train_windows} windows)"


def learning_check_text(r: EvalReport, *, target_rel_pct: float = TARGET_REL_PCT) -> str:
    """The human-readable block printed at the end of training (honest: the figures decide PASS/FAIL)."""
    rel_ok = r.rel_to_unigram_pct >= target_rel_pct
    split = (
        "held-out split"
        if r.held_out
        else f"NOT held-out: {r.n_overlap_clips} eval clips are also train clips (data.allow_eval_overlap=true)"
    )
    gain_rule = (
        "interval above 0"
        if r.caption_gain_verdict != "INSUFFICIENT"
        else f"needs >= {MIN_GAIN_CLIPS} eval clips, got {r.n_clips}"
    )
    lines = [
        "=" * 72,
        f"LEARNING CHECK ({split}, step {r.step}, {r.n_clips} clips, {r.n_code_targets} code targets{_trained_on(r)})",
        f"  audio CE      {r.ce:.4f} nats/code   unigram baseline {r.unigram_ce:.4f}   "
        f"-> {r.rel_to_unigram_pct:+.1f}% vs unigram  [{'PASS' if rel_ok else 'FAIL'}: target >= {target_rel_pct:.0f}% under]",
        "  per codebook  "
        + "  ".join(
            f"k{k}: {c:.3f} (uni {u:.3f}, ppl {p:.1f})"
            for k, (c, u, p) in enumerate(zip(r.ce_per_codebook, r.unigram_ce_per_codebook, r.ppl_per_codebook))
        ),
        f"  END CE        {r.end_ce:.4f}"
        + ("  (no AUDIO_END target was scored: no eval clip)" if not math.isfinite(r.end_ce) else "")
        + _end_seen(r),
        f"  caption gain  {r.caption_gain:+.4f} nats/code  95% CI [{r.caption_gain_lo:+.4f}, {r.caption_gain_hi:+.4f}]"
        f"  (CE shuffled captions {r.ce_shuffled:.4f})  [{r.caption_gain_verdict}: {gain_rule}]",
        *(
            [
                "  by position   "
                + "   ".join(
                    f"{_bin_label(k)} {g['gain']:+.4f} [{g['ci95'][0]:+.4f}, {g['ci95'][1]:+.4f}]"
                    for k, g in r.caption_gain_by_position.items()
                )
                + f"   (code-weighted total {r.caption_gain_by_position_total:+.4f})"
            ]
            if r.caption_gain_by_position
            else []
        ),
        *_per_set_lines(r.per_shard_set),
        "=" * 72,
    ]
    return "\n".join(lines)


def _bin_label(key: str) -> str:
    """ "frames_0_10" -> "frames 0-10" (the printed block)."""
    _, lo, hi = key.split("_")
    return f"frames {lo}-{hi}"
