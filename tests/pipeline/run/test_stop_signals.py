"""Ctrl-C and SIGTERM in stage 1, with real signals: the run stops mid-shard, keeps every finished shard, releases
its lock, leaves no process behind, ends with one line naming what is kept and the command that continues (exit 130
/ 143), and that command, pasted into a shell as printed, completes the set a clean run writes."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import filelock
import pytest

from tests import REPO
from tests.pipeline.helpers import make_corpus
from tests.run_end import run_to_end

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds a run's processes in /proc")

CASES = [  # (signal, to the whole foreground job as a terminal sends it, exit status, how the line names it, extra args)
    pytest.param(signal.SIGINT, True, 130, "Ctrl-C", ["overwrite=true"], id="ctrl-c"),  # not repeated: it would clear
    pytest.param(signal.SIGTERM, False, 143, "SIGTERM", [], id="sigterm-to-the-process"),
]


def _shards(out: Path) -> dict[str, str]:
    manifest = json.loads((out / "manifest.json").read_text())
    return {s["path"]: s["sha256"] for split in manifest["splits"].values() for s in split["shards"]}


@pytest.mark.budget(90, reason="stage 1 in a subprocess (torch, the codec, 2 decode workers), then its rerun")
@pytest.mark.parametrize(("signum", "group", "code", "word", "extra"), CASES)
def test_a_signal_stops_stage_1_keeping_its_shards_and_the_printed_command_continues(
    tiny_codec, tmp_path, signum, group, code, word, extra
) -> None:
    csv_path, audio_dir, _ = make_corpus(tmp_path / "corpus", n_train=3, n_eval=2)
    out = tmp_path / "shards out ♪"  # the printed command must survive a space and a non-ASCII character
    args = [f"csv={csv_path}", f"audio_dir={audio_dir}", f"out_dir='{out}'", f"codec.name_or_path={tiny_codec}",
            "codec.device=cpu", "shard.max_samples=1", "min_seconds=0.5", "threads=1", "workers=2", "prefetch=1"]  # fmt: skip
    mark = tmp_path / "first-shard-kept"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HELD_ENCODE_MARK": str(mark)}
    ended = run_to_end([sys.executable, "-m", "tests.pipeline.held_encode", *args, *extra], env=env, cwd=REPO,
                       signal_when=(mark.exists, signum), signal_group=group)  # fmt: skip

    assert ended.returncode == code, ended.stderr[-3000:]
    assert "Traceback" not in ended.stderr, ended.stderr[-3000:]
    last = ended.stderr.strip().splitlines()[-1]
    assert last.startswith(f"tokenizer_pipeline: stopped ({word}): 1 of 5 shards are complete and kept in {out}"), last
    assert (out / "train" / "shard-000000.tar").is_file()
    assert not list(out.rglob("*.partial")) and not (out / "manifest.json").exists()
    filelock.FileLock(out / ".lock").acquire(timeout=0)  # released: raises Timeout if the run still held it

    # the command it names, pasted into a shell, redoes only the 4 missing shards
    command = last.split("the same command encodes the rest: ", 1)[1]
    assert shlex.split(command)[:3] == ["python", "-m", "tokenizer_pipeline"] and "overwrite" not in command
    shell_env = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"}
    rerun = subprocess.run(["bash", "-c", command], cwd=REPO, env=shell_env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "(4 shards redone on rank 0" in rerun.stdout, rerun.stdout

    clean = tmp_path / "clean"
    args_clean = [a if not a.startswith("out_dir=") else f"out_dir={clean}" for a in args]
    done = subprocess.run([sys.executable, "-m", "tokenizer_pipeline", *args_clean], cwd=REPO, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert _shards(out) == _shards(clean)


@pytest.mark.multiprocess
@pytest.mark.budget(90, reason="a 2-rank torchrun launch of stage 1, then its rerun")
def test_under_torchrun_a_sigterm_stops_every_rank_keeping_their_shards(tiny_codec, tmp_path) -> None:
    csv_path, audio_dir, _ = make_corpus(tmp_path / "corpus", n_train=3, n_eval=2)
    out = tmp_path / "shards"
    args = [f"csv={csv_path}", f"audio_dir={audio_dir}", f"out_dir={out}", f"codec.name_or_path={tiny_codec}",
            "codec.device=cpu", "shard.max_samples=1", "min_seconds=0.5", "threads=1", "workers=1", "prefetch=1"]  # fmt: skip
    mark = tmp_path / "first-shard-kept"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HELD_ENCODE_MARK": str(mark)}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    ended = run_to_end([*torchrun, "-m", "tests.pipeline.held_encode", *args], env=env, cwd=REPO,
                       signal_when=(mark.exists, signal.SIGTERM), signal_group=False)  # fmt: skip
    assert ended.returncode != 0  # torchrun reports its stopped ranks as a failure
    assert "KeyboardInterrupt" not in ended.stderr and "tokenizer_pipeline/" not in ended.stderr, ended.stderr[-3000:]
    ours = [line for line in ended.stderr.splitlines() if line.startswith("tokenizer_pipeline: stopped")]
    assert len(ours) == 1 and "(SIGTERM): rank 0: " in ours[0], ended.stderr[-3000:]
    assert (
        ours[0].split("encodes the rest: ", 1)[1].startswith("torchrun --nproc_per_node=2 -m tokenizer_pipeline csv=")
    )
    assert not list(out.rglob("*.partial")) and not (out / "manifest.json").exists()
    filelock.FileLock(out / ".lock").acquire(timeout=0)

    rerun = subprocess.run([*torchrun, "-m", "tokenizer_pipeline", *args], cwd=REPO, env=env, capture_output=True,
                           text=True)  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert len(_shards(out)) == 5


def test_the_stop_line_says_what_is_kept_at_each_point(monkeypatch: pytest.MonkeyPatch) -> None:
    from tokenizer_pipeline.__main__ import _stopped_line
    from tokenizer_pipeline.run.pipeline import RunStopped

    monkeypatch.setattr(sys, "argv", ["tokenizer_pipeline", "audio_dir=a", "out_dir=o", "+overwrite=true"])
    lines = [_stopped_line(stop, signal.SIGINT) for stop in
             (KeyboardInterrupt(), RunStopped(2, 5, Path("o")), RunStopped(5, 5, Path("o")))]  # fmt: skip
    assert lines == [
        "tokenizer_pipeline: stopped (Ctrl-C): before encoding started; the same command starts it again: "
        "python -m tokenizer_pipeline audio_dir=a out_dir=o",
        "tokenizer_pipeline: stopped (Ctrl-C): 2 of 5 shards are complete and kept in o; the same command encodes the "
        "rest: python -m tokenizer_pipeline audio_dir=a out_dir=o",
        "tokenizer_pipeline: stopped (Ctrl-C): all 5 shards are complete in o, the manifest not yet; the same command "
        "writes it: python -m tokenizer_pipeline audio_dir=a out_dir=o",
    ]
