"""build/bench/results.md's stage table names the clips a row measured by their recorded length, never a fixed one
(the demo corpus went from 10-s to 2.5-s clips and the table kept saying 10 s)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("run_benchmarks", REPO / "benchmarks" / "run_benchmarks.py")
run_benchmarks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_benchmarks)

ENCODE = {"stage": "encode", "device": "cpu", "dtype": "float32", "batch_size": 1, "clips": 8, "clips_per_s": 1.9,
          "x_realtime": 4.9, "peak_rss_mb": 1342.0}  # fmt: skip
PIPELINE = {"stage": "pipeline", "device": "cpu", "case": "pipeline", "batch_size": 1, "threads": 2, "clips": 32,
            "audio_s_per_s": 5.6, "peak_rss_mb": 2600.0}  # fmt: skip


def test_rows_say_the_clip_length_they_recorded() -> None:
    md = run_benchmarks.table([{**ENCODE, "clip_seconds": 2.5}, {**PIPELINE, "clip_seconds": 10.0}])
    assert "8 × 2.5-s clips" in md and "32 × 10-s clips" in md


def test_rows_without_a_recorded_length_claim_none() -> None:
    md = run_benchmarks.table([ENCODE, PIPELINE])
    assert "-s clips" not in md
    assert "| float32, batch 1, 8 clips |" in md and "32 clips |" in md


def test_encoding_rows_name_the_codec_they_measured(tmp_path: Path) -> None:
    """make bench encodes with encodec_32khz's width, not the narrow demo codec: each encoding row says which."""
    import json

    codec = tmp_path / "codec"
    codec.mkdir()
    (codec / "config.json").write_text(json.dumps({"num_filters": 64}))
    label = run_benchmarks.codec_label(codec)
    assert label == f"{codec} (EncodecModel, num_filters 64)"
    md = run_benchmarks.table([{**ENCODE, "codec": label}, PIPELINE])
    assert f"| float32, batch 1, 8 clips; codec {label} |" in md
    assert md.count("num_filters") == 1  # the pipeline row recorded no codec and claims none
    assert set(run_benchmarks.CODEC_SCRIPTS) <= {
        s for group in run_benchmarks.plan(_args()).values() for s, _, _ in group
    }


def _args():
    import argparse

    return argparse.Namespace(device="cpu", train_steps=1, encode_clips=1, pipeline_clips=1, byo_tracks=1,
                              byo_repeats=1, gpu_budget_s=None)  # fmt: skip
