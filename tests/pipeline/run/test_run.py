"""The run room (tokenizer_pipeline.run): per-clip isolation, config errors before encoding, healing resume, decode workers, lock, tar hygiene."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import filelock
import numpy as np
import pytest
import soundfile as sf
import torch

import tokenizer_pipeline.run.loader as loader
import tokenizer_pipeline.run.pipeline as run
import tokenizer_pipeline.run.planning as planning
import tokenizer_pipeline.run.progress as progress
from tests.pipeline.helpers import pipeline_config
from tokenizer_pipeline.config import ShardConfig
from tokenizer_pipeline.errors import PipelineError
from tokenizer_pipeline.run.encode_shards import LengthBuckets
from tokenizer_pipeline.run.loader import DecodedClip
from tokenizer_pipeline.run.pipeline import run_pipeline
from tokenizer_pipeline.run.ranks import RankInfo
from tokenizer_pipeline.shards.write_shards import ShardPlan, sha256_file
from tokenizer_pipeline.sources.musiccaps import ClipRow


def _snapshot(d: Path) -> dict[str, bytes]:
    return {
        p.relative_to(d).as_posix(): p.read_bytes()
        for p in sorted(d.rglob("*"))
        if p.is_file() and ".progress" not in p.parts and p.name != ".lock"
    }


def _failures(out: Path) -> dict[str, dict]:
    return {f["ytid"]: f for f in map(json.loads, (out / "failures.jsonl").read_text().splitlines())}


def _reasons(out: Path) -> dict[str, str]:
    return {ytid: f["reason"] for ytid, f in _failures(out).items()}


def _record_calls(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = run.encode_shard
    monkeypatch.setattr(run, "encode_shard", lambda plan, *a, **k: (calls.append(plan.relpath), real(plan, *a, **k))[1])
    return calls


# ---- 1. per-clip isolation


def test_any_decode_exception_is_one_failure(corpus, tiny_codec: Path, tmp_path: Path, monkeypatch) -> None:
    csv_path, audio_dir, rows = corpus
    bad = rows[1]["ytid"]
    real_load = loader.load_audio

    def load(path, *a, **k):
        if Path(path).stem == bad:  # what torchaudio's gcd-1 resampling kernel raised for a 44,101 Hz file
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 11294464000 bytes")
        return real_load(path, *a, **k)

    monkeypatch.setattr(loader, "load_audio", load)
    res = run_pipeline(pipeline_config(csv_path, audio_dir, tmp_path / "out", tiny_codec), progress=False)
    assert res.exit_code == 0 and res.manifest.totals["encoded"] == 6
    assert _reasons(tmp_path / "out") == {bad: "decode_error"}
    f = _failures(tmp_path / "out")[bad]
    assert (
        f["error_type"] == "RuntimeError"
        and "you tried to allocate 11294464000 bytes" in f["detail"]
        and bad in f["detail"]
    )


def test_failed_batch_is_retried_clip_by_clip(corpus, tiny_codec: Path, tmp_path: Path, monkeypatch) -> None:
    """All clips 1 s long, batches of 3: a clip whose forward fails alone fails, its batch-mates are encoded."""
    csv_path, audio_dir, rows = corpus
    for i, r in enumerate(rows):
        sf.write(
            audio_dir / f"{r['ytid']}.wav", (0.1 * np.sin(np.arange(16000) * 0.01 * (i + 1))).astype(np.float32), 16000
        )
    cfg = pipeline_config(csv_path, audio_dir, tmp_path / "out", tiny_codec, shard=ShardConfig(max_samples=4))
    first_train = next(r for r in planning.load_rows(cfg) if r.split == "train")  # in the first batch encoded
    poisoned = loader.ClipSource([first_train], cfg, 32000)[0].wav  # exactly as the pipeline decodes it
    real_encode = run.CodecEncoder.encode_batch
    batch_sizes: list[int] = []

    def encode_batch(self, wavs):
        batch_sizes.append(len(wavs))
        if any(torch.equal(w, poisoned) for w in wavs):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_encode(self, wavs)

    monkeypatch.setattr(run.CodecEncoder, "encode_batch", encode_batch)
    res = run_pipeline(cfg, progress=False)
    assert res.exit_code == 0 and res.manifest.totals["encoded"] == 6
    assert _reasons(tmp_path / "out") == {first_train.ytid: "encode_error"}
    f = _failures(tmp_path / "out")[first_train.ytid]
    assert f["error_type"] == "OutOfMemoryError" and "CUDA out of memory (simulated)" in f["detail"]
    assert batch_sizes[:4] == [3, 1, 1, 1]  # the failed batch of 3, then its clips alone


def test_config_errors_stop_before_encoding_without_traceback(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, _ = corpus
    lines = csv_path.read_text(encoding="utf-8").splitlines(keepends=True)
    bad_csv = tmp_path / "bad.csv"
    fields = lines[2].split(",")  # ytid,start_s,end_s,...: no quoted commas before the caption
    bad_csv.write_text(
        "".join([lines[0], lines[1], ",".join([*fields[:2], "ten", *fields[3:]]), *lines[3:]]), encoding="utf-8"
    )
    assert ",ten," in bad_csv.read_text()
    with pytest.raises(PipelineError, match=r"(?s)bad.csv:3: column .end_s.*Fix or delete that CSV row"):
        run_pipeline(pipeline_config(bad_csv, audio_dir, tmp_path / "o1", tiny_codec), progress=False)
    assert not (tmp_path / "o1").exists()  # refused before anything was written
    with pytest.raises(PipelineError, match=r"codec .*does not exist.*make codec"):
        run_pipeline(pipeline_config(csv_path, audio_dir, tmp_path / "o2", tmp_path / "no_codec"), progress=False)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(PipelineError, match=r"out_dir=.*a_file/out cannot be written \(.*a_file is not a directory\)"):
        run_pipeline(pipeline_config(csv_path, audio_dir, blocker / "out", tiny_codec), progress=False)
    with pytest.raises(PipelineError, match=r"workers=-1 must be >= 0"):
        run_pipeline(pipeline_config(csv_path, audio_dir, tmp_path / "o3", tiny_codec, workers=-1), progress=False)
    # as users see it: exit 1, the line and the fix, no traceback
    r = subprocess.run(
        [sys.executable, "-m", "tokenizer_pipeline", f"csv={bad_csv}", f"audio_dir={audio_dir}", f"out_dir={tmp_path / 'o4'}",
         f"codec.name_or_path={tiny_codec}", "codec.device=cpu"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 2 and "bad.csv:3" in r.stderr and "Traceback" not in r.stderr, r.stderr


# ---- 4. resume that heals


def test_rerun_heals_exactly_the_changed_shards(corpus, tiny_codec: Path, tmp_path: Path, monkeypatch) -> None:
    csv_path, audio_dir, rows = corpus
    cfg = pipeline_config(csv_path, audio_dir, tmp_path / "out", tiny_codec)
    run_pipeline(cfg, progress=False)
    fresh = _snapshot(tmp_path / "out")
    shutil.rmtree(tmp_path / "out")

    # rows[0] (train shard 0) is missing on the first run, rows[4] (eval shard 0) is a different file
    stash = tmp_path / "stash"
    stash.mkdir()
    shutil.move(audio_dir / f"{rows[0]['ytid']}.wav", stash)
    shutil.copy(audio_dir / f"{rows[4]['ytid']}.wav", stash)
    sf.write(audio_dir / f"{rows[4]['ytid']}.wav", np.zeros(16000, np.float32), 16000)
    run_pipeline(cfg, progress=False)
    assert _reasons(tmp_path / "out")[rows[0]["ytid"]] == "missing_audio"

    calls = _record_calls(monkeypatch)
    run_pipeline(cfg, progress=False)
    assert calls == []  # nothing changed: nothing redone
    shutil.move(stash / f"{rows[0]['ytid']}.wav", audio_dir)  # the missing audio arrives
    shutil.copy(stash / f"{rows[4]['ytid']}.wav", audio_dir)  # and a file changes
    run_pipeline(cfg, progress=False)
    assert calls == [path for path, ids in _plans(cfg) if rows[0]["ytid"] in ids or rows[4]["ytid"] in ids]
    assert len(calls) == 2
    assert _snapshot(tmp_path / "out") == fresh

    # deleting audio after encoding keeps its sample (a rerun never turns samples into failures)
    (audio_dir / f"{rows[2]['ytid']}.wav").unlink()
    calls.clear()
    run_pipeline(cfg, progress=False)
    assert calls == [] and _snapshot(tmp_path / "out") == fresh


def test_a_rerun_retries_a_transient_encode_error_and_matches_a_fresh_run(
    corpus, tiny_codec: Path, tmp_path: Path, monkeypatch
) -> None:
    """An out-of-memory error on one clip is recorded `retryable`; the next run redoes its shard, and the set is
    byte-identical to one that never failed. A final failure (too short) is not redone."""
    csv_path, audio_dir, rows = corpus
    cfg = pipeline_config(csv_path, audio_dir, tmp_path / "out", tiny_codec)
    run_pipeline(cfg, progress=False)
    fresh = _snapshot(tmp_path / "out")
    shutil.rmtree(tmp_path / "out")

    victim = rows[1]["ytid"]
    poisoned = loader.ClipSource([r for r in planning.load_rows(cfg) if r.ytid == victim], cfg, 32000)[0].wav
    real_encode = run.CodecEncoder.encode_batch
    failing = [True]

    def encode_batch(self, wavs):
        if failing[0] and any(torch.equal(w, poisoned) for w in wavs):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_encode(self, wavs)

    monkeypatch.setattr(run.CodecEncoder, "encode_batch", encode_batch)
    res = run_pipeline(cfg, progress=False)
    f = _failures(tmp_path / "out")[victim]
    assert f["reason"] == "encode_error" and f["retryable"] is True
    assert "1 failures are retryable" in res.message and "rerun the same command" in res.message
    plan = next(p for p in _plan_objects(cfg) if victim in {r.ytid for r in p.rows})
    progress = json.loads((tmp_path / "out/.progress" / plan.record_name).read_text())
    assert [f["retryable"] for f in progress["failures"]] == [True]

    failing[0] = False  # the transient cause went away
    calls = _record_calls(monkeypatch)
    run_pipeline(cfg, progress=False)
    assert calls == [path for path, ids in _plans(cfg) if victim in ids]
    assert _snapshot(tmp_path / "out") == fresh  # byte-identical to the fresh run: tars, manifest, failures.jsonl

    # a final failure stays as it is: the same file fails the same way
    sf.write(audio_dir / f"{rows[0]['ytid']}.wav", np.zeros(800, np.float32), 16000)  # 0.05 s
    run_pipeline(cfg, progress=False)
    assert _failures(tmp_path / "out")[rows[0]["ytid"]]["retryable"] is False
    calls.clear()
    run_pipeline(cfg, progress=False)
    assert calls == []


def _plan_objects(cfg) -> list[ShardPlan]:
    return run.plan_shards(planning.load_rows(cfg), [cfg.split.train_name, cfg.split.eval_name], cfg.shard.max_samples)


def test_ffmpeg_failures_are_counted_and_retried_once_installed(
    corpus, tiny_codec: Path, tmp_path: Path, monkeypatch
) -> None:
    csv_path, audio_dir, rows = corpus
    m4a = rows[5]["ytid"]
    (audio_dir / f"{m4a}.wav").rename(audio_dir / f"{m4a}.m4a")  # a wav under an FFmpeg-only name
    monkeypatch.setattr(loader, "load_audio", _fake_ffmpeg_missing(loader.load_audio))
    cfg = pipeline_config(csv_path, audio_dir, tmp_path / "out", tiny_codec)
    res = run_pipeline(cfg, progress=False)
    assert "1 clips need FFmpeg" in res.message and "apt-get install ffmpeg" in res.message
    assert _reasons(tmp_path / "out")[m4a] == "needs_ffmpeg"

    calls = _record_calls(monkeypatch)
    monkeypatch.setattr(progress, "ffmpeg_available", lambda: False)
    run_pipeline(cfg, progress=False)
    assert calls == []  # still no FFmpeg: nothing to retry
    monkeypatch.setattr(progress, "ffmpeg_available", lambda: True)
    monkeypatch.setattr(loader, "load_audio", _decode_m4a_as_wav(loader.load_audio))
    res = run_pipeline(cfg, progress=False)
    plan_of_m4a = [p for p, r in _plans(cfg) if m4a in r]
    assert calls == plan_of_m4a and res.manifest.totals["failed"] == 0


def test_an_ffmpeg_program_counts_as_ffmpeg_for_the_retry(monkeypatch) -> None:
    """read_audio decodes FFmpeg formats with the ffmpeg program (imageio-ffmpeg) when torchcodec's libraries are
    missing, so a rerun after `pip install imageio-ffmpeg` must retry the needs_ffmpeg rows."""
    from tokenizer_pipeline.audio.ffmpeg_binary import FFmpegNotFoundError

    monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)  # no torchcodec FFmpeg libraries
    monkeypatch.setattr(progress, "find_ffmpeg", lambda: "/opt/bin/ffmpeg")
    progress.ffmpeg_available.cache_clear()  # it is cached per process
    try:
        assert progress.ffmpeg_available()

        def no_program():
            raise FFmpegNotFoundError("no ffmpeg program")

        monkeypatch.setattr(progress, "find_ffmpeg", no_program)
        progress.ffmpeg_available.cache_clear()
        assert not progress.ffmpeg_available()
    finally:
        progress.ffmpeg_available.cache_clear()


def _plans(cfg) -> list[tuple[str, list[str]]]:
    from tokenizer_pipeline.shards.write_shards import plan_shards

    plans = plan_shards(planning.load_rows(cfg), ["train", "eval"], cfg.shard.max_samples)
    return [(p.relpath, [r.ytid for r in p.rows]) for p in plans]


def _fake_ffmpeg_missing(real):
    from tokenizer_pipeline.audio.read_audio import ClipFailure

    def load(path, *a, **k):
        if Path(path).suffix == ".m4a":  # what read_audio raises when FFmpeg's libraries (and program) are absent
            raise ClipFailure("needs_ffmpeg", path, "'m4a' audio needs FFmpeg, whose libraries are not installed here")
        return real(path, *a, **k)

    return load


def _decode_m4a_as_wav(real):
    def load(path, *a, **k):
        if Path(path).suffix == ".m4a":
            tmp = Path(path).with_suffix(".decoded.wav")
            shutil.copy(path, tmp)
            try:
                return real(tmp, *a, **k)
            finally:
                tmp.unlink()
        return real(path, *a, **k)

    return load


# ---- 5. decode workers


def test_output_is_byte_identical_for_0_1_2_workers(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, _ = corpus
    snaps = []
    out = tmp_path / "out"
    for workers in (0, 1, 2):
        shutil.rmtree(out, ignore_errors=True)
        res = run_pipeline(
            pipeline_config(csv_path, audio_dir, out, tiny_codec, workers=workers, prefetch=1), progress=False
        )
        assert res.exit_code == 0 and res.manifest.totals["encoded"] == 7
        assert "workers" not in res.manifest.config  # output-neutral: not recorded
        snaps.append(_snapshot(out))
    assert snaps[0] == snaps[1] == snaps[2]


def test_batch_size_auto_is_the_device_s_number_recorded_and_reproducible(
    corpus, tiny_codec: Path, tmp_path: Path
) -> None:
    """codec.batch_size=auto (the default) runs with this device's number from the table; the manifest records
    that number, and the set is byte-identical to a run that asked for the number explicitly."""
    from dataclasses import replace

    from tokenizer_pipeline.codec.encode import AUTO_BATCH_SIZE, resolve_batch_size
    from tokenizer_pipeline.config import CodecConfig

    assert CodecConfig().batch_size == "auto"
    assert resolve_batch_size("auto", "cpu") == AUTO_BATCH_SIZE["cpu"] and resolve_batch_size(5, "cuda") == 5
    assert resolve_batch_size("auto", "cuda") == AUTO_BATCH_SIZE["cuda"] and resolve_batch_size("4", "cpu") == 4
    csv_path, audio_dir, _ = corpus
    base = pipeline_config(csv_path, audio_dir, tmp_path / "auto", tiny_codec)
    for bad in ("many", 0, -2, 1.5, True):
        with pytest.raises(PipelineError, match=r"codec.batch_size=.* must be an integer >= 1 or auto"):
            run_pipeline(replace(base, codec=replace(base.codec, batch_size=bad)), progress=False)
    snaps = []
    out = tmp_path / "out"
    for bs in ("auto", AUTO_BATCH_SIZE["cpu"]):
        shutil.rmtree(out, ignore_errors=True)
        res = run_pipeline(replace(base, out_dir=str(out), codec=replace(base.codec, batch_size=bs)), progress=False)
        assert res.exit_code == 0 and res.manifest.config["codec"]["batch_size"] == AUTO_BATCH_SIZE["cpu"]
        assert (
            json.loads((out / "manifest.json").read_text())["config"]["codec"]["batch_size"] == AUTO_BATCH_SIZE["cpu"]
        )
        snaps.append(_snapshot(out))
    assert snaps[0] == snaps[1]


def _clip(n: int, i: int) -> DecodedClip:
    row = ClipRow(f"id{i}", 0.0, 10.0, (), (), "", 0, False, False, "train", i + 2)
    return DecodedClip(row, torch.zeros(n), "f", "s", None)


def test_length_buckets_batch_equal_lengths_and_bound_what_waits() -> None:
    b = LengthBuckets(batch_size=2, same_length=True)
    assert b.add(_clip(10, 0)) == [] and b.add(_clip(11, 1)) == []
    ready = b.add(_clip(10, 2))
    assert [[c.row.ytid for c in batch] for batch in ready] == [["id0", "id2"]]
    assert b.add(_clip(12, 3)) == [] and b.add(_clip(13, 4)) == []  # 3 clips of 3 lengths wait
    ready = b.add(_clip(14, 5))  # the 4th waiting clip reaches max_pending = 2 x batch_size: all go
    assert [[c.row.ytid for c in batch] for batch in ready] == [["id1"], ["id3"], ["id4"], ["id5"]]
    assert b.drain() == []
    padded = LengthBuckets(batch_size=2, same_length=False)
    assert padded.add(_clip(10, 0)) == [] and len(padded.add(_clip(11, 1))[0]) == 2


# ---- 6. rank ownership (the torchrun run itself: test_run_torchrun.py)


@pytest.mark.parametrize("n_plans,world", [(7, 2), (3, 4), (10, 3)])
def test_ranks_own_disjoint_contiguous_ranges_covering_the_plan(n_plans: int, world: int) -> None:
    plans = [ShardPlan("train", i, ()) for i in range(n_plans)]
    owned = [RankInfo(r, world, r, world).owned(plans) for r in range(world)]
    assert [p for o in owned for p in o] == plans  # disjoint, in order, complete
    assert max(map(len, owned)) - min(map(len, owned)) <= 1


# ---- 8. lock, tar headers, keys


def test_a_second_run_on_the_same_out_dir_is_refused(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, _ = corpus
    out = tmp_path / "out"
    out.mkdir()
    with (
        filelock.FileLock(out / ".lock", timeout=0),  # another run holds it
        pytest.raises(PipelineError, match=r"another tokenizer_pipeline run is writing .*out/\.lock.*delete .*\.lock"),
    ):
        run_pipeline(pipeline_config(csv_path, audio_dir, out, tiny_codec), progress=False)
    assert not (out / "manifest.json").exists()
    # released
    assert run_pipeline(pipeline_config(csv_path, audio_dir, out, tiny_codec), progress=False).exit_code == 0


def test_tar_members_have_integer_mtime_and_no_pax_headers(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, _ = corpus
    out = tmp_path / "out"
    run_pipeline(pipeline_config(csv_path, audio_dir, out, tiny_codec), progress=False)
    tar_path = out / "train/shard-000000.tar"
    with tarfile.open(tar_path) as tar:
        members = tar.getmembers()
    assert len(members) == 4
    assert all(m.pax_headers == {} and m.mtime == 0 and m.uid == 0 and m.mode == 0o444 for m in members)
    # no PAX header blocks: each member is one 512-byte header plus its padded payload, then 2 end blocks (+ record padding)
    payload = sum(512 + -(-m.size // 512) * 512 for m in members)
    assert tar_path.stat().st_size == -(-(payload + 1024) // 10240) * 10240


@pytest.mark.parametrize("bad", ["ab cd", "ab+cd", "ab/cd", "äbc"])
def test_keys_outside_the_contract_charset_are_refused(corpus, tiny_codec: Path, tmp_path: Path, bad: str) -> None:
    csv_path, audio_dir, rows = corpus
    lines = csv_path.read_text(encoding="utf-8").splitlines(keepends=True)
    p = tmp_path / "k.csv"
    p.write_text(lines[0] + lines[1].replace(rows[0]["ytid"], bad), encoding="utf-8")
    with pytest.raises(PipelineError, match=r"k.csv:2: ytid .* may only use A-Z a-z 0-9 _ -"):
        run_pipeline(pipeline_config(p, audio_dir, tmp_path / "o", tiny_codec), progress=False)


def test_threads_is_a_recorded_setting(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, _ = corpus
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        res = run_pipeline(
            pipeline_config(csv_path, audio_dir, tmp_path / "out", tiny_codec, threads=1, limit=2), progress=False
        )
        assert torch.get_num_threads() == 2  # the run's thread count does not leak into the caller's process
    finally:
        torch.set_num_threads(before)
    assert res.manifest.config["threads"] == 1
    with pytest.raises(PipelineError, match=r"changed: .*config\.threads"):
        run_pipeline(
            pipeline_config(csv_path, audio_dir, tmp_path / "out", tiny_codec, threads=2, limit=2), progress=False
        )
    torch.set_num_threads(before)


@pytest.mark.parametrize("name", ["../escape", "/abs/dir"])
def test_split_names_that_are_paths_are_refused_before_anything_is_touched(
    corpus, tiny_codec: Path, tmp_path: Path, name: str
) -> None:
    csv_path, audio_dir, _ = corpus
    victim = tmp_path / "abs/dir"
    victim.mkdir(parents=True)
    (victim / "shard-000000.tar").write_bytes(b"someone else's tar")
    split = str(victim) if name == "/abs/dir" else name
    out = tmp_path / "o"
    cfg = pipeline_config(csv_path, audio_dir, out, tiny_codec, overwrite=True)
    cfg = replace(cfg, split=replace(cfg.split, train_name=split))
    with pytest.raises(PipelineError, match=r"split\.train_name=.* plain directory name"):
        run_pipeline(cfg, progress=False)
    assert (victim / "shard-000000.tar").read_bytes() == b"someone else's tar"
    assert not out.exists() and not (tmp_path / "escape").exists()


@pytest.mark.parametrize("length", [91, 100, 300])
def test_long_ytids_are_refused_with_their_row_on_every_run(corpus, tiny_codec: Path, tmp_path: Path, length) -> None:
    """A 100-character ytid gave a tar with a PAX header; a 300-character one crashed every rerun (name too long)."""
    csv_path, audio_dir, rows = corpus
    lines = csv_path.read_text(encoding="utf-8").splitlines(keepends=True)
    long_id = ("L" * length)[:length]
    p = tmp_path / "long.csv"
    p.write_text(lines[0] + lines[1] + lines[2].replace(rows[1]["ytid"], long_id), encoding="utf-8")
    for _ in range(2):
        with pytest.raises(PipelineError, match=rf"long.csv:3: ytid .* is {length} characters long, more than 90"):
            run_pipeline(pipeline_config(p, audio_dir, tmp_path / "o", tiny_codec), progress=False)
    assert not (tmp_path / "o").exists()


def test_a_90_character_ytid_gives_plain_ustar_members(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, rows = corpus
    lines = csv_path.read_text(encoding="utf-8").splitlines(keepends=True)
    long_id = "L" * 90
    p = tmp_path / "long.csv"
    p.write_text(lines[0] + lines[1].replace(rows[0]["ytid"], long_id), encoding="utf-8")
    shutil.copy(audio_dir / f"{rows[0]['ytid']}.wav", audio_dir / f"{long_id}.wav")
    out = tmp_path / "o"
    assert run_pipeline(pipeline_config(p, audio_dir, out, tiny_codec), progress=False).exit_code == 0
    (tar_path,) = out.glob("*/shard-000000.tar")
    with tarfile.open(tar_path) as tar:
        names = [(m.name, m.pax_headers) for m in tar.getmembers()]
    assert names == [(f"{long_id}.codes.npy", {}), (f"{long_id}.json", {})]
    from tokenizer_pipeline.shards.verify import verify

    assert verify(out)[0] == []


# The sample json of a MusicCaps clip, key for key and in this order.
MUSICCAPS_SAMPLE_KEYS = [
    "ytid", "start_s", "end_s", "audioset_positive_labels", "aspect_list", "caption", "author_id",
    "is_balanced_subset", "is_audioset_eval", "split", "csv_row", "n_frames", "n_codebooks", "duration_s",
    "source_file", "source_sha256",
]  # fmt: skip


def test_musiccaps_samples_keep_their_layout_in_format_version_4(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, _ = corpus
    cfg = pipeline_config(csv_path, audio_dir, tmp_path / "out", tiny_codec)
    run_pipeline(cfg, progress=False)
    with tarfile.open(tmp_path / "out/train/shard-000000.tar") as tar:
        names = tar.getnames()
        meta = json.loads(tar.extractfile(names[1]).read())  # type: ignore[union-attr]
    assert names[0].endswith(".codes.npy") and names[1] == names[0].replace(".codes.npy", ".json")
    assert list(meta) == MUSICCAPS_SAMPLE_KEYS
    m = json.loads((tmp_path / "out/manifest.json").read_text())
    assert m["format_version"] == 5 and m["segmentation"] is None  # MusicCaps manifests: version 5, with the index
    assert m["source"] == {
        "kind": "musiccaps", "csv": str(csv_path), "csv_sha256": sha256_file(csv_path),
        "sha256": sha256_file(csv_path), "audio_dir": str(audio_dir),
    }  # fmt: skip


def test_a_set_written_before_the_index_gets_it_on_a_rerun_without_encoding(
    corpus, tiny_codec: Path, tmp_path: Path, monkeypatch
) -> None:
    """A set from before format 5 (no index sidecars, no index parts in .progress/) reruns without encoding a shard
    and ends byte-identical to a fresh version-5 set: the parts come from the kept tars."""
    csv_path, audio_dir, _ = corpus
    cfg = pipeline_config(csv_path, audio_dir, tmp_path / "out", tiny_codec)
    assert run_pipeline(cfg, progress=False).exit_code == 0
    fresh = _snapshot(tmp_path / "out")
    shutil.rmtree(tmp_path / "out/.progress/index")
    for p in (tmp_path / "out").glob("*/index.safetensors"):
        p.unlink()
    calls = _record_calls(monkeypatch)
    assert run_pipeline(cfg, progress=False).exit_code == 0
    assert calls == [] and _snapshot(tmp_path / "out") == fresh
