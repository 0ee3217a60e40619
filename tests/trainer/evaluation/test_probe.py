"""The attribute probe (synthetic codes whose histograms follow the caption's attributes)."""

from __future__ import annotations

import numpy as np
import pytest

from adapter_trainer.data.shards import Clip
from adapter_trainer.errors import UserError
from adapter_trainer.evaluation.probe import NAMES, ProbeInputError, attribute_labels, make_report

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
    follows = [synth(TEXTS[i % 4], f"g{i}", rng) for i in range(16)]
    ignores = [synth(TEXTS[i % 4], f"h{i}", rng, follow=False) for i in range(16)]
    good = make_report(train, real_eval, follows, C, n_bootstrap=200)
    bad = make_report(train, real_eval, ignores, C, n_bootstrap=200)
    assert good["probe_ceiling_real_eval"] > 0.95
    assert good["accuracy_true_captions"] > 0.95 and good["true_minus_deranged_ci95"][0] > 0.1
    assert (
        good["accuracy_true_captions_ci95"][0]
        <= good["accuracy_true_captions"]
        <= good["accuracy_true_captions_ci95"][1]
    )
    assert 0.3 < good["chance"] < 0.9 and good["accuracy_deranged_captions"] < good["accuracy_true_captions"]
    assert bad["true_minus_deranged_ci95"][0] < 0.05  # codes that ignore the caption: no clear gain over deranged
    assert bad["accuracy_true_captions"] < good["accuracy_true_captions"] - 0.15
    with pytest.raises(ProbeInputError, match=">= 2 generated") as err:  # a user error: exit 2, no traceback
        make_report(train, real_eval, follows[:1], C)
    assert isinstance(err.value, UserError)
