"""The attribute probe (synthetic codes whose histograms follow the caption's attributes) and the listen page."""
from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import pytest

from adapter_trainer.demo.listen_page import DEMO_NOTE, build_page
from adapter_trainer.evaluation.probe import NAMES, attribute_labels, make_report
from adapter_trainer.data.shards import Clip

C = 64
TEXTS = ("solo piano, slow, sad", "electric guitar, drums, fast, happy", "female vocal, calm, happy",
         "drums, techno, dark")


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
    codes = np.stack([rng.choice(np.concatenate([np.arange(8 * a, 8 * a + 8) for a in bands]), size=T)
                      for _ in range(4)], axis=1).astype(np.int16)  # [T, 4]
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
    assert good["accuracy_true_captions_ci95"][0] <= good["accuracy_true_captions"] <= good["accuracy_true_captions_ci95"][1]
    assert 0.3 < good["chance"] < 0.9 and good["accuracy_deranged_captions"] < good["accuracy_true_captions"]
    assert bad["true_minus_deranged_ci95"][0] < 0.05  # codes that ignore the caption: no clear gain over deranged
    assert bad["accuracy_true_captions"] < good["accuracy_true_captions"] - 0.15
    with pytest.raises(ValueError, match=">= 2 generated"):
        make_report(train, real_eval, follows[:1], C)


def fake_run(tmp_path: Path, demo: bool) -> Path:
    run = tmp_path / "run"
    (run / "generated").mkdir(parents=True)
    (run / "listen" / "generated").mkdir(parents=True)
    (run / "listen" / "reference").mkdir(parents=True)
    caps = [{"key": "gen-0000-abc", "caption": "a <loud> & fast song", "source_key": "abc", "n_frames": 250},
            {"key": "gen-0001-def", "caption": "calm piano", "source_key": "def", "n_frames": 100,
             "ended_with_audio_end": True}]
    (run / "generated" / "manifest.json").write_text(json.dumps({
        "codec": {"name_or_path": "build/demo/codec"},
        "generated": {"checkpoint": "ck/step-000300", "checkpoint_step": 300, "model": {"pattern": "delay"},
                      "sampling": {"temperature": 1.0, "top_k": 250, "top_p": 0.0, "cfg_scale": 3.0, "seed": 0,
                                   "seconds": 5.0}, "captions": caps}}))
    (run / "listen" / "generated" / "decoded.json").write_text(json.dumps({
        "demo_codec": demo, "sampling_rate": 32000, "clips": [{"key": c["key"], "wav": f"{c['key']}.wav"} for c in caps]}))
    (run / "listen" / "reference" / "decoded.json").write_text(json.dumps({
        "demo_codec": demo, "sampling_rate": 32000, "clips": [{"key": "abc", "wav": "abc.wav"}]}))
    (run / "loss_curve.png").write_bytes(b"\x89PNG fake")
    (run / "src").mkdir()
    (run / "src" / "def.wav").write_bytes(b"RIFF")
    return run


def test_listen_page_has_captions_players_curve_and_the_demo_note(tmp_path: Path) -> None:
    run = fake_run(tmp_path, demo=True)
    page = build_page(run, source_audio=run / "src").read_text()
    assert "a &lt;loud&gt; &amp; fast song" in page and "calm piano" in page  # escaped captions
    assert 'src="generated/gen-0000-abc.wav"' in page and 'src="reference/abc.wav"' in page
    assert 'src="../src/def.wav"' in page  # relative: works from file://
    assert page.count("<audio") == 4 and page.count("not available") == 2  # no decoded ref for def, no source for abc
    assert '<img src="loss_curve.png"' in page and (run / "listen" / "loss_curve.png").is_file()
    assert html.escape(DEMO_NOTE) in page and "stopped at AUDIO_END" in page
    assert "file:" not in page and str(tmp_path) not in page.split("<h1>", 1)[1].split("</h1>", 1)[1]
    other = fake_run(tmp_path / "real", demo=False)
    assert html.escape(DEMO_NOTE) not in build_page(other).read_text() and "RANDOM weights" not in build_page(other).read_text()
