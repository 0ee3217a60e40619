"""`torchrun --nproc_per_node=2 -m tokenizer_pipeline` with 2 CPU (gloo) ranks, as users launch it.

The set must be byte-identical to one process with the same per-process settings (threads=1), and a
rerun after ranks died at different points must redo only what is missing and give the same bytes.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

from tests.pipeline.helpers import pipeline_config
from tests.run_end import Ended, run_live
from tokenizer_pipeline.run.pipeline import run_pipeline

pytestmark = pytest.mark.budget(60, reason="torchrun launches of 2 gloo ranks, each rank importing torch and the codec")


def _snapshot(d: Path) -> dict[str, bytes]:
    return {
        p.relative_to(d).as_posix(): p.read_bytes()
        for p in sorted(d.rglob("*"))
        if p.is_file() and ".progress" not in p.parts and p.name != ".lock"
    }


def _run(args: list[str], cwd: Path) -> Ended:
    r = run_live([sys.executable, *args], cwd=cwd)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    return r


TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "tokenizer_pipeline"]


@pytest.mark.multiprocess
def test_two_cpu_ranks_match_one_process_and_resume(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    csv_path, audio_dir, _ = corpus
    s = tmp_path / "shards"
    # one process, same per-process settings as each rank: 1 intra-op thread, batches of 3, 2 clips per shard
    threads = torch.get_num_threads()
    try:
        run_pipeline(pipeline_config(csv_path, audio_dir, s, tiny_codec, threads=1), progress=False)
    finally:
        torch.set_num_threads(threads)
    reference = _snapshot(s)
    assert sorted(reference) == ["eval/index.safetensors", "eval/shard-000000.tar", "eval/shard-000001.tar",
                                 "failures.jsonl", "manifest.json", "train/index.safetensors",
                                 "train/shard-000000.tar", "train/shard-000001.tar"]  # fmt: skip
    shutil.rmtree(s)

    args = [f"csv={csv_path}", f"audio_dir={audio_dir}", f"out_dir={s}", f"codec.name_or_path={tiny_codec}",
            "codec.device=cpu", "codec.batch_size=3", "shard.max_samples=2", "min_seconds=0.5",
            "threads=1", "workers=0"]  # fmt: skip
    r = _run([*TORCHRUN, *args], tmp_path)
    assert r.stdout.count(f"shard set: {s} (4 shards)") == 1  # only rank 0 reports
    assert "2 rank(s)" in r.stdout
    assert _snapshot(s) == reference

    # rank 0 (train shards) died before its first shard was renamed; rank 1 (eval shards) died while
    # writing its second shard: no manifest, a partial tar, no record for it
    (s / "manifest.json").unlink()
    (s / "train/shard-000000.tar").unlink()
    (s / ".progress/train-shard-000000.json").unlink()
    (s / "eval/shard-000001.tar").rename(s / "eval/shard-000001.tar.partial")
    (s / ".progress/eval-shard-000001.json").unlink()
    kept = {p: (s / p).stat().st_mtime_ns for p in ("train/shard-000001.tar", "eval/shard-000000.tar")}
    _run([*TORCHRUN, *args], tmp_path)
    assert _snapshot(s) == reference
    assert {p: (s / p).stat().st_mtime_ns for p in kept} == kept  # completed shards were not rewritten
    assert not list(s.rglob("*.partial"))


def test_a_configuration_error_under_torchrun_is_one_line_and_torchrun_quotes_it(tmp_path: Path) -> None:
    """Rank 0 prints the one `error:` line; every rank hands it to torchrun's error file, so the report torchrun
    prints after it (docs/architecture.md, errors and exit codes) quotes that line instead of a link to its docs."""
    (tmp_path / "audio").mkdir()
    args = ["audio_dir=audio", "out_dir=o", "csv=nope.csv", "codec.device=cpu"]
    r = run_live([sys.executable, *TORCHRUN, *args], cwd=tmp_path)
    assert r.returncode == 1  # torchrun's own status for a failed worker (each rank exited 2)
    ours = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert ours == ["error: MusicCaps CSV not found: nope.csv. The repo ships it at data/musiccaps/musiccaps-public.csv; "
                    "pass csv=/path/to/musiccaps-public.csv"]  # fmt: skip
    assert "tokenizer_pipeline/" not in r.stderr  # no frame of our code: torchrun's traceback is its own launcher's
    assert "To enable traceback see" not in r.stderr
    assert r.stderr.count(f"traceback : {ours[0]}") == 2  # both ranks' entries in torchrun's report quote it
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_finished_torchrun_job_exits_0_every_time(corpus, tiny_codec: Path, tmp_path: Path) -> None:
    """Teardown: a barrier after rank 0's result is broadcast, before the group is destroyed. Without it a finished
    job aborted on exit about 1 run in 30 ("terminate called without an active exception"); 40 runs of 2 ranks
    with one clip per shard (the most teardown per run) must all exit 0 with the summary printed once."""
    csv_path, audio_dir, _ = corpus
    args = [f"csv={csv_path}", f"audio_dir={audio_dir}", f"codec.name_or_path={tiny_codec}", "codec.device=cpu",
            "shard.max_samples=1", "min_seconds=0.5", "threads=1", "workers=0", "limit=2"]  # fmt: skip
    for i in range(40):
        out = tmp_path / f"s{i}"
        r = run_live([sys.executable, *TORCHRUN, *args, f"out_dir={out}"], cwd=tmp_path)
        assert r.returncode == 0 and "terminate called" not in r.stderr, f"run {i}: {r.stderr[-3000:]}"
        assert r.stdout.count(f"shard set: {out}") == 1


@pytest.mark.multiprocess
def test_two_cpu_ranks_match_one_process_for_an_audiocraft_source(tiny_codec: Path, tmp_path: Path) -> None:
    """Your own audio under torchrun: the segment plan is every rank's, each owns a range of its shards."""
    from tests.pipeline.sources.helpers import make_audiocraft, source_config
    from tokenizer_pipeline.config import SegmentConfig

    tracks = [{"name": f"t{i}.wav", "seconds": 7.0, "sr": 16000, "channels": 2, "sidecar": {"description": f"song {i}"}}
              for i in range(3)]  # fmt: skip
    manifest = make_audiocraft(tmp_path / "src", tracks)
    s = tmp_path / "shards"
    threads = torch.get_num_threads()
    try:
        cfg = source_config("audiocraft", manifest, s, tiny_codec, threads=1, segment=SegmentConfig(seconds=3.0))
        run_pipeline(cfg, progress=False)
    finally:
        torch.set_num_threads(threads)
    reference = _snapshot(s)
    assert len([p for p in reference if p.endswith(".tar")]) >= 2  # 6 segments, 2 per shard: both ranks get work
    shutil.rmtree(s)
    args = ["source=audiocraft", f"source.manifest={manifest}", f"out_dir={s}", f"codec.name_or_path={tiny_codec}",
            "codec.device=cpu", "codec.batch_size=3", "shard.max_samples=2", "segment.seconds=3", "threads=1",
            "workers=0"]  # fmt: skip
    _run([*TORCHRUN, *args], tmp_path)
    assert _snapshot(s) == reference
