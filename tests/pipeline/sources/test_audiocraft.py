"""source=audiocraft: an audiocraft manifest of full-length stereo 44.1 kHz tracks -> segment samples in shards."""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

import tokenizer_pipeline.run.pipeline as run
from tests.pipeline.sources.helpers import (
    audiocraft_line,
    failures,
    make_audiocraft,
    samples,
    snapshot,
    source_config,
    write_manifest,
    write_track,
)
from tokenizer_pipeline.config import SegmentConfig, SourceConfig, SplitConfig
from tokenizer_pipeline.decode import main as decode_main
from tokenizer_pipeline.errors import PipelineError
from tokenizer_pipeline.run.pipeline import RunStopped, run_pipeline
from tokenizer_pipeline.shards.verify import verify
from tokenizer_pipeline.shards.write_shards import sha256_file
from tokenizer_pipeline.sources.audiocraft import MUSIC_INFO_FIELDS

SIDECAR = {
    "title": "", "artist": "", "key": "C Major", "bpm": 120, "genre": "Rock", "moods": ["happy", "bright"],
    "keywords": "guitar, drums", "description": "an upbeat rock song", "name": "a", "instrument": "Guitar",
    "sample_rate": 44100, "file_extension": "wav", "duration": 30.0,
}  # fmt: skip
TRACKS = [
    {"name": "a.wav", "seconds": 30.0, "sidecar": SIDECAR, "weight": 2.5},
    {"name": "b c.wav", "seconds": 25.0, "sidecar": {"description": "a slow ballad", "genre": "", "bpm": None}},
    {"name": "d.wav", "seconds": 30.0, "sidecar": None},  # no metadata at all: no_caption
    {"name": "e.wav", "seconds": 30.0, "sidecar": {"description": "", "genre": "jazz", "key": "F minor"}},
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tiny_codec: Path) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("audiocraft")
    manifest = make_audiocraft(root / "src", TRACKS)
    out = root / "set"
    result = run_pipeline(source_config("audiocraft", manifest, out, tiny_codec, split=SplitConfig(eval_fraction=0.0)),
                          progress=False)  # fmt: skip
    assert result.exit_code == 0, result.message
    return manifest, out


def test_tracks_become_segments_with_their_sidecar_captions(built: tuple[Path, Path]) -> None:
    manifest, out = built
    got = samples(out)
    # 30 s -> 3 segments; 25 s -> 2 full + a 5-s tail < min_seconds (8 s) dropped; d and e: no caption
    assert sorted(got) == ["a_0", "a_1", "a_2", "b_c_0", "b_c_1"]
    a1 = got["a_1"]
    assert a1["caption"] == "an upbeat rock song"
    assert (a1["start_s"], a1["end_s"], a1["segment_start_s"], a1["segment_end_s"]) == (10.0, 20.0, 10.0, 20.0)
    assert a1["duration_s"] == pytest.approx(10.0, abs=1e-9) and a1["n_frames"] == 500  # 10 s x 50 Hz
    assert a1["weight"] == 2.5 and got["b_c_0"]["weight"] == 1.0  # null weight -> 1.0
    assert a1["metadata"] == {k: v for k, v in SIDECAR.items() if k in MUSIC_INFO_FIELDS}  # verbatim, MusicInfo only
    assert "sample_rate" not in a1["metadata"] and "file_extension" not in a1["metadata"]
    assert a1["aspect_list"] == ["guitar", "drums", "rock", "happy", "bright"]  # keywords, genre, moods, (instrument)
    assert (a1["source_kind"], a1["track_id"], a1["segment_index"], a1["source_path"]) == (
        "audiocraft",
        "a",
        1,
        str(manifest.parent / "a.wav"),
    )
    assert a1["source_file"] == "a.wav" and a1["csv_row"] == 1
    m = json.loads((out / "manifest.json").read_text())
    assert m["format_version"] == 5 and m["source"]["split_rule"] == "audio_sha256"
    assert m["source"]["kind"] == "audiocraft" and m["source"]["sha256"] == sha256_file(manifest)
    assert m["segmentation"] == {
        "seconds": 10.0, "hop_seconds": 10.0, "min_seconds": 8.0, "n_tracks": 4, "n_segments_planned": 5,
        "n_dropped_short": 1, "n_dropped_short_tracks": 0, "n_dropped_tails": 1, "n_track_failures": 2,
    }  # fmt: skip


def test_a_track_without_caption_is_a_no_caption_failure(built: tuple[Path, Path]) -> None:
    _, out = built
    f = failures(out)
    assert {k: v["reason"] for k, v in f.items()} == {"d": "no_caption", "e": "no_caption", "b_c_2": "short_tail"}
    assert not f["d"]["retryable"] and "d.wav" in f["d"]["detail"] and f["d"]["csv_row"] == 3


def test_the_set_verifies_and_decodes(built: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = built
    problems, summary = verify(out)
    assert problems == [] and "5 samples" in summary
    assert decode_main([str(out), f"out_dir={tmp_path / 'wav'}"]) == 0
    assert len(json.loads((tmp_path / "wav/decoded.json").read_text())["clips"]) == 5


def test_a_segment_encodes_like_the_same_window_cut_to_its_own_file(built: tuple[Path, Path], tiny_codec: Path,
                                                                    tmp_path: Path) -> None:  # fmt: skip
    """Windowed reading (a seek) gives the codes of the window read whole: segment a_1 == a file holding only it."""
    import soundfile as sf

    manifest, out = built
    data, sr = sf.read(manifest.parent / "a.wav", dtype="int16")  # [N, 2]
    sf.write(tmp_path / "src/cut.wav", data[10 * sr : 20 * sr], sr, subtype="PCM_16") if (
        tmp_path / "src"
    ).mkdir() is None else None
    cut = write_manifest(tmp_path / "src/data.jsonl", [audiocraft_line(str(tmp_path / "src/cut.wav"), 10.0)])
    (tmp_path / "src/cut.json").write_text(json.dumps({"description": "x"}))
    run_pipeline(source_config("audiocraft", cut, tmp_path / "set", tiny_codec, split=SplitConfig(eval_fraction=0.0)),
                 progress=False)  # fmt: skip
    import tarfile

    def codes(set_dir: Path, key: str) -> np.ndarray:
        import io

        for p in sorted(set_dir.rglob("*.tar")):
            with tarfile.open(p) as tar:
                for m in tar:
                    if m.name == f"{key}.codes.npy":
                        return np.load(io.BytesIO(tar.extractfile(m).read()))  # type: ignore[union-attr]
        raise KeyError(key)

    assert np.array_equal(codes(out, "a_1"), codes(tmp_path / "set", "cut_0"))


def test_template_captions_drop_missing_fields_with_their_labels(tmp_path: Path, tiny_codec: Path) -> None:
    manifest = make_audiocraft(tmp_path / "src", TRACKS[:2] + TRACKS[3:])
    src = SourceConfig(kind="audiocraft", manifest=str(manifest), caption="template")
    cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, source=src,
                        segment=SegmentConfig(seconds=15.0))  # fmt: skip
    assert run_pipeline(cfg, progress=False).exit_code == 0
    caps = {k: v["caption"] for k, v in samples(tmp_path / "set").items()}
    assert caps["a_0"] == "an upbeat rock song genre: rock. bpm: 120. key: c major"
    assert caps["b_c_0"] == "a slow ballad"  # empty genre and null bpm dropped with "genre: " / ". bpm: "
    assert caps["e_0"] == "genre: jazz. key: f minor"  # no description: the leading label text starts the caption


def test_no_track_leaks_across_splits_and_the_split_is_the_audio_hash(tmp_path: Path, tiny_codec: Path) -> None:
    from tokenizer_pipeline.sources.splits import audio_is_eval

    tracks = [{"name": f"t{i}.wav", "seconds": 3.0, "sidecar": {"description": f"song {i}"}, "channels": 1,
               "sr": 16000} for i in range(12)]  # fmt: skip
    manifest = make_audiocraft(tmp_path / "src", tracks)
    cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SegmentConfig(seconds=1.0),
                        split=SplitConfig(eval_fraction=0.5))  # fmt: skip
    assert run_pipeline(cfg, progress=False).exit_code == 0
    got = samples(tmp_path / "set")
    assert len(got) == 36
    by_track: dict[str, set[str]] = {}
    for s in got.values():
        by_track.setdefault(s["track_id"], set()).add(s["split"])
    assert all(len(v) == 1 for v in by_track.values())  # every segment of a track in one split
    assert {next(iter(v)) for v in by_track.values()} == {"train", "eval"}  # both used at this size
    assert all((s["split"] == "eval") == audio_is_eval(s["source_sha256"], 0.5) for s in got.values())


def test_gzipped_manifest_gives_the_same_samples(tmp_path: Path, tiny_codec: Path, built: tuple[Path, Path]) -> None:
    _, out = built
    manifest = make_audiocraft(tmp_path / "src", TRACKS, gz=True)
    assert manifest.name == "data.jsonl.gz"
    cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, split=SplitConfig(eval_fraction=0.0))
    assert run_pipeline(cfg, progress=False).exit_code == 0
    assert {k: v | {"source_sha256": None, "source_path": None} for k, v in samples(tmp_path / "set").items()} == {
        k: v | {"source_sha256": None, "source_path": None} for k, v in samples(out).items()
    }  # fmt: skip


def test_the_header_wins_over_the_manifest_duration(tmp_path: Path, tiny_codec: Path) -> None:
    manifest = make_audiocraft(tmp_path / "src", [{"name": "a.wav", "seconds": 20.0, "declared": 95.0,
                                                   "sidecar": {"description": "x"}}])  # fmt: skip
    cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, split=SplitConfig(eval_fraction=0.0))
    assert run_pipeline(cfg, progress=False).exit_code == 0
    assert sorted(samples(tmp_path / "set")) == ["a_0", "a_1"]
    assert json.loads((tmp_path / "set/manifest.json").read_text())["source"]["n_duration_disagreements"] == 1


def test_resume_after_an_interruption_matches_a_fresh_run(tmp_path: Path, tiny_codec: Path, monkeypatch) -> None:
    manifest = make_audiocraft(tmp_path / "src", TRACKS)
    cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, split=SplitConfig(eval_fraction=0.0))
    assert run_pipeline(cfg, progress=False).exit_code == 0
    fresh = snapshot(tmp_path / "set")
    shutil.rmtree(tmp_path / "set")

    real, calls = run.encode_shard, []

    def dies_on_the_second_shard(plan, *a, **k):
        calls.append(plan.relpath)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the process is stopped mid-run
        return real(plan, *a, **k)

    monkeypatch.setattr(run, "encode_shard", dies_on_the_second_shard)
    with pytest.raises(RunStopped):  # the run's Ctrl-C: finished shards kept, counted for the stop line
        run_pipeline(cfg, progress=False)
    assert not (tmp_path / "set/manifest.json").exists()
    calls.clear()
    monkeypatch.setattr(run, "encode_shard", lambda plan, *a, **k: (calls.append(plan.relpath), real(plan, *a, **k))[1])
    assert run_pipeline(cfg, progress=False).exit_code == 0
    assert calls[0] == "train/shard-000001.tar" and "train/shard-000000.tar" not in calls  # shard 0 kept
    assert snapshot(tmp_path / "set") == fresh

    # a changed sidecar redoes exactly the shards of that track's segments
    sidecar = manifest.parent / "b c.json"
    sidecar.write_text(json.dumps({"description": "a different caption"}))
    calls.clear()
    assert run_pipeline(cfg, progress=False).exit_code == 0
    keys = {k for k, v in samples(tmp_path / "set").items() if v["caption"] == "a different caption"}
    assert keys == {"b_c_0", "b_c_1"}
    assert calls == ["train/shard-000001.tar", "train/shard-000002.tar"]  # a_2 + b_c_0, b_c_1 + d (failure)


def test_relative_paths_resolve_against_the_launch_directory_as_audiocraft_does(
    tmp_path: Path, tiny_codec: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """audiocraft 1.3.0 resolves a relative `path` against the directory it is launched from (audio_dataset.
    _resolve_audio_meta -> dora.git_save.to_absolute_path: `Path(os.getcwd()) / path`; without dora, open() does the
    same), '..' included: never against the manifest's folder."""
    write_track(tmp_path / "outside.wav", 2.0)
    (tmp_path / "outside.json").write_text(json.dumps({"description": "up one"}))
    manifest = write_manifest(tmp_path / "egs/data.jsonl", [audiocraft_line("../outside.wav", 2.0)])
    monkeypatch.chdir(tmp_path / "egs")  # '../outside.wav' from here is tmp_path/outside.wav
    cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, segment=SegmentConfig(seconds=1.0))
    assert run_pipeline(cfg, progress=False).exit_code == 0
    got = samples(tmp_path / "set")
    assert sorted(got) == ["outside_0", "outside_1"] and got["outside_0"]["caption"] == "up one"
    assert got["outside_0"]["source_path"] == "../outside.wav"


def test_absolute_paths_are_read_as_audiocraft_writes_them(tmp_path: Path, tiny_codec: Path) -> None:
    audio = write_track(tmp_path / "music/x y.wav", 12.0)
    (tmp_path / "music/x y.json").write_text(json.dumps({"description": "abs"}))
    manifest = write_manifest(tmp_path / "egs/data.jsonl", [audiocraft_line(str(audio.resolve()), 12.0)])
    cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, split=SplitConfig(eval_fraction=0.0))
    assert run_pipeline(cfg, progress=False).exit_code == 0
    ((key, s),) = samples(tmp_path / "set").items()
    assert s["source_path"] == str(audio.resolve()) and s["caption"] == "abs" and key == "x_y_0"  # the common root
    assert s["source_file"] == "x y.wav"


@pytest.mark.parametrize(
    "line, match",
    [
        ("not json", "data.jsonl:2: not a JSON object"),
        ('{"duration": 3}', "data.jsonl:2: 'path' is missing"),
        ('{"path": "a.wav", "weight": 0}', r"data.jsonl:2: 'weight'=0 must be > 0"),
        ('{"path": "a.wav", "weight": NaN}', "data.jsonl:2: "),
    ],
)
def test_a_malformed_line_is_refused_naming_it(tmp_path: Path, tiny_codec: Path, line: str, match: str) -> None:
    write_track(tmp_path / "egs/a.wav", 2.0)
    (tmp_path / "egs/data.jsonl").write_text(json.dumps(audiocraft_line("a.wav", 2.0)) + "\n" + line + "\n")
    with pytest.raises(PipelineError, match=match):
        run_pipeline(source_config("audiocraft", tmp_path / "egs/data.jsonl", tmp_path / "set", tiny_codec),
                     progress=False)  # fmt: skip


def test_a_missing_audio_file_is_a_retryable_track_failure_healed_on_rerun(tmp_path: Path, tiny_codec: Path) -> None:
    manifest = make_audiocraft(tmp_path / "src", TRACKS[:2])
    cfg = source_config("audiocraft", manifest, tmp_path / "set", tiny_codec, split=SplitConfig(eval_fraction=0.0))
    assert run_pipeline(cfg, progress=False).exit_code == 0
    fresh = snapshot(tmp_path / "set")
    shutil.rmtree(tmp_path / "set")
    stash = shutil.move(manifest.parent / "a.wav", tmp_path / "a.wav")
    assert run_pipeline(cfg, progress=False).exit_code == 0
    assert failures(tmp_path / "set")["a"]["reason"] == "missing_audio" and failures(tmp_path / "set")["a"]["retryable"]
    shutil.move(stash, manifest.parent / "a.wav")
    assert run_pipeline(cfg, progress=False).exit_code == 0
    assert snapshot(tmp_path / "set") == fresh


def test_info_path_is_never_read_the_sidecar_is_as_in_audiocraft(tmp_path: Path) -> None:
    """audiocraft's MusicDataset reads `Path(meta.path).with_suffix('.json')` and never `info_path` (music_dataset.py,
    MusicDataset.__getitem__); a plain JSON info_path (here a creds.json) must not leak into any shard."""
    from tokenizer_pipeline.sources.audiocraft import read_audiocraft

    for name in ("a.wav", "b.wav"):
        write_track(tmp_path / name, 0.1)
        (tmp_path / name).with_suffix(".json").write_text(json.dumps({"description": "sidecar", "token": "s3cret"}))
    (tmp_path / "creds.json").write_text(json.dumps({"description": "leak", "aws_secret": "s3cret"}))
    with zipfile.ZipFile(tmp_path / "info.zip", "w") as zf:
        zf.writestr("meta/a.json", json.dumps({"description": "from the zip"}))
    lines = [audiocraft_line(str(tmp_path / "a.wav"), 0.1) | {"info_path": f"{tmp_path}/info.zip:meta/a.json"},
             audiocraft_line(str(tmp_path / "b.wav"), 0.1) | {"info_path": str(tmp_path / "creds.json")}]  # fmt: skip
    tracks = read_audiocraft(write_manifest(tmp_path / "data.jsonl", lines))
    assert [t.metadata for t in tracks] == [{"description": "sidecar"}] * 2  # MusicInfo fields only: no "token"
    assert [t.metadata_file for t in tracks] == ["a.json", "b.json"]


@pytest.mark.parametrize(
    "sidecar, detail",
    [
        ('{"description": "a song", "bpm": NaN}', r"has NaN.*null"),
        ('{"description": "a song", "bpm": Infinity}', r"has Infinity.*null"),
        ('{"description": "a song", ', r"is not UTF-8 JSON"),
        ('["a song"]', r"is not a JSON object"),
        ("\ufeff" + '{"description": "a song"}', r"is not UTF-8 JSON"),
    ],
)
def test_a_bad_sidecar_is_that_tracks_failure_and_the_others_encode(
    tmp_path: Path, tiny_codec: Path, sidecar: str, detail: str
) -> None:
    """One track's unusable metadata file (NaN from Python's json.dump, a truncated file, a BOM) is that track's
    final `bad_metadata` failure naming the file and the fix; it used to stop the whole run before anything was
    encoded."""
    manifest = make_audiocraft(
        tmp_path / "src",
        [{"name": "good.wav", "seconds": 2.0, "sidecar": {"description": "fine"}}, {"name": "bad.wav", "seconds": 2.0}],
    )
    (manifest.parent / "bad.json").write_text(sidecar, encoding="utf-8")
    out = tmp_path / "set"
    cfg = source_config("audiocraft", manifest, out, tiny_codec, segment=SegmentConfig(seconds=1.0))
    run_pipeline(cfg, progress=False)
    got = samples(out)
    assert sorted(got) == ["good_0", "good_1"]
    fails = failures(out)
    assert sorted(fails) == ["bad"]
    f = fails["bad"]
    assert f["reason"] == "bad_metadata" and f["retryable"] is False and f["csv_row"] == 2
    assert re.search(detail, f["detail"]) and "bad.json" in f["detail"], f["detail"]


def test_a_fixed_sidecar_heals_on_rerun(tmp_path: Path, tiny_codec: Path) -> None:
    """The bad_metadata failure's fix ('fix or delete it and rerun the same command') holds: the rerun encodes the
    track and keeps the others."""
    manifest = make_audiocraft(
        tmp_path / "src",
        [{"name": "good.wav", "seconds": 2.0, "sidecar": {"description": "fine"}}, {"name": "bad.wav", "seconds": 2.0}],
    )
    (manifest.parent / "bad.json").write_text('{"description": ', encoding="utf-8")
    out = tmp_path / "set"
    cfg = source_config("audiocraft", manifest, out, tiny_codec, segment=SegmentConfig(seconds=1.0))
    run_pipeline(cfg, progress=False)
    assert list(failures(out)) == ["bad"]
    (manifest.parent / "bad.json").write_text('{"description": "now fine"}', encoding="utf-8")
    run_pipeline(cfg, progress=False)
    assert sorted(samples(out)) == ["bad_0", "bad_1", "good_0", "good_1"] and failures(out) == {}
    assert samples(out)["bad_0"]["caption"] == "now fine"


def test_tracks_all_shorter_than_a_segment_are_refused_naming_the_setting(tmp_path: Path, tiny_codec: Path) -> None:
    """5-s loops with the default 10-s segments: every track is dropped short. That used to end with 'nothing could be
    encoded: 0 of 0 rows failed, see failures.jsonl' (an empty file) and exit 1; now one line before out_dir exists."""
    manifest = make_audiocraft(
        tmp_path / "src", [{"name": "loop.wav", "seconds": 5.0, "sidecar": {"description": "x"}}]
    )
    with pytest.raises(
        PipelineError, match=r"data.jsonl: none of its 1 track.* segment.min_seconds=8.0.*segment.seconds"
    ):
        run_pipeline(source_config("audiocraft", manifest, tmp_path / "set", tiny_codec), progress=False)
    assert not (tmp_path / "set").exists()


def test_audiocraft_example_paths_relative_to_the_launch_dir_are_read_from_there(
    tmp_path: Path, tiny_codec: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """audiocraft's own egs/example/data.jsonl names 'dataset/example/x.mp3', relative to the directory audiocraft is
    launched from: launched from there, every track is read (none is reported missing). Launched from elsewhere the
    file is a retryable missing_audio failure that says where it was looked for and what to do."""
    write_track(tmp_path / "dataset/example/electro_1.wav", 2.0)
    (tmp_path / "dataset/example/electro_1.json").write_text(json.dumps({"description": "electro"}))
    write_manifest(tmp_path / "egs/example/data.jsonl", [audiocraft_line("dataset/example/electro_1.wav", 2.0)])
    monkeypatch.chdir(tmp_path)
    cfg = source_config("audiocraft", Path("egs/example/data.jsonl"), tmp_path / "set", tiny_codec,
                        segment=SegmentConfig(seconds=1.0))  # fmt: skip
    assert run_pipeline(cfg, progress=False).exit_code == 0
    assert sorted(samples(tmp_path / "set")) == ["electro-1_0", "electro-1_1"]
    monkeypatch.chdir(tmp_path / "egs")
    cfg = source_config("audiocraft", tmp_path / "egs/example/data.jsonl", tmp_path / "other", tiny_codec,
                        segment=SegmentConfig(seconds=1.0))  # fmt: skip
    run_pipeline(cfg, progress=False)
    (f,) = failures(tmp_path / "other").values()
    assert f["reason"] == "missing_audio" and f["retryable"], f
    assert "directory you launch from" in f["detail"] and str(tmp_path / "egs") in f["detail"], f["detail"]


def test_a_track_re_exported_shorter_leaves_no_stale_shard(tmp_path: Path, tiny_codec: Path) -> None:
    """The manifest is unchanged but a track now has fewer segments, so the split has fewer shards: the rerun must
    equal a fresh run, without the old last shard (its samples are segments that no longer exist) in out_dir."""
    tracks = [{"name": f"t{i}.wav", "seconds": 4.0, "sidecar": {"description": f"song {i}"}, "channels": 1,
               "sr": 16000} for i in range(2)]  # fmt: skip
    manifest = make_audiocraft(tmp_path / "src", tracks)

    def cfg(out: str):
        return source_config("audiocraft", manifest, tmp_path / out, tiny_codec, segment=SegmentConfig(seconds=1.0),
                             split=SplitConfig(eval_fraction=0.0))  # fmt: skip

    assert run_pipeline(cfg("set"), progress=False).exit_code == 0
    assert (tmp_path / "set/train/shard-000003.tar").is_file()
    write_track(manifest.parent / "t1.wav", 1.0, 16000, 1, seed=1)  # 4 segments -> 1
    assert run_pipeline(cfg("set"), progress=False).exit_code == 0
    assert run_pipeline(cfg("fresh"), progress=False).exit_code == 0
    got, fresh = snapshot(tmp_path / "set"), snapshot(tmp_path / "fresh")
    assert sorted(got) == sorted(fresh)
    assert all(got[k] == fresh[k] for k in fresh if k.endswith(".tar"))
    assert sorted(p.name for p in (tmp_path / "set/.progress").iterdir()) == sorted(
        p.name for p in (tmp_path / "fresh/.progress").iterdir()
    )


def test_one_file_named_absolute_and_relative_is_that_lines_duplicate_failure(
    tmp_path: Path, tiny_codec: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest concatenated from two (one with absolute paths) names a file twice: the first line is encoded, the
    repeat is its own duplicate_audio failure naming line 1 (it used to stop the whole run)."""
    write_track(tmp_path / "egs/a.wav", 2.0)
    (tmp_path / "egs/a.json").write_text(json.dumps({"description": "x"}))
    lines = [audiocraft_line("egs/a.wav", 2.0), audiocraft_line(str(tmp_path / "egs/a.wav"), 2.0)]
    write_manifest(tmp_path / "egs/data.jsonl", lines)
    monkeypatch.chdir(tmp_path)  # source.manifest=egs/data.jsonl, relative, as typed on the command line
    cfg = source_config("audiocraft", Path("egs/data.jsonl"), tmp_path / "set", tiny_codec,
                        segment=SegmentConfig(seconds=1.0))  # fmt: skip
    assert run_pipeline(cfg, progress=False).exit_code == 0
    assert sorted(samples(tmp_path / "set")) == ["a_0", "a_1"]
    (f,) = failures(tmp_path / "set").values()
    assert f["reason"] == "duplicate_audio" and f["csv_row"] == 2 and "line 1" in f["detail"], f
