"""End to end in tmp_path: generated wavs -> shards; determinism, resume, config changes, failures, verify."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import tokenizer_pipeline.run.pipeline as run
from tests.pipeline.helpers import pipeline_config
from tokenizer_pipeline.config import ShardConfig
from tokenizer_pipeline.errors import PipelineError
from tokenizer_pipeline.run.pipeline import RunStopped, run_pipeline
from tokenizer_pipeline.shards.manifest import Manifest
from tokenizer_pipeline.shards.verify import verify


def _snapshot(d: Path) -> dict[str, bytes]:
    """Every shard-set file (not the run's own state: .progress/ and the .lock file) by relative path."""
    return {
        p.relative_to(d).as_posix(): p.read_bytes()
        for p in sorted(d.rglob("*"))
        if p.is_file() and ".progress" not in p.parts and p.name != ".lock"
    }


def test_shard_layout_and_manifest(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, rows = corpus
    out = tmp_path / "out"
    res = run_pipeline(pipeline_config(csv_path, audio_dir, out, tiny_codec), progress=False)
    assert res.exit_code == 0
    # 4 train + 3 eval rows, 2 per shard, CSV order within each split
    assert sorted(_snapshot(out)) == [
        "eval/index.safetensors", "eval/shard-000000.tar", "eval/shard-000001.tar", "failures.jsonl", "manifest.json",
        "train/index.safetensors", "train/shard-000000.tar", "train/shard-000001.tar",
    ]  # fmt: skip
    m = Manifest.from_json((out / "manifest.json").read_text())
    assert [e.n_samples for e in m.splits["train"].shards] == [2, 2]
    assert [e.n_samples for e in m.splits["eval"].shards] == [2, 1]
    assert m.totals == {
        "rows": 7,
        "encoded": 7,
        "failed": 0,
        "audio_seconds": m.totals["audio_seconds"],
        "n_frames": 350,
    }
    assert m.codec.n_codebooks == 4 and m.codec.codebook_size == 64 and m.codec.weights_sha256
    assert m.config["shard"]["max_samples"] == 2 and m.source["csv"] == str(csv_path)
    assert (out / "failures.jsonl").read_text() == ""
    assert verify(out)[0] == []


def test_two_runs_are_byte_identical(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, _ = corpus
    out = tmp_path / "out"
    cfg = pipeline_config(csv_path, audio_dir, out, tiny_codec)
    run_pipeline(cfg, progress=False)
    first = _snapshot(out)
    shutil.rmtree(out)
    run_pipeline(cfg, progress=False)
    assert _snapshot(out) == first


def test_resume_after_interruption_is_byte_identical(corpus, tiny_codec: Path, tmp_path: Path, monkeypatch) -> None:
    csv_path, audio_dir, _ = corpus
    out = tmp_path / "out"
    cfg = pipeline_config(csv_path, audio_dir, out, tiny_codec)
    run_pipeline(cfg, progress=False)
    reference = _snapshot(out)
    shutil.rmtree(out)

    real_encode_shard = run.encode_shard
    calls = []

    def crash_on_third(plan, *args, **kwargs):
        calls.append(plan.relpath)
        if len(calls) == 3:
            raise KeyboardInterrupt("simulated interruption")
        return real_encode_shard(plan, *args, **kwargs)

    monkeypatch.setattr(run, "encode_shard", crash_on_third)
    with pytest.raises(RunStopped):  # the run's Ctrl-C: finished shards kept, counted for the stop line
        run_pipeline(cfg, progress=False)
    assert not (out / "manifest.json").exists()  # incomplete set
    assert (out / "train/shard-000001.tar").exists() and not (out / "eval/shard-000000.tar").exists()

    calls.clear()
    monkeypatch.setattr(
        run, "encode_shard", lambda plan, *a, **k: (calls.append(plan.relpath), real_encode_shard(plan, *a, **k))[1]
    )
    run_pipeline(cfg, progress=False)
    assert calls == ["eval/shard-000000.tar", "eval/shard-000001.tar"]  # completed shards were skipped
    assert _snapshot(out) == reference

    # a shard damaged after the fact (sha256 no longer matches its record) is redone, nothing else
    tar = out / "train/shard-000000.tar"
    tar.write_bytes(tar.read_bytes()[:1000])
    calls.clear()
    run_pipeline(cfg, progress=False)
    assert calls == ["train/shard-000000.tar"]
    assert _snapshot(out) == reference


def test_changed_config_refuses_then_overwrite_clears(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, _ = corpus
    out = tmp_path / "out"
    cfg = pipeline_config(csv_path, audio_dir, out, tiny_codec)
    run_pipeline(cfg, progress=False)
    changed = replace(cfg, shard=ShardConfig(max_samples=3))
    with pytest.raises(PipelineError, match="overwrite=true") as ei:
        run_pipeline(changed, progress=False)
    assert "max_samples" in str(ei.value)
    assert (out / "eval/shard-000001.tar").exists()  # nothing was touched
    run_pipeline(replace(changed, overwrite=True), progress=False)
    assert not (out / "eval/shard-000001.tar").exists()  # stale shard from the old plan removed
    assert sorted(p.name for p in (out / "train").iterdir()) == [
        "index.safetensors",
        "shard-000000.tar",
        "shard-000001.tar",
    ]
    assert verify(out)[0] == []
    # a non-empty directory that this pipeline did not write is refused too
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(PipelineError, match="overwrite=true"):
        run_pipeline(replace(cfg, out_dir=str(foreign)), progress=False)


def test_failures_are_recorded_and_counted(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, rows = corpus
    ids = [r["ytid"] for r in rows]
    (audio_dir / f"{ids[0]}.wav").unlink()  # missing
    sf.write(audio_dir / f"{ids[1]}.wav", np.zeros(1000, np.float32), 16000)  # 0.06 s of a 1-s window
    x = np.zeros(16000, np.float32)
    x[5] = np.inf
    sf.write(audio_dir / f"{ids[2]}.wav", x, 16000, subtype="FLOAT")  # non-finite
    out = tmp_path / "out"
    res = run_pipeline(pipeline_config(csv_path, audio_dir, out, tiny_codec), progress=False)
    assert res.exit_code == 0 and "3 failed rows" in res.message
    m = json.loads((out / "manifest.json").read_text())
    assert m["totals"]["encoded"] == 4 and m["totals"]["failed"] == 3 and m["totals"]["rows"] == 7
    lines = [json.loads(x) for x in (out / "failures.jsonl").read_text().splitlines()]
    assert lines == m["failures"]
    assert [f["ytid"] for f in lines] == ids[:3] and [f["csv_row"] for f in lines] == [2, 3, 4]
    assert [f["reason"] for f in lines] == ["missing_audio", "duration_mismatch", "decode_error"]
    assert lines[0]["detail"].startswith("audio file not found") and "1 non-finite" in lines[2]["detail"]
    assert verify(out)[0] == []


def test_too_many_failures_exit_nonzero_but_keep_outputs(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, rows = corpus
    for r in rows[:5]:
        (audio_dir / f"{r['ytid']}.wav").unlink()
    out = tmp_path / "out"
    res = run_pipeline(pipeline_config(csv_path, audio_dir, out, tiny_codec), progress=False)
    assert res.exit_code == 1 and "5 of 7 rows failed" in res.message and "failures.jsonl" in res.message
    assert (out / "manifest.json").exists() and verify(out)[0] == []
    res = run_pipeline(pipeline_config(csv_path, audio_dir, out, tiny_codec, max_failure_fraction=0.8), progress=False)
    assert res.exit_code == 0
    for r in rows[5:]:
        (audio_dir / f"{r['ytid']}.wav").unlink()
    # no clip of any row in audio_dir: refused before the codec loads, nothing written (a wrong or empty folder)
    with pytest.raises(PipelineError, match=r"audio_dir=.* holds no \{ytid\}.<ext> file of the CSV's 7 rows"):
        run_pipeline(pipeline_config(csv_path, audio_dir, tmp_path / "out2", tiny_codec), progress=False)
    assert not (tmp_path / "out2").exists()


def test_bad_keys_are_rejected_naming_the_row(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, _ = corpus
    lines = csv_path.read_text(encoding="utf-8").splitlines(keepends=True)
    dup = tmp_path / "dup.csv"
    dup.write_text("".join(lines + [lines[1]]), encoding="utf-8")
    with pytest.raises(PipelineError, match=r"dup.csv:9: ytid '-0Gj8-vB1q4' repeats row 2"):
        run_pipeline(pipeline_config(dup, audio_dir, tmp_path / "o1", tiny_codec), progress=False)
    dot = tmp_path / "dot.csv"
    dot.write_text("".join([lines[0], lines[1].replace("-0Gj8-vB1q4", "-0Gj8.vB1q4")]), encoding="utf-8")
    with pytest.raises(PipelineError, match=r"dot.csv:2: ytid '-0Gj8.vB1q4' contains '.'"):
        run_pipeline(pipeline_config(dot, audio_dir, tmp_path / "o2", tiny_codec), progress=False)


def test_crop_to_window_cuts_full_length_audio(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, rows = corpus
    full = tmp_path / "full"
    full.mkdir()
    for r in rows[:2]:  # 45-s "source videos"; windows are [30, 31] s (make_corpus: 1-s windows)
        sf.write(
            full / f"{r['ytid']}.flac",
            0.1 * np.random.default_rng(0).standard_normal(45 * 8000).astype(np.float32),
            8000,
        )
    out = tmp_path / "out"
    res = run_pipeline(pipeline_config(csv_path, full, out, tiny_codec, crop_to_window=True, limit=2), progress=False)
    assert res.exit_code == 0
    assert res.manifest.totals["n_frames"] == 2 * 50 and res.manifest.totals["audio_seconds"] == 2.0


def test_verify_catches_corruption(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, _ = corpus
    out = tmp_path / "out"
    run_pipeline(pipeline_config(csv_path, audio_dir, out, tiny_codec), progress=False)
    tar = out / "eval/shard-000001.tar"
    data = bytearray(tar.read_bytes())
    data[700] ^= 0xFF  # inside the first member's payload
    tar.write_bytes(bytes(data))
    problems, _ = verify(out)
    assert any("eval/shard-000001.tar: sha256 differs" in p for p in problems)
    (out / "train/shard-000000.tar").unlink()
    problems, _ = verify(out)
    assert any("train/shard-000000.tar: listed in the manifest but missing" in p for p in problems)


def test_verify_fails_a_set_with_no_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.contract.shard_fixture import write_shard_set
    from tokenizer_pipeline.verify import main

    out = write_shard_set(tmp_path / "empty", {"train": [], "eval": []})
    failures = [{"ytid": f"y{i}", "csv_row": i + 2, "split": "train", "reason": "missing_audio", "detail": "-",
                 "error_type": None, "retryable": True} for i in range(3)]  # fmt: skip
    m = json.loads((out / "manifest.json").read_text())
    m["totals"].update(rows=3, failed=3)
    m["failures"] = failures
    (out / "manifest.json").write_text(json.dumps(m))
    (out / "failures.jsonl").write_text("".join(json.dumps(f) + "\n" for f in failures))
    assert main([str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"FAILED {out}: ") and "0 samples" in err, err
    assert str(out / "failures.jsonl") in err and "3 rows failed" in err


# sha256 and size of the one-sample tar below as the format-version-2 writer wrote it (the last commit before
# version 3, run on these exact inputs): a MusicCaps sample's bytes must not change with the format version.
V2_TAR_SHA256 = "ef50332acb0d4de21e44766ad22fb53befc7d34e9df8a982794917d6dda7b25f"
V2_TAR_BYTES = 10240


def test_a_musiccaps_sample_tar_is_byte_identical_to_format_version_2(tmp_path: Path) -> None:
    from tokenizer_pipeline.shards.manifest import SampleRecord
    from tokenizer_pipeline.shards.write_shards import ShardPlan, ShardTarWriter
    from tokenizer_pipeline.sources.musiccaps import ClipRow

    row = ClipRow("abcDEF-_123", 30.0, 40.0, ("Music", "Guitar"), ("rock", "loud guitar"),
                  'A loud rock song, with "quotes" and é.', 4, True, False, "train", 7)  # fmt: skip
    rec = SampleRecord(
        ytid=row.ytid, start_s=30.0, end_s=40.0, audioset_positive_labels=["Music", "Guitar"],
        aspect_list=["rock", "loud guitar"], caption=row.caption, author_id=4, is_balanced_subset=True,
        is_audioset_eval=False, split="train", csv_row=7, n_frames=3, n_codebooks=4, duration_s=0.06,
        source_file="abcDEF-_123.wav", source_sha256="0" * 64,
    )  # fmt: skip
    codes = (np.arange(12, dtype=np.int16).reshape(3, 4) * 97) % 2048  # [T=3, K=4]
    with ShardTarWriter(tmp_path, ShardPlan("train", 0, (row,))) as w:
        w.write(rec, codes)
        entry = w.commit()
    assert (entry.sha256, entry.bytes) == (V2_TAR_SHA256, V2_TAR_BYTES)
