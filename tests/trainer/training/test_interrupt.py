"""Ctrl-C during training (training.interrupt): the first finishes the step, checkpoints it and exits 130 with the
exact command that resumes the run, without a traceback; the resume continues from that step; a second Ctrl-C stops
at once; under torchrun a Ctrl-C that reached one rank stops every rank after the same step."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapter_trainer.training import interrupt
from adapter_trainer.training.distributed import RankInfo
from adapter_trainer.training.metric_logging import read_jsonl
from tests import REPO
from tests.trainer.helpers import run_module_in_process, tiny_demo_overrides

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _train_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    return [r["step"] for r in read_jsonl(path) if "train/loss" in r] if path.is_file() else []


@pytest.mark.budget(120, reason="two real training processes: one stopped by SIGINT, then its resume")
def test_ctrl_c_checkpoints_the_step_and_prints_the_resume_command(models, shards, tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = tiny_demo_overrides(models, shards, out, "trainer.device=cpu", "trainer.max_steps=100000")
    args += ["trainer.num_workers=1", "trainer.eval_bootstrap=200", "trainer.eval_caption_shuffles=1"]
    # its own process group, as a terminal's foreground job: the SIGINT reaches the DataLoader worker too
    proc = subprocess.Popen(
        [sys.executable, "-m", "adapter_trainer", *args], cwd=REPO, env=ENV, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while len(_train_steps(out)) < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr + stdout and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    m = re.fullmatch(r"interrupted at step (\d+); resume with (python -m adapter_trainer .*)", last)
    assert m, stderr[-2000:]
    step, command = int(m.group(1)), m.group(2)
    assert 3 <= step < 100000 and _train_steps(out)[-1] == step
    assert (out / "checkpoints" / f"step-{step:06d}" / "adapter.safetensors").is_file()
    assert json.loads((out / "checkpoints" / f"step-{step:06d}" / "progress.json").read_text())["step"] == step

    # the printed command, as a shell splits it, continues the run from that step (two more steps)
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "adapter_trainer"] and "trainer.resume=latest" in argv
    resumed = subprocess.run(
        [sys.executable, *argv[1:], f"trainer.max_steps={step + 2}"], cwd=REPO, env=ENV, text=True,
        capture_output=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"at step {step} " in resumed.stdout and f"resume: trainer.max_steps: 100000 -> {step + 2}" in resumed.stdout
    assert _train_steps(out)[-3:] == [step, step + 1, step + 2]
    assert json.loads((out / "final_metrics.json").read_text())["step"] == step + 2
    # and the run ends with what comes next
    assert "next steps:" in resumed.stdout and f"python -m adapter_trainer.export {out}" in resumed.stdout


def test_a_second_ctrl_c_stops_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(interrupt.time, "monotonic", lambda: clock[0])
    stop = interrupt.StopOnInterrupt(RankInfo()).install()
    try:
        assert not stop.requested()
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested()
        clock[0] += 0.5
        os.kill(os.getpid(), signal.SIGINT)  # torchrun's forwarded copy of the same Ctrl-C: still one
        clock[0] += interrupt.SAME_CTRL_C_S
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs between bytecodes: the sleep is interrupted
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handed back
    finally:
        interrupt.uninstall()


def test_a_ctrl_c_outside_training_ends_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from adapter_trainer.training import recipe

    def interrupted(cfg):
        raise KeyboardInterrupt  # while the models load

    monkeypatch.setattr(recipe, "recipe_main", interrupted)
    capfd.readouterr()
    code = run_module_in_process("adapter_trainer", "+experiment=demo", f"trainer.output_dir={tmp_path / 'run'}")
    err = capfd.readouterr().err.strip()
    assert code == 130 and err == "adapter_trainer: stopped (Ctrl-C); no checkpoint was written, nothing to resume"
    assert not (tmp_path / "run").exists()  # a run that never started leaves no run dir


@pytest.mark.budget(90, reason="a 2-rank torchrun launch of the real entry point")
def test_under_torchrun_a_ctrl_c_on_one_rank_stops_every_rank_after_the_same_step(models, shards, tmp_path: Path):
    out = tmp_path / "ddp"
    ov = tiny_demo_overrides(models, shards, out, "trainer.device=cpu", "trainer.max_steps=50", "trainer.batch_size=1")
    ov += ["trainer.num_workers=0", "trainer.eval_bootstrap=200", "trainer.eval_caption_shuffles=1"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "tests.trainer.interrupted_train", "3", "1", *ov]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, text=True, capture_output=True, timeout=300)
    assert proc.returncode != 0, proc.stdout[-2000:]  # torchrun reports the ranks' 130 as a failure
    assert "KeyboardInterrupt" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("interrupted at step 3; resume with torchrun --nproc_per_node=2 -m adapter_trainer") == 1
    assert _train_steps(out) == [1, 2, 3]  # rank 0 was never signalled, and stopped with rank 1
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000003"]
