"""The caption gain by position: the gain over the eval window's first 10 frames, frames 10-49 and the rest, each
with a bootstrap interval over clips, adds back (weighted by code counts) to the whole-window gain; the frame of each
code target follows the token layout; a tiny run reports it in final_metrics.json and draws its PNG."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from adapter_trainer.data.token_layout import AudioVocab, collate, encode_example, target_frames
from adapter_trainer.evaluation.learning_check import learning_check_summary, learning_check_text
from adapter_trainer.evaluation.report import FRAME_BINS, make_report
from adapter_trainer.evaluation.target_ce import TargetCE
from adapter_trainer.training.recipe import recipe_main
from tests.trainer.helpers import make_cfg


def _target_ce(per_frame_sum: np.ndarray, per_frame_n: np.ndarray) -> TargetCE:
    """A TargetCE of N clips from per-clip, per-frame sums [N, F] (one codebook)."""
    s, n = per_frame_sum.sum(axis=1), per_frame_n.sum(axis=1)  # [N], [N]
    return TargetCE(np.array([s.sum()]), np.array([n.sum()]), s, n, per_frame_sum, per_frame_n)


def _report(n_clips: int = 40, n_frames: int = 75, codes_per_frame: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    counts = np.full((n_clips, n_frames), codes_per_frame, dtype=np.int64)  # every clip fills the window
    true = rng.uniform(2.0, 6.0, (n_clips, n_frames)) * counts  # [N, F] summed CE
    # the gain falls with the frame, and varies from clip to clip
    shuf = true + rng.normal(0.3, 0.2, (n_clips, 1)) * np.exp(-np.arange(n_frames) / 20.0) * counts
    t, s = _target_ce(true, counts), _target_ce(shuf, counts)
    return make_report(
        step=3, model_true=t, model_shuf=s, unigram=t, end_ce_sum=0.0, end_count=0, n_bootstrap=500, seed=1
    )


def test_gains_by_position_add_back_to_the_whole_window_gain() -> None:
    r = _report()
    bins = r.caption_gain_by_position
    assert list(bins) == [key for key, _, _ in FRAME_BINS] == ["frames_0_10", "frames_10_50", "frames_50_end"]
    n = np.array([g["n_codes"] for g in bins.values()])
    assert n.tolist() == [40 * 10 * 4, 40 * 40 * 4, 40 * 25 * 4] and n.sum() == r.n_code_targets
    weighted = sum(g["gain"] * g["n_codes"] for g in bins.values()) / n.sum()
    assert abs(weighted - r.caption_gain) < 1e-6  # every clip fills the window: the headline is code-weighted too
    assert abs(weighted - (r.ce_shuffled - r.ce)) < 1e-6
    assert bins["frames_0_10"]["gain"] > bins["frames_10_50"]["gain"] > bins["frames_50_end"]["gain"]  # the decay
    assert len(r.caption_gain_by_frame) == 75
    curve_weighted = np.mean(r.caption_gain_by_frame)  # equal counts per frame
    assert abs(curve_weighted - r.caption_gain) < 1e-6


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_interval_contains_its_point(seed: int) -> None:
    r = _report(seed=seed)
    for g in r.caption_gain_by_position.values():
        lo, hi = g["ci95"]
        assert lo < g["gain"] < hi and hi - lo > 0


def test_summary_and_printed_block_carry_the_three_figures() -> None:
    r = _report()
    summary = learning_check_summary(r)
    by_pos = summary["caption_gain_by_position"]
    assert set(by_pos) == {"frames_0_10", "frames_10_50", "frames_50_end"}
    for g in by_pos.values():
        assert isinstance(g["gain"], float) and len(g["ci95"]) == 2
    assert "caption_gain" in summary and "caption_gain_ci95" in summary  # the whole-window figure stays
    text = learning_check_text(r)
    for key in by_pos:
        g = by_pos[key]
        assert f"{g['gain']:+.4f} [{g['ci95'][0]:+.4f}, {g['ci95'][1]:+.4f}]" in text
    scalars = r.scalars()
    assert scalars["eval/caption_gain_frames_0_10"] == by_pos["frames_0_10"]["gain"]


@pytest.mark.parametrize("pattern", ["delay", "flatten"])
def test_target_frames_follow_the_layout(pattern: str) -> None:
    """Each code target's frame, from the label cell it sits in, equals the frame its code came from (a loop
    reference over the codes, which here encode their own frame)."""
    vocab = AudioVocab(text_vocab_size=100, n_codebooks=4, codebook_size=64)
    examples = []
    for n_cap, T in ((5, 9), (11, 4)):
        codes = (np.arange(T)[:, None] * 4 + np.arange(4)[None, :]) % 64  # [T, K] code = 4t + k
        examples.append(
            encode_example(
                list(range(3, 3 + n_cap)),
                codes.astype(np.int16),
                vocab=vocab,
                pattern=pattern,
                bos_id=1,
                max_seq_len=64,
                max_caption_tokens=16,
                crop="start",
                rng=np.random.default_rng(0),
            )
        )
    batch = collate(examples, pad_id=0)
    frames = target_frames(batch.tokens, batch.labels, vocab=vocab, pattern=pattern)  # [B, S, J]
    lab = batch.labels
    is_code = (lab >= vocab.audio_offset) & (lab < vocab.audio_start)
    assert torch.equal(frames >= 0, is_code)  # every code target has a frame, nothing else has one
    code = (lab[is_code] - vocab.audio_offset) % vocab.codebook_size  # = 4t + k
    assert torch.equal(frames[is_code], code // 4)
    for b, T in enumerate((9, 4)):
        assert sorted(frames[b][frames[b] >= 0].tolist()) == sorted(list(range(T)) * 4)  # K codes per frame


def test_tiny_run_reports_the_gain_by_position(models, tmp_path: Path) -> None:
    from tests.contract.shard_fixture import synthetic_clips, write_shard_set

    shards = write_shard_set(
        tmp_path / "set",
        {
            "train": synthetic_clips(8, frames=(30, 40), seed=0, prefix="tr"),
            # eval clips shorter and longer than the ~31-frame eval window: counts per clip differ
            "eval": synthetic_clips(6, frames=(20, 40), seed=1, prefix="ev"),
        },
    )
    out = tmp_path / "run"
    final = recipe_main(make_cfg(models, shards, out, "trainer.max_steps=3", "trainer.tensorboard=true"))
    on_disk = json.loads((out / "final_metrics.json").read_text())
    by_pos = on_disk["learning_check"]["caption_gain_by_position"]
    assert list(by_pos) == ["frames_0_10", "frames_10_50", "frames_50_end"]
    ev = final["eval"]
    n_codes = [g["n_codes"] for g in by_pos.values()]
    assert sum(n_codes) == ev["n_code_targets"] and n_codes[0] == 6 * 10 * 4 and n_codes[2] == 0
    assert by_pos["frames_50_end"]["gain"] is None  # no code of frame >= 50 in a 31-frame window: nan -> null
    present = [g for g in by_pos.values() if g["n_codes"]]
    weighted = sum(g["gain"] * g["n_codes"] for g in present) / sum(n_codes)
    assert abs(weighted - (ev["ce_shuffled"] - ev["ce"])) < 1e-6  # code-weighted whole-window gain
    for g in present:
        assert g["ci95"][0] <= g["gain"] <= g["ci95"][1]
    assert (out / "caption_gain_by_frame.png").stat().st_size > 0 and (out / "loss_curve.png").exists()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tb"))
    acc.Reload()
    curve = [t for t in acc.Tags()["scalars"] if t.startswith("eval/caption_gain_by_frame/")]
    assert curve == ["eval/caption_gain_by_frame/step_000003"]
    assert [e.step for e in acc.Scalars(curve[0])] == list(range(len(ev["caption_gain_by_frame"])))
    assert "eval/caption_gain_frames_0_10" in acc.Tags()["scalars"]


def test_with_clips_of_unequal_length_the_bins_add_back_to_the_named_code_weighted_total() -> None:
    """Short clips (fewer codes) with a larger gain: the mean of per-clip means (the headline caption_gain) differs
    from the code-weighted gain the bins add back to; the report names that total and prints it."""
    rng = np.random.default_rng(5)
    n, f = 40, 75
    lengths = np.where(np.arange(n) < 20, 12, f)  # half the clips fill 12 frames only
    counts = (np.arange(f)[None, :] < lengths[:, None]).astype(np.int64) * 4  # [N, F]
    true = rng.uniform(2.0, 6.0, (n, f)) * counts
    gain = np.where(np.arange(n) < 20, 0.8, 0.1)[:, None]  # the short clips gain more
    t, s = _target_ce(true, counts), _target_ce(true + gain * counts, counts)
    r = make_report(step=1, model_true=t, model_shuf=s, unigram=t, end_ce_sum=0.0, end_count=0, n_bootstrap=50, seed=0)
    bins = r.caption_gain_by_position.values()
    weighted = sum(g["gain"] * g["n_codes"] for g in bins) / sum(g["n_codes"] for g in bins)
    assert abs(r.caption_gain - 0.45) < 1e-9 and abs(weighted - r.caption_gain) > 0.1  # the headline is not it
    summary = learning_check_summary(r)
    assert summary["caption_gain_by_position_total"] == pytest.approx(weighted, abs=1e-12)
    assert f"code-weighted total {weighted:+.4f}" in learning_check_text(r)
