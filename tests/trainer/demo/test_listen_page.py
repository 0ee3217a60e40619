"""The static listening page of a run: escaped captions, relative audio links, the loss curve, the demo note, the
probe's summary with its verdict at the top, per clip two mel spectrograms, the caption's vs the probe's attributes
and the CLAP score when audio_metrics.json exists; a run directory without generated/decoded files is a user error
(exit 2, no traceback)."""

from __future__ import annotations

import html
import json
import re
import wave
from pathlib import Path

import numpy as np

from adapter_trainer.demo.listen_page import DEMO_NOTE, build_page
from adapter_trainer.listen_page import main


def write_wav(path: Path, seconds: float = 0.2, rate: int = 32000) -> None:
    """A 16-bit PCM mono sine, as tokenizer_pipeline.decode writes them."""
    t = np.arange(int(seconds * rate)) / rate
    pcm = (0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


def fake_run(tmp_path: Path, demo: bool) -> Path:
    run = tmp_path / "run"
    (run / "generated").mkdir(parents=True)
    (run / "listen" / "generated").mkdir(parents=True)
    (run / "listen" / "reference").mkdir(parents=True)
    caps = [
        {"key": "gen-0000-abc", "caption": "a <loud> & fast song", "source_key": "abc", "n_frames": 250},
        {
            "key": "gen-0001-def",
            "caption": "calm piano",
            "source_key": "def",
            "n_frames": 100,
            "ended_with_audio_end": True,
        },
    ]
    (run / "generated" / "manifest.json").write_text(
        json.dumps(
            {
                "codec": {"name_or_path": "build/demo/codec"},
                "generated": {
                    "checkpoint": "ck/step-000300",
                    "checkpoint_step": 300,
                    "model": {"pattern": "delay"},
                    "sampling": {
                        "temperature": 1.0,
                        "top_k": 250,
                        "top_p": 0.0,
                        "cfg_scale": 3.0,
                        "seed": 0,
                        "seconds": 5.0,
                    },
                    "captions": caps,
                },
            }
        )
    )
    (run / "listen" / "generated" / "decoded.json").write_text(
        json.dumps(
            {
                "demo_codec": demo,
                "sampling_rate": 32000,
                "clips": [{"key": c["key"], "wav": f"{c['key']}.wav"} for c in caps],
            }
        )
    )
    (run / "listen" / "reference" / "decoded.json").write_text(
        json.dumps({"demo_codec": demo, "sampling_rate": 32000, "clips": [{"key": "abc", "wav": "abc.wav"}]})
    )
    for wav in ("generated/gen-0000-abc.wav", "generated/gen-0001-def.wav", "reference/abc.wav"):
        write_wav(run / "listen" / wav)
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
    assert page.count("<audio") == 4  # no decoded ref for def, no source for abc; no reference picture for def:
    assert page.count("not available") - page.count("spectrogram: not available") == 2
    assert '<img src="loss_curve.png"' in page and (run / "listen" / "loss_curve.png").is_file()
    assert html.escape(DEMO_NOTE) in page and "stopped at AUDIO_END" in page
    assert "file:" not in page and str(tmp_path) not in page.split("<h1>", 1)[1].split("</h1>", 1)[1]
    other = fake_run(tmp_path / "real", demo=False)
    assert (
        html.escape(DEMO_NOTE) not in build_page(other).read_text()
        and "RANDOM weights" not in build_page(other).read_text()
    )


def test_listen_page_without_generated_files_is_a_user_error(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "adapter_trainer.listen_page: error:" in err and "python -m adapter_trainer.generate" in err


ATTRS = ("drums", "fast", "minor", "piano", "guitar", "vocal")


def write_probe_report(run: Path) -> None:
    """A generation_report.json as adapter_trainer.probe writes it (hand-made figures)."""
    cap = {"drums": 0, "fast": 1, "minor": None, "piano": 0, "guitar": 0, "vocal": 0}
    pred = {"drums": 0, "fast": 0, "minor": 1, "piano": 0, "guitar": 0, "vocal": 1}
    report = {
        "n_clips": 2,
        "accuracy_true_captions": 0.6321,
        "accuracy_true_captions_ci95": [0.5751, 0.6861],
        "accuracy_deranged_captions": 0.5402,
        "true_minus_deranged": 0.0913,
        "true_minus_deranged_ci95": [0.0341, 0.1462],
        "verdict": "follows its captions",
        "probe_ceiling_real_eval": 0.7622,
        "probe_deranged_real_eval": 0.5381,
        "fraction_of_ceiling": 0.4071,
        "fraction_of_ceiling_ci95": [0.1702, 0.6693],
        "mde": 0.0811,
        "mde_fraction_of_ceiling": 0.3612,
        "mde_method": "2.8 x the standard error <of> the per-clip true - deranged",
        "per_clip": [
            {
                "key": "gen-0000-abc",
                "caption_attributes": cap,
                "predicted_attributes": pred,
                "accuracy_true": 0.6,
                "accuracy_deranged": 0.5,
            }
        ],
    }
    (run / "generation_report.json").write_text(json.dumps(report))


def clip_rows(page: str) -> list[str]:
    """The page's clip rows (the text from each `<tr class="clip">` to the next, the last one to the body's end)."""
    rows = page.split('<tr class="clip">')[1:]
    return [*rows[:-1], rows[-1].split("</body>")[0]] if rows else []


def test_listen_page_has_summary_spectrograms_and_attributes(tmp_path: Path) -> None:
    run = fake_run(tmp_path, demo=True)
    write_probe_report(run)
    page = build_page(run).read_text()
    listen = run / "listen"
    summary = page.split('<ul class="summary">', 1)[1].split("</ul>", 1)[0]  # before the clips
    assert "verdict: <b>follows its captions</b>" in summary
    assert "true − deranged +0.091 [+0.034, +0.146]" in summary
    assert "with own captions 0.632 [0.575, 0.686], with deranged captions (the null) 0.540" in summary
    assert "fraction of the probe's ceiling reached 0.41 [0.17, 0.67]" in summary
    assert "ceiling on real eval clips 0.762, deranged on them 0.538" in summary
    assert "minimum detectable effect at this clip count 0.081 (0.36 of the ceiling" in summary
    assert "&lt;of&gt;" in summary and "<of>" not in page  # report text is escaped
    assert "2 clips for eval captions, 5 s each, CFG 3, top-k 250, temperature 1, seed 0, checkpoint step 300" in (
        summary
    )
    assert "chance" not in page and "CLAP" not in page  # no audio_metrics.json: no CLAP anywhere
    rows = clip_rows(page)
    assert len(rows) == 2
    for row in rows:  # two spectrograms per clip: an image of each decoded wav, or a 'not available' line
        assert row.count('class="spec"') + row.count("spectrogram: not available") == 2
    for src in re.findall(r'<img class="spec" src="([^"]+)"', page):
        assert not src.startswith(("/", "file:")) and (listen / src).read_bytes()[:4] == b"\x89PNG", src
    assert 'src="spectrograms/generated/gen-0000-abc.png"' in rows[0]
    assert 'src="spectrograms/reference/abc.png"' in rows[0]
    assert 'src="spectrograms/generated/gen-0001-def.png"' in rows[1]
    assert "reference spectrogram: not available" in rows[1]  # def has no decoded reference
    # caption vs probe: fast said, slow read (differ); minor not said (undefined); vocal read but not said (differ)
    assert '<tr class="differ"><td>fast</td><td>fast</td><td>slow</td></tr>' in rows[0]
    assert '<tr class="undef"><td>minor</td><td>—</td><td>minor</td></tr>' in rows[0]
    assert '<tr class="agree"><td>drums</td><td>no drums</td><td>no drums</td></tr>' in rows[0]
    assert '<tr class="differ"><td>vocal</td><td>no vocal</td><td>vocal</td></tr>' in rows[0]
    assert "probe accuracy: own caption 0.60, deranged 0.50" in rows[0]
    assert 'class="attrs"' not in rows[1]  # the report has no entry for this clip


def test_listen_page_shows_clap_when_audio_metrics_exist(tmp_path: Path) -> None:
    run = fake_run(tmp_path, demo=False)
    metrics = {
        "clap_score": 0.2513,
        "clap_score_deranged": 0.2011,
        "fad_clap_clips": "<not computed>",
        "kl_classifier": None,
        "per_clip": [{"key": "gen-0001-def", "clap_score": 0.4321, "other": 1}],
    }
    (run / "audio_metrics.json").write_text(json.dumps(metrics))
    page = build_page(run).read_text()
    summary = page.split('<ul class="summary">', 1)[1].split("</ul>", 1)[0]
    assert (
        "clap_score 0.251; clap_score_deranged 0.201; fad_clap_clips &lt;not computed&gt;; kl_classifier n/a" in summary
    )
    rows = clip_rows(page)
    assert "CLAP score 0.432" in rows[1] and "CLAP" not in rows[0]
