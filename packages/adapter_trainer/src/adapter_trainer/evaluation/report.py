"""The learning-check report (`EvalReport`): CE vs the unigram baseline, the caption gain with its bootstrap interval,
by window position (`FRAME_BINS`) and per shard set. CE in nats per code target."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from adapter_trainer.evaluation.stats import bootstrap_mean_ci, bootstrap_ratio_ci, caption_gain_verdict, safe_div
from adapter_trainer.evaluation.target_ce import TargetCE

# The caption gain by position: frames [lo, hi) of the eval window (hi None = its end); the first frames are where
# the caption is all the model has.
FRAME_BINS: tuple[tuple[str, int, int | None], ...] = (
    ("frames_0_10", 0, 10),
    ("frames_10_50", 10, 50),
    ("frames_50_end", 50, None),
)


def caption_gain_by_position(
    model_true: TargetCE, model_shuf: TargetCE, n_bootstrap: int, seed: int
) -> tuple[dict[str, dict[str, Any]], list[float]]:
    """({FRAME_BINS key: {"gain", "ci95", "n_codes"}}, [F] gain per frame (nan: no code)): code-weighted, so the bins
    weighted by n_codes add up to the code-weighted whole-window gain."""
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
    # what training saw (None outside a run); set by the recipe
    n_train_clips: int | None = None  # clips of the train split
    n_train_captions: int | None = None  # distinct conditioning texts (data.text) among them
    train_sequences: int | None = None  # training sequences (examples, all ranks) up to this report's step
    train_end_targets: int | None = None  # those with an AUDIO_END target in their loss mask
    caption_gain_by_position: dict = field(default_factory=dict)  # caption_gain_by_position()[0]
    caption_gain_by_frame: list = field(default_factory=list)  # [F] gain per window frame (nan: no code scored)
    caption_gain_by_position_total: float = float("nan")  # code-weighted whole-window gain (what the bins add to)
    # the frozen music LM alone on the same targets (NaN / empty when not scored); gain = its CE minus the adapter's
    music_lm_ce: float = float("nan")
    music_lm_ce_per_codebook: list = field(default_factory=list)
    gain_over_music_lm: float = float("nan")
    gain_over_music_lm_lo: float = float("nan")
    gain_over_music_lm_hi: float = float("nan")
    gain_over_music_lm_shuffled: float = float("nan")  # music_lm_ce - ce_shuffled (code-weighted)
    gain_over_music_lm_by_position: dict = field(default_factory=dict)
    # the teacher (MusicGen with its own text encoder) with true and deranged captions; NaN when not scored
    # (teacher_status says why); gain_over_teacher = its CE - the adapter's
    music_lm_text_ce: float = float("nan")
    music_lm_text_ce_shuffled: float = float("nan")
    teacher_caption_gain: float = float("nan")
    teacher_caption_gain_lo: float = float("nan")
    teacher_caption_gain_hi: float = float("nan")
    gain_over_teacher: float = float("nan")
    gain_over_teacher_lo: float = float("nan")
    gain_over_teacher_hi: float = float("nan")
    teacher_status: str = ""
    extra: dict = field(default_factory=dict)
    per_shard_set: dict = field(default_factory=dict)  # per entry of data.shards: `per_set_figures`

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
        if self.music_lm_ce_per_codebook:
            out[f"{prefix}music_lm_ce"] = self.music_lm_ce
            out[f"{prefix}gain_over_music_lm"] = self.gain_over_music_lm
            out[f"{prefix}gain_over_music_lm_lo"] = self.gain_over_music_lm_lo
            out[f"{prefix}gain_over_music_lm_hi"] = self.gain_over_music_lm_hi
            out[f"{prefix}gain_over_music_lm_shuffled"] = self.gain_over_music_lm_shuffled
        if math.isfinite(self.music_lm_text_ce):
            out[f"{prefix}music_lm_text_ce"] = self.music_lm_text_ce
            out[f"{prefix}music_lm_text_ce_shuffled"] = self.music_lm_text_ce_shuffled
            out[f"{prefix}teacher_caption_gain"] = self.teacher_caption_gain
            out[f"{prefix}gain_over_teacher"] = self.gain_over_teacher
            out[f"{prefix}gain_over_teacher_lo"] = self.gain_over_teacher_lo
            out[f"{prefix}gain_over_teacher_hi"] = self.gain_over_teacher_hi
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
    music_lm: TargetCE | None = None,
    teacher: tuple[TargetCE, TargetCE] | None = None,
) -> EvalReport:
    """Combine per-target sums into the report; raises if the runs did not score the same targets. music_lm, teacher
    (true, deranged): the baselines on the same targets, or None (not scored)."""
    others = [("shuffled-caption", model_shuf), ("unigram", unigram)]
    others += [("music LM", music_lm)] if music_lm is not None else []
    others += [("teacher", teacher[0]), ("shuffled teacher", teacher[1])] if teacher is not None else []
    for name, other in others:
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
    report = EvalReport(
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
    if music_lm is not None:
        _add_music_lm(report, model_true, music_lm, per_clip_true, n_bootstrap, seed)
    if teacher is not None:
        _add_teacher(report, *teacher, per_clip_true, n_bootstrap, seed)
    return report


def _add_teacher(
    r: EvalReport, true: TargetCE, shuf: TargetCE, per_clip_adapter: np.ndarray, n_bootstrap: int, seed: int
) -> None:
    """The teacher's CE with true and deranged captions, its caption gain and the adapter's gain over it."""
    r.music_lm_text_ce = safe_div(float(true.sum_per_codebook.sum()), r.n_code_targets)
    r.music_lm_text_ce_shuffled = safe_div(float(shuf.sum_per_codebook.sum()), r.n_code_targets)
    per_clip_true = true.sum_per_example / true.count_per_example  # [N]
    per_clip_shuf = shuf.sum_per_example / shuf.count_per_example  # [N]
    r.teacher_caption_gain, r.teacher_caption_gain_lo, r.teacher_caption_gain_hi = bootstrap_mean_ci(
        per_clip_shuf - per_clip_true, n_bootstrap, seed
    )
    r.gain_over_teacher, r.gain_over_teacher_lo, r.gain_over_teacher_hi = bootstrap_mean_ci(
        per_clip_true - per_clip_adapter, n_bootstrap, seed
    )


def _add_music_lm(
    r: EvalReport, true: TargetCE, music_lm: TargetCE, per_clip_true: np.ndarray, n_bootstrap: int, seed: int
) -> None:
    """The music LM's figures and the adapter's gain over it (same targets as `true`, checked by make_report)."""
    K = len(music_lm.sum_per_codebook)
    r.music_lm_ce = safe_div(float(music_lm.sum_per_codebook.sum()), r.n_code_targets)
    r.music_lm_ce_per_codebook = [
        safe_div(music_lm.sum_per_codebook[k], music_lm.count_per_codebook[k]) for k in range(K)
    ]
    per_clip_music = music_lm.sum_per_example / music_lm.count_per_example  # [N]
    r.gain_over_music_lm, r.gain_over_music_lm_lo, r.gain_over_music_lm_hi = bootstrap_mean_ci(
        per_clip_music - per_clip_true, n_bootstrap, seed
    )
    r.gain_over_music_lm_shuffled = r.music_lm_ce - r.ce_shuffled
    if music_lm.sum_per_frame is not None and true.sum_per_frame is not None:
        r.gain_over_music_lm_by_position = caption_gain_by_position(true, music_lm, n_bootstrap, seed)[0]


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
    """{set name: figures} over the clip rows [start, stop) of each set (`spans`); a set without eval clips reports
    n_clips 0 and NaN figures."""
    return {name: _set_figures(true, shuf, uni, slice(start, stop)) for name, start, stop in spans}
