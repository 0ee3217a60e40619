"""The attribute probe (synthetic codes whose histograms follow the caption's attributes)."""

from __future__ import annotations

import numpy as np
import pytest

from adapter_trainer.data.samples import Clip
from adapter_trainer.errors import UserError
from adapter_trainer.evaluation.probe import (
    FOLLOWS,
    MDE_Z,
    MIN_VERDICT_CLIPS,
    NAMES,
    NOT_DETECTED,
    TOO_FEW,
    ProbeInputError,
    _deranged_accuracy,
    attribute_labels,
    fraction_of_ceiling,
    make_report,
    minimum_detectable_effect,
    per_clip_accuracy,
    verdict,
)

C = 64
TEXTS = (
    "solo piano, slow, sad",
    "electric guitar, drums, fast, happy",
    "female vocal, calm, happy",
    "drums, techno, dark",
)


def test_attribute_labels_from_keywords() -> None:
    lab = dict(zip(NAMES, attribute_labels("Electric guitar, fast drums, happy vibe")))
    assert lab["guitar"] == 1 and lab["drums"] == 1 and lab["fast"] == 1 and lab["minor"] == 0 and lab["piano"] == 0
    lab = dict(zip(NAMES, attribute_labels("fast but also slow")))
    assert np.isnan(lab["fast"]) and np.isnan(lab["minor"])  # both sides / neither side: undefined
    assert attribute_labels("bass drum")[NAMES.index("drums")] == 1
    assert attribute_labels("keyboardist")[NAMES.index("piano")] == 0  # whole words only


def synth(text: str, key: str, rng: np.random.Generator, follow: bool = True, T: int = 200) -> Clip:
    """Codebooks 0/1: each defined positive attribute a adds codes from its own band [8a, 8a + 8)."""
    lab = attribute_labels(text if follow else TEXTS[rng.integers(len(TEXTS))])
    bands = [a for a in range(len(NAMES)) if lab[a] == 1] or [len(NAMES)]
    codes = np.stack(
        [rng.choice(np.concatenate([np.arange(8 * a, 8 * a + 8) for a in bands]), size=T) for _ in range(4)], axis=1
    ).astype(np.int16)  # [T, 4]
    return Clip(key=key, caption=text, aspects=tuple(t.strip() for t in text.split(",")), codes=codes)


def test_probe_separates_caption_following_from_ignoring() -> None:
    rng = np.random.default_rng(0)
    train = [synth(TEXTS[i % 4], f"t{i}", rng) for i in range(40)]
    real_eval = [synth(TEXTS[i % 4], f"e{i}", rng) for i in range(12)]
    follows = [synth(TEXTS[i % 4], f"g{i}", rng) for i in range(32)]  # a verdict needs >= 30 clips
    ignores = [synth(TEXTS[i % 4], f"h{i}", rng, follow=False) for i in range(32)]
    good = make_report(train, real_eval, follows, C, n_bootstrap=200)
    bad = make_report(train, real_eval, ignores, C, n_bootstrap=200)
    assert good["probe_ceiling_real_eval"] > 0.95
    assert good["accuracy_true_captions"] > 0.95 and good["true_minus_deranged_ci95"][0] > 0.1
    assert (
        good["accuracy_true_captions_ci95"][0]
        <= good["accuracy_true_captions"]
        <= good["accuracy_true_captions_ci95"][1]
    )
    assert good["accuracy_deranged_captions"] < good["accuracy_true_captions"]
    assert good["verdict"] == FOLLOWS and good["n_clips"] == 32
    assert 0.5 < good["fraction_of_ceiling"] < 1.5  # follows every caption: about the whole reach of the probe
    lo, hi = good["fraction_of_ceiling_ci95"]
    assert lo <= good["fraction_of_ceiling"] <= hi
    assert 0 < good["mde"] < good["true_minus_deranged"]  # an effect this large is well within reach
    gap = good["probe_ceiling_real_eval"] - good["probe_deranged_real_eval"]
    assert gap > 0.1 and abs(good["mde_fraction_of_ceiling"] - good["mde"] / gap) < 1e-9
    assert bad["true_minus_deranged_ci95"][0] < 0.05  # codes that ignore the caption: no clear gain over deranged
    assert bad["accuracy_true_captions"] < good["accuracy_true_captions"] - 0.15
    assert bad["fraction_of_ceiling"] < good["fraction_of_ceiling"] - 0.3
    with pytest.raises(ProbeInputError, match=">= 2 generated") as err:  # a user error: exit 2, no traceback
        make_report(train, real_eval, follows[:1], C)
    assert isinstance(err.value, UserError)


def test_report_has_per_clip_attributes_and_no_pooled_chance() -> None:
    """Each generated clip: its caption's attributes (None = undefined), the probe's reading, both accuracies.
    The pooled `chance` (pooled label and prediction rates, not computed like the per-clip accuracy) is gone; the
    deranged-caption accuracy, scored the same way as the true one, is the null."""
    rng = np.random.default_rng(1)
    train = [synth(TEXTS[i % 4], f"t{i}", rng) for i in range(40)]
    real_eval = [synth(TEXTS[i % 4], f"e{i}", rng) for i in range(8)]
    gen = [synth(TEXTS[i % 4], f"g{i}", rng) for i in range(6)]
    r = make_report(train, real_eval, gen, C, n_bootstrap=50)
    assert "chance" not in r and "probe_chance_real_eval" not in r
    assert [c["key"] for c in r["per_clip"]] == [c.key for c in gen]
    first = r["per_clip"][0]  # "solo piano, slow, sad"
    assert first["caption_attributes"] == {"drums": 0, "fast": 0, "minor": 1, "piano": 1, "guitar": 0, "vocal": 0}
    assert set(first["predicted_attributes"]) == set(NAMES)
    assert all(v in (0, 1) for c in r["per_clip"] for v in c["predicted_attributes"].values())
    n_right = sum(first["predicted_attributes"][a] == v for a, v in first["caption_attributes"].items())
    assert abs(first["accuracy_true"] - n_right / 6) < 1e-9
    third = r["per_clip"][2]  # "female vocal, calm, happy": no minor-vs-major conflict, all defined
    assert third["caption_attributes"]["fast"] == 0 and third["caption_attributes"]["minor"] == 0
    mean_true = np.mean([c["accuracy_true"] for c in r["per_clip"]])
    assert abs(mean_true - r["accuracy_true_captions"]) < 1e-9
    fewer = make_report(train, real_eval, gen[:4], C, n_bootstrap=50)  # the real clips' null is the same
    assert fewer["probe_deranged_real_eval"] == r["probe_deranged_real_eval"]


def test_deranged_null_is_unbiased_when_predictions_ignore_the_labels() -> None:
    """Predictions drawn independently of the labels (rates unequal, some labels undefined): the deranged accuracy
    matches the own-caption accuracy in expectation, so true - deranged centres on 0 (tolerance 0.02 over 4000
    clips); with predictions copied from the labels it does not."""
    rng = np.random.default_rng(2)
    n = 4000
    labels = (rng.random((n, 6)) < [0.7, 0.4, 0.5, 0.2, 0.3, 0.6]).astype(float)  # [N, A]
    labels[rng.random((n, 6)) < 0.3] = np.nan
    pred = (rng.random((n, 6)) < [0.9, 0.1, 0.5, 0.5, 0.2, 0.8]).astype(float)  # independent of the labels
    gap = np.nanmean(per_clip_accuracy(pred, labels)) - np.nanmean(_deranged_accuracy(pred, labels, 4, rng))
    assert abs(gap) < 0.02
    follow = np.nan_to_num(labels)
    gap = np.nanmean(per_clip_accuracy(follow, labels)) - np.nanmean(_deranged_accuracy(follow, labels, 4, rng))
    assert gap > 0.3


def test_deranged_null_skips_clips_with_the_same_caption_text() -> None:
    """generate.captions=file cycles its lines when generate.n exceeds them: clips 0, 2, 4, 6 share one text and so
    its attributes. The null must score a clip against captions of other texts only, else a caption-following
    generator's true - deranged shrinks toward 0 (here it would be 4/7 instead of 1)."""
    texts = ["fast piano with vocals", "slow guitar, no vocals"] * 4
    labels = np.stack([attribute_labels(t) for t in texts])  # [8, A]
    pred = np.nan_to_num(labels)  # follows its caption perfectly
    rng = np.random.default_rng(0)
    deranged = _deranged_accuracy(pred, labels, 16, rng, texts=texts)
    other = per_clip_accuracy(pred[[1, 0]], labels[[0, 1]])  # each text's prediction read against the other text
    np.testing.assert_allclose(deranged, np.tile(other, 4), atol=1e-12)
    np.testing.assert_allclose(per_clip_accuracy(pred, labels), 1.0)


def test_verdict_follows_only_when_the_interval_is_above_zero() -> None:
    assert verdict([0.01, 0.2], 30) == FOLLOWS
    for ci in ([-0.01, 0.2], [0.0, 0.1], [-0.3, -0.1]):  # straddles, touches, below: absence of evidence only
        assert verdict(ci, 30) == NOT_DETECTED
    assert "not" not in FOLLOWS and "does not follow" not in NOT_DETECTED


def test_minimum_detectable_effect_math_and_power() -> None:
    """MDE = 2.8 x SE: [+0.5, -0.5, +0.5, -0.5] has sd 0.5 * sqrt(4/3), SE sd / 2. Checked against its promise:
    a true effect of one MDE is detected (mean - 1.96 SE > 0) in about 80% of simulated samples (+-0.04)."""
    assert abs(minimum_detectable_effect(np.array([0.5, -0.5, 0.5, -0.5])) - 2.8 * 0.5 * np.sqrt(4 / 3) / 2) < 1e-12
    assert np.isnan(minimum_detectable_effect(np.array([0.3])))
    rng = np.random.default_rng(3)
    n, sd = 80, 0.2
    mde = MDE_Z * sd / np.sqrt(n)
    samples = rng.normal(mde, sd, size=(4000, n))  # [R, N]
    detected = samples.mean(1) - 1.96 * samples.std(1, ddof=1) / np.sqrt(n) > 0
    assert abs(detected.mean() - 0.8) < 0.04
    assert abs(minimum_detectable_effect(samples[0]) - mde) < 0.25 * mde  # the estimate from one sample


def test_fraction_of_ceiling_is_undefined_when_the_ceiling_is_not_above_its_null() -> None:
    """Real clips whose own-minus-deranged mean is a hair above 0 with an interval across 0 (the probe reads no
    attribute it can tell apart): the ratio would be 20 with an interval spanning thousands; it is undefined."""
    gen = np.array([0.0, 0.2] * 20)  # mean 0.1
    real = np.array([0.3, -0.29] * 20)  # mean 0.005, 95% interval across 0
    assert all(np.isnan(fraction_of_ceiling(gen, real, n_bootstrap=500, seed=0)))


def test_fraction_of_ceiling_math() -> None:
    """mean(gen diffs) / mean(real diffs), with a bootstrap interval around it; undefined without a probe reach."""
    gen = np.array([0.0, 0.2] * 20)  # mean 0.1
    real = np.array([0.1, 0.3] * 20)  # mean 0.2 = ceiling - deranged on real clips
    frac, lo, hi = fraction_of_ceiling(gen, real, n_bootstrap=500, seed=0)
    assert abs(frac - 0.5) < 1e-12 and lo < 0.5 < hi and hi - lo < 0.5
    assert all(np.isnan(fraction_of_ceiling(gen, np.array([0.1, -0.2]), n_bootstrap=50, seed=0)))


def test_below_30_clips_the_verdict_is_too_few_clips() -> None:
    """A caption-blind generator (per-clip true - deranged centred on 0) passes the percentile-bootstrap rule far
    more often than the nominal 2.5% at a few clips; at 30 it is near nominal. So no verdict below 30."""
    from adapter_trainer.evaluation.stats import bootstrap_mean_ci

    rng = np.random.default_rng(0)

    def pass_rate(n: int, sims: int = 1500) -> float:
        diffs = rng.choice([-1 / 6, 0.0, 1 / 6], size=(sims, n))  # a 6-attribute accuracy difference, mean 0
        return float(np.mean([bootstrap_mean_ci(d, 500, i)[1] > 0 for i, d in enumerate(diffs)]))

    assert pass_rate(4) > 0.045  # about twice the nominal 2.5%
    assert pass_rate(30) < 0.045
    assert MIN_VERDICT_CLIPS == 30
    assert verdict([0.05, 0.3], 29) == TOO_FEW and verdict([-0.1, 0.3], 8) == TOO_FEW
    rng2 = np.random.default_rng(0)
    train = [synth(TEXTS[i % 4], f"t{i}", rng2) for i in range(40)]
    real_eval = [synth(TEXTS[i % 4], f"e{i}", rng2) for i in range(8)]
    few = make_report(train, real_eval, [synth(TEXTS[i % 4], f"g{i}", rng2) for i in range(8)], C, n_bootstrap=100)
    assert few["true_minus_deranged_ci95"][0] > 0 and few["verdict"] == TOO_FEW


def test_fraction_of_ceiling_uses_the_ceiling_of_the_eval_clips_that_captioned_the_set() -> None:
    """generate.n below the eval clips: the generated set follows the captions of e0..e5 only. Their ceiling, not the
    whole eval split's (here the other eval clips' codes ignore their captions), is the denominator."""
    rng = np.random.default_rng(1)
    train = [synth(TEXTS[i % 4], f"t{i}", rng) for i in range(40)]
    sub = [synth(TEXTS[i % 4], f"e{i}", rng) for i in range(6)]
    rest = [synth(TEXTS[i % 4], f"e{i}", rng, follow=False) for i in range(6, 16)]
    gen = [synth(TEXTS[i % 4], f"g{i}", rng) for i in range(6)]
    keys = [c.key for c in sub]
    r = make_report(train, sub + rest, gen, C, n_bootstrap=100, source_keys=keys)
    only = make_report(train, sub, gen, C, n_bootstrap=100)
    whole = make_report(train, sub + rest, gen, C, n_bootstrap=100)
    assert r["probe_ceiling_real_eval"] == only["probe_ceiling_real_eval"]
    assert r["fraction_of_ceiling"] == only["fraction_of_ceiling"] and r["n_real_eval"] == 6
    assert r["ceiling_clips"] == "the eval clips whose captions generated the set"
    assert whole["probe_ceiling_real_eval"] < r["probe_ceiling_real_eval"] - 0.05  # the other ceiling differs
