"""The learning check's verdicts on an `EvalReport`: its target (`TARGET_REL_PCT`), the `learning_check` block of
final_metrics.json and the block the recipe prints at the end of training.
"""

from __future__ import annotations

import math
from typing import Any

from adapter_trainer.evaluation.report import EvalReport
from adapter_trainer.evaluation.stats import MIN_GAIN_CLIPS

TARGET_REL_PCT = 10.0  # the learning check's target: eval CE at least this % under the unigram baseline


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
        "caption_gain_by_position": {
            k: {"gain": g["gain"], "ci95": list(g["ci95"]), "n_codes": g["n_codes"]}
            for k, g in r.caption_gain_by_position.items()
        },
        "caption_gain_by_position_total": r.caption_gain_by_position_total,
        # the frozen music LM alone; gain = its CE - the adapter's; null when not scored
        "music_lm_ce": r.music_lm_ce if r.music_lm_ce_per_codebook else None,
        "music_lm_ce_per_codebook": r.music_lm_ce_per_codebook or None,
        "gain_over_music_lm": r.gain_over_music_lm if r.music_lm_ce_per_codebook else None,
        "gain_over_music_lm_ci95": [r.gain_over_music_lm_lo, r.gain_over_music_lm_hi]
        if r.music_lm_ce_per_codebook
        else None,
        "gain_over_music_lm_shuffled": r.gain_over_music_lm_shuffled if r.music_lm_ce_per_codebook else None,
        "gain_over_music_lm_by_position": {
            k: {"gain": g["gain"], "ci95": list(g["ci95"]), "n_codes": g["n_codes"]}
            for k, g in r.gain_over_music_lm_by_position.items()
        }
        or None,
        **_teacher_summary(r),
        "held_out": r.held_out,
        "eval_overlap_clips": r.n_overlap_clips,
        "per_shard_set": r.per_shard_set,
        # what training saw; null outside a run
        "n_train_clips": r.n_train_clips,
        "n_train_captions": r.n_train_captions,
        "train_sequences": r.train_sequences,
        "train_end_targets": r.train_end_targets,
    }


def _teacher_summary(r: EvalReport) -> dict[str, Any]:
    scored = math.isfinite(r.music_lm_text_ce)
    return {
        "music_lm_text_ce": r.music_lm_text_ce if scored else None,
        "music_lm_text_ce_shuffled": r.music_lm_text_ce_shuffled if scored else None,
        "teacher_caption_gain": r.teacher_caption_gain if scored else None,
        "teacher_caption_gain_ci95": [r.teacher_caption_gain_lo, r.teacher_caption_gain_hi] if scored else None,
        "gain_over_teacher": r.gain_over_teacher if scored else None,
        "gain_over_teacher_ci95": [r.gain_over_teacher_lo, r.gain_over_teacher_hi] if scored else None,
        "teacher": r.teacher_status or None,
    }


def _ci(gain: float, lo: float, hi: float) -> str:
    return f"{gain:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def _versus_musicgen_line(r: EvalReport) -> list[str]:
    """One line: the adapter against MusicGen's null and the teacher, with each one's caption gain (a gain over a
    baseline is its CE minus the adapter's)."""
    if not r.music_lm_ce_per_codebook and not math.isfinite(r.music_lm_text_ce):
        return []
    parts = [
        f"  vs MusicGen   adapter {r.ce:.4f} (caption gain {_ci(r.caption_gain, r.caption_gain_lo, r.caption_gain_hi)})"
    ]
    if r.music_lm_ce_per_codebook:
        parts.append(
            f"null {r.music_lm_ce:.4f}: adapter's gain "
            f"{_ci(r.gain_over_music_lm, r.gain_over_music_lm_lo, r.gain_over_music_lm_hi)}"
        )
    if math.isfinite(r.music_lm_text_ce):
        if r.gain_over_teacher_lo > 0:
            verdict = "CE under the teacher's"
        elif r.gain_over_teacher_hi < 0:
            verdict = "CE above the teacher's"
        else:
            verdict = "CE level with the teacher's (interval spans 0)"
        verdict += "; caption gain " + ("at least" if r.caption_gain >= r.teacher_caption_gain else "below") + " its"
        parts.append(
            f"teacher {r.music_lm_text_ce:.4f} (caption gain "
            f"{_ci(r.teacher_caption_gain, r.teacher_caption_gain_lo, r.teacher_caption_gain_hi)}): adapter's gain "
            f"{_ci(r.gain_over_teacher, r.gain_over_teacher_lo, r.gain_over_teacher_hi)}, {verdict}"
        )
    else:
        parts.append(f"teacher {r.teacher_status or 'not scored'}")
    return [" | ".join(parts)]


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


def _music_lm_lines(r: EvalReport) -> list[str]:
    """The frozen music LM alone and what the adapter adds to it (nothing when it was not scored)."""
    if not r.music_lm_ce_per_codebook:
        return []
    first = r.gain_over_music_lm_by_position.get("frames_0_10")
    return [
        f"  music LM      {r.music_lm_ce:.4f} nats/code alone (no caption)   adapter gain over it "
        f"{r.gain_over_music_lm:+.4f} [{r.gain_over_music_lm_lo:+.4f}, {r.gain_over_music_lm_hi:+.4f}] with true "
        f"captions, {r.gain_over_music_lm_shuffled:+.4f} with shuffled"
        + (f"; frames 0-10 {first['gain']:+.4f} [{first['ci95'][0]:+.4f}, {first['ci95'][1]:+.4f}]" if first else "")
    ]


def _trained_on(r: EvalReport) -> str:
    """The header's "; trained on N clips with M distinct captions" (empty outside a run)."""
    if r.n_train_clips is None or r.n_train_captions is None:
        return ""
    return f"; trained on {r.n_train_clips} clips with {r.n_train_captions} distinct captions"


def _end_seen(r: EvalReport) -> str:
    """The END CE line's note on how often training saw AUDIO_END as a target (empty outside a run)."""
    if r.train_sequences is None or r.train_end_targets is None:
        return ""
    if r.train_sequences == 0:
        return "  (no training sequence yet)"
    return f"  (AUDIO_END was a training target in {r.train_end_targets} of {r.train_sequences} sequences)"


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
        *_music_lm_lines(r),
        *_versus_musicgen_line(r),
        *_per_set_lines(r.per_shard_set),
        "=" * 72,
    ]
    return "\n".join(lines)


def _bin_label(key: str) -> str:
    """ "frames_0_10" -> "frames 0-10" (the printed block)."""
    _, lo, hi = key.split("_")
    return f"frames {lo}-{hi}"
