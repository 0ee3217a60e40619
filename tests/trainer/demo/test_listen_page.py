"""The static listening page of a run: escaped captions, relative audio links, the loss curve, the demo note;
a run directory without generated/decoded files is a user error (exit 2, no traceback)."""

from __future__ import annotations

import html
import json
from pathlib import Path

from adapter_trainer.demo.listen_page import DEMO_NOTE, build_page, main


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
    assert (
        html.escape(DEMO_NOTE) not in build_page(other).read_text()
        and "RANDOM weights" not in build_page(other).read_text()
    )


def test_listen_page_without_generated_files_is_a_user_error(tmp_path: Path, capsys) -> None:
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "adapter_trainer.listen_page: error:" in err and "python -m adapter_trainer.generate" in err
