"""Your own audio, end to end as a user runs it: an audiocraft manifest of 30-s stereo 44.1 kHz tracks and a MusicCaps
set -> two shard sets (`python -m tokenizer_pipeline`, each its own process) -> a few trainer steps on a weighted
mixture of the two (`python -m adapter_trainer`, another process), with the held-out CE reported per set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO
from tests.pipeline.helpers import make_corpus, make_tiny_codec
from tests.pipeline.sources.helpers import make_audiocraft, samples
from tests.trainer.helpers import tiny_demo_overrides

TRACK_S = 30.0  # full-length tracks, cut into 10-s segments by the pipeline
SIDECARS = [
    {"description": "a calm solo piano piece", "genre": "classical", "bpm": 70},
    {"description": "fast electronic dance music with a heavy kick", "genre": "edm", "bpm": 128},
    {"description": "a distorted rock guitar riff over loud drums", "genre": "rock", "bpm": 140},
]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ADAPTER_TRAINER_CONF_DIR"}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=600, env=env)


def test_audiocraft_tracks_and_musiccaps_train_as_a_weighted_mixture(models, tmp_path: Path) -> None:
    # the demo MusicGen has 2048-code codebooks, so both sets are encoded by a tiny codec of that size
    codec = make_tiny_codec(tmp_path / "codec", codebook_size=2048)
    common = [f"codec.name_or_path={codec}", "codec.device=cpu", "shard.max_samples=4"]

    csv_path, audio_dir, _ = make_corpus(tmp_path / "mc", n_train=6, n_eval=3, seconds=1.0)
    mc = tmp_path / "musiccaps_set"
    p = _run(["-m", "tokenizer_pipeline", f"csv={csv_path}", f"audio_dir={audio_dir}", f"out_dir={mc}",
              "min_seconds=0.5", *common])  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]

    tracks = [{"name": f"album/piece{i}.wav", "seconds": TRACK_S, "sidecar": s} for i, s in enumerate(SIDECARS)]
    manifest = make_audiocraft(tmp_path / "mine", tracks)
    byo = tmp_path / "own_set"
    # eval_fraction 0.8 so both splits hold a track with these 3 tracks (the split is by the sha256 of the audio file:
    # piece0 draws 0.78, piece1 0.95, piece2 0.89)
    p = _run(["-m", "tokenizer_pipeline", "source=audiocraft", f"source.manifest={manifest}", f"out_dir={byo}",
              "split.eval_fraction=0.8", *common])  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]

    got = samples(byo)
    assert len(got) == 3 * int(TRACK_S // 10)  # three 10-s segments per 30-s track, none dropped
    by_track: dict[str, set[str]] = {}
    for key, s in got.items():
        assert key == f"{s['track_id']}_{s['segment_index']}" and s["source_kind"] == "audiocraft"
        assert s["caption"] == SIDECARS[int(Path(s["source_path"]).stem[-1])]["description"]  # from the sidecar
        assert s["segment_end_s"] - s["segment_start_s"] == pytest.approx(10.0)
        by_track.setdefault(s["track_id"], set()).add(s["split"])
    assert all(len(splits) == 1 for splits in by_track.values()), by_track  # no track in both splits
    m = json.loads((byo / "manifest.json").read_text())
    assert m["format_version"] == 4 and m["source"]["kind"] == "audiocraft"
    if not {"train", "eval"} <= {s for v in by_track.values() for s in v}:
        pytest.fail(f"the hash split put every track in one split: {by_track}; pick another split.eval_fraction")

    out = tmp_path / "run"
    shards = f"data.shards=[{{path: {mc}, weight: 1}}, {{path: {byo}, weight: 3}}]"
    p = _run(["-m", "adapter_trainer", *tiny_demo_overrides(models, mc, out, "trainer.max_steps=3",
              "trainer.eval_bootstrap=50", "data.max_seq_len=64"), shards])  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    final = json.loads((out / "final_metrics.json").read_text())
    per_set = final["learning_check"]["per_shard_set"]
    assert set(per_set) == {str(mc), str(byo)}, per_set
    for name, r in per_set.items():
        assert r["n_clips"] > 0 and r["ce"] > 0, (name, r)
    assert len(final["learning_check"]["per_shard_set"]) == 2
