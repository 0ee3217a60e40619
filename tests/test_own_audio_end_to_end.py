"""Your own audio, end to end: an audiocraft manifest of 30-s stereo 44.1 kHz tracks and a MusicCaps set -> two shard
sets -> a few trainer steps on a weighted mixture of the two, with the held-out CE reported per set.

Each step is composed from the overrides a user types (Hydra, as `python -m tokenizer_pipeline` and `python -m
adapter_trainer` compose them) and run in this process: the commands themselves, their exit codes and output, are
tests/pipeline/test_cli.py's (MusicCaps), tests/pipeline/run/test_run_torchrun.py's (audiocraft) and
tests/trainer/training/test_mixture_training.py's (a weighted mixture); three process starts cost more than the runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.pipeline.helpers import make_corpus, make_tiny_codec
from tests.pipeline.sources.helpers import make_audiocraft, samples
from tests.trainer.helpers import tiny_demo_overrides
from tokenizer_pipeline.__main__ import config_from_overrides
from tokenizer_pipeline.run.pipeline import run_pipeline

TRACK_S = 30.0  # full-length tracks, cut into 10-s segments by the pipeline
SIDECARS = [
    {"description": "a calm solo piano piece", "genre": "classical", "bpm": 70},
    {"description": "fast electronic dance music with a heavy kick", "genre": "edm", "bpm": 128},
    {"description": "a distorted rock guitar riff over loud drums", "genre": "rock", "bpm": 140},
]


def _shards(overrides: list[str]) -> None:
    """`python -m tokenizer_pipeline <overrides>`, in this process."""
    result = run_pipeline(config_from_overrides(overrides), progress=False)
    assert result.exit_code == 0, result.message


def _train(overrides: list[str]) -> None:
    """`python -m adapter_trainer <overrides>`, in this process (the repository's conf/adapter_trainer)."""
    from hydra import compose, initialize_config_dir

    from adapter_trainer.config import to_train_config
    from adapter_trainer.hydra_cli import find_conf_dir
    from adapter_trainer.training.recipe import recipe_main

    with initialize_config_dir(str(find_conf_dir()), version_base="1.3"):
        recipe_main(to_train_config(compose("config", overrides=overrides)))


def test_audiocraft_tracks_and_musiccaps_train_as_a_weighted_mixture(
    models, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ADAPTER_TRAINER_CONF_DIR", raising=False)
    # the demo MusicGen has 2048-code codebooks, so both sets are encoded by a tiny codec of that size
    codec = make_tiny_codec(tmp_path / "codec", codebook_size=2048)
    common = [f"codec.name_or_path={codec}", "codec.device=cpu", "shard.max_samples=4"]

    csv_path, audio_dir, _ = make_corpus(tmp_path / "mc", n_train=6, n_eval=3, seconds=1.0)
    mc = tmp_path / "musiccaps_set"
    _shards([f"csv={csv_path}", f"audio_dir={audio_dir}", f"out_dir={mc}", "min_seconds=0.5", *common])

    tracks = [{"name": f"album/piece{i}.wav", "seconds": TRACK_S, "sidecar": s} for i, s in enumerate(SIDECARS)]
    manifest = make_audiocraft(tmp_path / "mine", tracks)
    byo = tmp_path / "own_set"
    # eval_fraction 0.8 so both splits hold a track with these 3 tracks (the split is by the sha256 of the audio file:
    # piece0 draws 0.78, piece1 0.95, piece2 0.89)
    _shards(["source=audiocraft", f"source.manifest={manifest}", f"out_dir={byo}", "split.eval_fraction=0.8", *common])

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
    assert m["format_version"] == 5 and m["source"]["kind"] == "audiocraft"
    if not {"train", "eval"} <= {s for v in by_track.values() for s in v}:
        pytest.fail(f"the hash split put every track in one split: {by_track}; pick another split.eval_fraction")

    out = tmp_path / "run"
    shards = f"data.shards=[{{path: {mc}, weight: 1}}, {{path: {byo}, weight: 3}}]"
    _train([*tiny_demo_overrides(models, mc, out, "trainer.max_steps=3", "trainer.eval_bootstrap=50",
                                 "data.max_seq_len=64"), shards])  # fmt: skip
    final = json.loads((out / "final_metrics.json").read_text())
    per_set = final["learning_check"]["per_shard_set"]
    assert set(per_set) == {str(mc), str(byo)}, per_set
    for name, r in per_set.items():
        assert r["n_clips"] > 0 and r["ce"] > 0, (name, r)
    assert len(final["learning_check"]["per_shard_set"]) == 2
