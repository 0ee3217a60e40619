"""Eval honesty: overlapping train/eval clips are refused (or, opted in, reported as NOT held-out),
and the caption-gain verdict needs >= 30 eval clips; identical captions give a gain of exactly 0, never PASS."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adapter_trainer.evaluation.held_out import EvalOverlapError
from adapter_trainer.evaluation.learning_check import learning_check_summary, learning_check_text
from adapter_trainer.evaluation.report import make_report
from adapter_trainer.evaluation.stats import MIN_GAIN_CLIPS
from adapter_trainer.evaluation.target_ce import TargetCE
from adapter_trainer.training.recipe import MoTAdapterRecipe
from tests.trainer.helpers import make_cfg


def test_eval_split_equal_to_train_is_refused(models, shards, tmp_path: Path) -> None:
    cfg = make_cfg(models, shards, tmp_path / "run", "data.eval_split=train")
    with pytest.raises(EvalOverlapError) as e:
        MoTAdapterRecipe(cfg).setup()
    msg = str(e.value)
    assert "overlap" in msg and "8 of 8 eval clips" in msg and "data.allow_eval_overlap=true" in msg


def test_two_shard_sets_sharing_clips_are_refused(models, shards, tmp_path: Path) -> None:
    """A second shard set whose eval split holds clips that are train clips of the first (its split column said
    otherwise): the keys decide, not the split names."""
    from tests.contract.shard_fixture import synthetic_clips, write_shard_set

    train = synthetic_clips(8, frames=(12, 20), seed=0, prefix="tr")  # the same clips as `shards`' train split
    other = write_shard_set(
        tmp_path / "other", {"train": synthetic_clips(4, frames=(12, 20), seed=5, prefix="zz"), "eval": train[:3]}
    )
    cfg = make_cfg(models, shards, tmp_path / "run", f"data.shards=[{shards},{other}]")
    with pytest.raises(EvalOverlapError, match="3 of 7 eval clips"):
        MoTAdapterRecipe(cfg).setup()


def test_opted_in_overlap_is_reported_as_not_held_out(models, shards, tmp_path: Path) -> None:
    cfg = make_cfg(
        models,
        shards,
        tmp_path / "run",
        "data.eval_split=train",
        "data.allow_eval_overlap=true",
        "data.eval_max_clips=3",
    )
    recipe = MoTAdapterRecipe(cfg)
    recipe.setup()
    report = recipe.evaluate()
    assert not report.held_out and report.n_overlap_clips == 3
    assert "NOT held-out: 3 eval clips are also train clips" in learning_check_text(report)


def _target_ce(per_clip_sum: np.ndarray, per_clip_n: np.ndarray) -> TargetCE:
    return TargetCE(np.array([per_clip_sum.sum()]), np.array([per_clip_n.sum()]), per_clip_sum, per_clip_n)


@pytest.mark.parametrize("n_clips,verdict", [(MIN_GAIN_CLIPS - 1, "INSUFFICIENT"), (MIN_GAIN_CLIPS, "PASS")])
def test_caption_gain_verdict_needs_30_clips(n_clips: int, verdict: str) -> None:
    rng = np.random.default_rng(0)
    n = np.full(n_clips, 50)
    true = rng.uniform(2.0, 3.0, n_clips) * n
    shuf = true + 0.5 * n  # every clip gains 0.5 nats/code: the interval is far above 0
    r = make_report(
        step=1,
        model_true=_target_ce(true, n),
        model_shuf=_target_ce(shuf, n),
        unigram=_target_ce(true, n),
        end_ce_sum=0.0,
        end_count=0,
        n_bootstrap=200,
        seed=0,
    )
    assert r.caption_gain_lo > 0.4 and r.caption_gain_verdict == verdict
    assert f"[{verdict}:" in learning_check_text(r)


def test_identical_captions_give_exactly_zero_gain_and_no_pass(models, tmp_path: Path) -> None:
    from tests.contract.shard_fixture import synthetic_clips, write_shard_set

    train = synthetic_clips(8, frames=(12, 20), seed=0, prefix="tr")
    evl = [
        (k, "the same caption for every clip", c)
        for k, _, c in synthetic_clips(32, frames=(8, 12), seed=1, prefix="ev")
    ]
    same = write_shard_set(tmp_path / "same", {"train": train, "eval": evl})
    cfg = make_cfg(models, same, tmp_path / "run", "trainer.batch_size=8", "trainer.eval_caption_shuffles=2")
    recipe = MoTAdapterRecipe(cfg)
    recipe.setup()
    r = recipe.evaluate()
    assert r.n_clips == 32 >= MIN_GAIN_CLIPS
    assert r.caption_gain == 0.0 and r.caption_gain_lo == 0.0 and r.caption_gain_hi == 0.0  # exact: same inputs
    assert r.caption_gain_verdict == "FAIL"


def test_end_ce_is_measured_when_no_eval_window_reaches_a_clip_end(models, tmp_path: Path) -> None:
    """Eval clips longer than the 48-token eval window (as on the demo): END is scored on each clip's end window."""
    from tests.contract.shard_fixture import synthetic_clips, write_shard_set

    long = write_shard_set(
        tmp_path / "long",
        {
            "train": synthetic_clips(4, frames=(60, 80), seed=0, prefix="tr"),
            "eval": synthetic_clips(3, frames=(60, 80), seed=1, prefix="ev"),
        },
    )
    recipe = MoTAdapterRecipe(make_cfg(models, long, tmp_path / "run"))
    recipe.setup()
    r = recipe.evaluate()
    assert np.isfinite(r.end_ce) and r.end_ce > 0.0
    assert "END CE" in learning_check_text(r) and "nan" not in learning_check_text(r).split("END CE")[1].split("\n")[0]


def test_report_names_the_train_clips_and_their_distinct_captions(models, shards, tmp_path: Path) -> None:
    """The `shards` fixture's 8 train clips draw from 4 genre captions: the header counts each caption once."""
    from tests.contract.shard_fixture import synthetic_clips

    want = len({cap for _, cap, _ in synthetic_clips(8, frames=(12, 20), seed=0, prefix="tr")})
    assert want < 8
    recipe = MoTAdapterRecipe(make_cfg(models, shards, tmp_path / "run"))
    recipe.setup()
    r = recipe.evaluate()
    assert (r.n_train_clips, r.n_train_captions) == (8, want)
    header = learning_check_text(r).split("\n")[1]
    assert header.startswith("LEARNING CHECK (") and f"; trained on 8 clips with {want} distinct captions)" in header
    summary = learning_check_summary(r)
    assert (summary["n_train_clips"], summary["n_train_captions"]) == (8, want)


def test_a_shard_set_with_no_eval_clips_is_named_as_train_only_not_printed_as_nan() -> None:
    n = np.full(40, 50)
    true = np.random.default_rng(0).uniform(2.0, 3.0, 40) * n
    r = make_report(step=1, model_true=_target_ce(true, n), model_shuf=_target_ce(true + n, n),
                    unigram=_target_ce(true, n), end_ce_sum=0.0, end_count=0, n_bootstrap=50, seed=0)  # fmt: skip
    nan = float("nan")
    r.per_shard_set = {
        "a": {"ce": 2.5, "unigram_ce": 2.5, "rel_to_unigram_pct": 0.0, "caption_gain": 1.0, "n_clips": 40},
        "b": {"ce": nan, "unigram_ce": nan, "rel_to_unigram_pct": nan, "caption_gain": nan, "n_clips": 0},
    }
    text = learning_check_text(r)
    assert "set a: CE 2.5000" in text and "set b: no eval clips (it adds train clips only)" in text
    assert "nan" not in "".join(line for line in text.split("\n") if line.lstrip().startswith("set "))


# ---- the frozen music LM alone (evaluation.music_lm_baseline)


def _musicgen_own_ce(models, recipe: MoTAdapterRecipe) -> tuple[float, list[float]]:
    """MusicGen's CE on every eval clip's learning-check window, from transformers' own loss, clip by clip: the
    window's codes (those the report scores) in build_delay_pattern_mask's layout. Returns (mean over targets, per clip)."""
    import torch

    from adapter_trainer.data.streaming import eval_example
    from adapter_trainer.data.token_layout import DelayPattern
    from adapter_trainer.model.builders import load_musicgen_decoder

    mg = load_musicgen_decoder(models["musicgen"]).eval()
    K, pad, bos = mg.config.num_codebooks, mg.config.pad_token_id, mg.config.bos_token_id
    h = recipe.held_out
    total, count, per_clip = 0.0, 0, []
    for i in range(len(h.index)):
        ex = eval_example(h.spec, h.captions[i].tolist(), h.reader.read(i))
        audio = ex.tokens[ex.is_audio][1:] - h.spec.vocab.text_vocab_size  # [steps, K] after AUDIO_START
        is_code = audio < h.spec.vocab.n_codes
        steps = DelayPattern(K).revert(torch.where(is_code, audio, torch.zeros_like(audio)))  # [T, K] k*C + c
        codes = (steps - torch.arange(K) * h.spec.vocab.codebook_size).T  # [K, T] raw codes of the window
        T = codes.shape[1]
        prompt = torch.cat([torch.full((K, 1), bos), codes], dim=1)
        _, pattern = mg.build_delay_pattern_mask(prompt, pad_token_id=pad, max_length=T + K)  # [K, T + K]
        with torch.no_grad():
            loss = float(mg(input_ids=pattern[:, :-1], labels=pattern[:, 1:].T[None]).loss)  # K codebooks x T codes
        per_clip.append(loss)
        total += loss * T * K
        count += T * K
    return total / count, per_clip


def test_music_lm_alone_is_musicgens_own_loss_on_the_eval_windows(models, tmp_path: Path) -> None:
    from tests.contract.shard_fixture import synthetic_clips, write_shard_set

    long = write_shard_set(
        tmp_path / "long",
        {
            "train": synthetic_clips(4, frames=(60, 80), seed=0, prefix="tr"),
            "eval": synthetic_clips(5, frames=(60, 80), seed=1, prefix="ev"),  # no window reaches an END
        },
    )
    recipe = MoTAdapterRecipe(make_cfg(models, long, tmp_path / "run", "trainer.batch_size=2"))
    recipe.setup()
    # nothing of the baseline before the first step: MusicGen is loaded and scored at the first report, once
    assert recipe.held_out.music_lm is None and recipe.held_out.pending_baselines is not None
    r = recipe.evaluate()
    assert recipe.held_out.pending_baselines is None
    want, per_clip = _musicgen_own_ce(models, recipe)
    assert r.music_lm_ce == pytest.approx(want, rel=1e-5)
    # per-clip gains: MusicGen's per-clip CE minus the adapter's
    adapter = recipe.held_out  # the report's gain is the mean over clips of (music LM - adapter)
    assert adapter.music_lm is not None
    got = adapter.music_lm.sum_per_example / adapter.music_lm.count_per_example
    np.testing.assert_allclose(got, per_clip, rtol=1e-5)
    text = learning_check_text(r)
    assert "music LM      " in text and f"{r.music_lm_ce:.4f} nats/code alone" in text
    summary = learning_check_summary(r)
    assert summary["music_lm_ce"] == r.music_lm_ce and len(summary["gain_over_music_lm_ci95"]) == 2
    assert set(summary["gain_over_music_lm_by_position"]) == {"frames_0_10", "frames_10_50", "frames_50_end"}
    assert np.isfinite(r.scalars()["eval/gain_over_music_lm"])


@pytest.mark.parametrize(
    "overrides", [("trainer.eval_music_lm=false",), ("model.mot.audio_tower=llm", "data.pattern=flatten")]
)
def test_music_lm_alone_is_not_scored_when_off_or_on_flatten(
    models, shards, tmp_path: Path, overrides: tuple[str, ...]
) -> None:
    recipe = MoTAdapterRecipe(make_cfg(models, shards, tmp_path / "run", *overrides))
    recipe.setup()
    r = recipe.evaluate()
    assert recipe.held_out.music_lm is None and not r.music_lm_ce_per_codebook
    assert "music LM" not in learning_check_text(r)
    summary = learning_check_summary(r)
    assert summary["music_lm_ce"] is None and summary["gain_over_music_lm"] is None
    assert "eval/music_lm_ce" not in r.scalars()


def test_gain_over_music_lm_is_its_per_clip_ce_minus_the_adapters() -> None:
    rng = np.random.default_rng(0)
    n = np.full(40, 50)
    true = rng.uniform(2.0, 3.0, 40) * n
    music = true + rng.uniform(0.0, 0.2, 40) * n  # the adapter is better on every clip
    r = make_report(
        step=1,
        model_true=_target_ce(true, n),
        model_shuf=_target_ce(true + 0.05 * n, n),
        unigram=_target_ce(true * 2, n),
        end_ce_sum=0.0,
        end_count=0,
        n_bootstrap=200,
        seed=0,
        music_lm=_target_ce(music, n),
    )
    assert r.gain_over_music_lm == pytest.approx(float(np.mean((music - true) / n)))
    assert 0.0 < r.gain_over_music_lm_lo < r.gain_over_music_lm < r.gain_over_music_lm_hi
    assert r.gain_over_music_lm_shuffled == pytest.approx(r.music_lm_ce - r.ce_shuffled)
    assert r.music_lm_ce == pytest.approx(music.sum() / n.sum())
    with pytest.raises(RuntimeError, match="music LM run scored different targets"):
        make_report(
            step=1,
            model_true=_target_ce(true, n),
            model_shuf=_target_ce(true, n),
            unigram=_target_ce(true, n),
            end_ce_sum=0.0,
            end_count=0,
            n_bootstrap=10,
            seed=0,
            music_lm=_target_ce(music[:-1], n[:-1]),
        )
