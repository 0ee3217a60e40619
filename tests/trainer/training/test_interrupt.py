"""Ctrl-C during training (training.interrupt): the first finishes the step, checkpoints it and exits 130 with the
exact command that resumes the run, without a traceback; the resume continues from that step; a second Ctrl-C stops
at once; under torchrun a Ctrl-C that reached one rank stops every rank after the same step. A job scheduler's
SIGTERM is handled like a Ctrl-C and exits 143."""

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
from types import SimpleNamespace

import pytest
import torch

from adapter_trainer.training import interrupt
from adapter_trainer.training.distributed import RankInfo
from adapter_trainer.training.metric_logging import read_jsonl
from tests import REPO
from tests.run_end import run_to_end
from tests.trainer.helpers import run_module_in_process, tiny_demo_overrides

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _train_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    return [r["step"] for r in read_jsonl(path) if "train/loss" in r] if path.is_file() else []


def _signal_a_run(models, shards, out: Path, sig: int) -> tuple[int, str, str]:
    """A real training process (with a DataLoader worker) sent `sig` after its third step, as a terminal's Ctrl-C or
    a job scheduler's SIGTERM reaches every process of the job: (exit code, stdout, stderr). It must end, and leave
    no process behind (tests/run_end.py)."""
    args = tiny_demo_overrides(models, shards, out, "trainer.device=cpu", "trainer.max_steps=100000")
    args += ["trainer.num_workers=1", "trainer.eval_bootstrap=200", "trainer.eval_caption_shuffles=1"]
    ended = run_to_end([sys.executable, "-m", "adapter_trainer", *args], env=ENV, cwd=REPO,
                       signal_when=(lambda: len(_train_steps(out)) >= 3, sig))  # fmt: skip
    return ended.returncode, ended.stdout, ended.stderr


def _checkpointed_step(out: Path, stdout: str, stderr: str, pattern: str) -> tuple[int, str]:
    """The step and resume command of the run's last line (`pattern`), checked against its checkpoint and metrics."""
    assert "Traceback" not in stderr + stdout and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    m = re.fullmatch(pattern, last)
    assert m, stderr[-2000:]
    step, command = int(m.group(1)), m.group(2)
    assert 3 <= step < 100000 and _train_steps(out)[-1] == step
    assert (out / "checkpoints" / f"step-{step:06d}" / "adapter.safetensors").is_file()
    assert json.loads((out / "checkpoints" / f"step-{step:06d}" / "progress.json").read_text())["step"] == step
    return step, command


@pytest.mark.budget(120, reason="two real training processes: one stopped by SIGINT, then its resume")
def test_ctrl_c_checkpoints_the_step_and_prints_the_resume_command(models, shards, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, stdout, stderr = _signal_a_run(models, shards, out, signal.SIGINT)
    assert code == 130, stderr[-3000:]
    step, command = _checkpointed_step(
        out, stdout, stderr, r"interrupted at step (\d+); resume with (python -m adapter_trainer .*)"
    )

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


@pytest.mark.budget(60, reason="a real training process stopped by SIGTERM")
def test_a_schedulers_sigterm_checkpoints_the_step_and_exits_143(models, shards, tmp_path: Path) -> None:
    """SLURM at its time limit (or scancel) sends SIGTERM to every process of the job, the DataLoader worker too,
    and kills it some seconds later: the step finishes, is checkpointed, and the run says how to resume."""
    out = tmp_path / "run"
    code, stdout, stderr = _signal_a_run(models, shards, out, signal.SIGTERM)
    assert code == 143, stderr[-3000:]
    assert "SIGTERM: finishing this step" in stderr
    _, command = _checkpointed_step(
        out, stdout, stderr, r"stopped by SIGTERM at step (\d+); resume with (python -m adapter_trainer .*)"
    )
    assert "trainer.resume=latest" in shlex.split(command)


def test_the_ranks_agree_on_sigterm_when_any_rank_got_it() -> None:
    """A rank that got SIGINT stops with the others on SIGTERM when another rank got that (the sum of the flags)."""
    others = [torch.zeros(2)]  # the other ranks' flags: none, then one rank's SIGTERM
    dist = SimpleNamespace(is_main=True, all_reduce_sum=lambda t: t + others[0])
    before = signal.getsignal(signal.SIGTERM)
    stop = interrupt.StopOnInterrupt(dist).install()
    try:
        assert not stop.requested()
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested() and stop.signum == signal.SIGINT
        others[0] = torch.tensor([1.0, 1.0])
        assert stop.requested() and stop.signum == signal.SIGTERM
        assert interrupt.exit_code(stop.signum) == 143 and interrupt.signal_words(stop.signum) == "SIGTERM"
    finally:
        interrupt.uninstall()
    assert signal.getsignal(signal.SIGTERM) is before  # handed back


def test_a_second_ctrl_c_stops_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(interrupt.time, "monotonic", lambda: clock[0])
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)  # Python's own, whatever ran before here
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
        signal.signal(signal.SIGINT, inherited)


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


@pytest.mark.parametrize("when", ["setup", "final_eval"])
def test_a_sigterm_outside_the_loop_ends_in_one_line_keeping_the_last_step(
    when: str, models, shards, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A scheduler's SIGTERM while the models load or during the final eval (which takes minutes at real size):
    one line, exit 143, the final step's checkpoint kept (it is written before the final eval); the caller's SIGTERM
    handler is back afterwards."""
    from adapter_trainer.training.recipe import MoTAdapterRecipe

    hook = {"setup": "setup", "final_eval": "evaluate"}[when]
    original = getattr(MoTAdapterRecipe, hook)

    def signalled(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)  # the handler runs between bytecodes: here, before the original starts
        return original(self, *args, **kwargs)

    monkeypatch.setattr(MoTAdapterRecipe, hook, signalled)
    out = tmp_path / "run"
    before = signal.getsignal(signal.SIGTERM)
    capfd.readouterr()
    code = run_module_in_process("adapter_trainer", *tiny_demo_overrides(models, shards, out, "trainer.device=cpu",
                                 "trainer.max_steps=3", "trainer.num_workers=0", "trainer.eval_bootstrap=50"))  # fmt: skip
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 143 and signal.getsignal(signal.SIGTERM) is before, err[-5:]
    if when == "setup":
        assert err[-1] == "adapter_trainer: stopped (SIGTERM); no checkpoint was written, nothing to resume", err[-5:]
        assert not out.exists()  # a run that never started leaves no run dir
    else:
        assert err[-1].startswith("adapter_trainer: stopped (SIGTERM); the newest checkpoint is step-000003; resume "
                                  "with python -m adapter_trainer "), err[-5:]  # fmt: skip
        assert (out / "checkpoints" / "step-000003" / "adapter.safetensors").is_file()


@pytest.mark.multiprocess
@pytest.mark.budget(90, reason="a 2-rank torchrun launch of the real entry point")
def test_under_torchrun_a_ctrl_c_on_one_rank_stops_every_rank_after_the_same_step(models, shards, tmp_path: Path):
    out = tmp_path / "ddp"
    ov = tiny_demo_overrides(models, shards, out, "trainer.device=cpu", "trainer.max_steps=50", "trainer.batch_size=1")
    ov += ["trainer.num_workers=0", "trainer.eval_bootstrap=200", "trainer.eval_caption_shuffles=1"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "tests.trainer.interrupted_train", "3", "1", *ov]  # fmt: skip
    proc = run_to_end(cmd, env=ENV, cwd=REPO)  # every rank and torchrun end; nothing left behind
    assert proc.returncode != 0, proc.stdout[-2000:]  # torchrun reports the ranks' 130 as a failure
    assert "KeyboardInterrupt" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("interrupted at step 3; resume with torchrun --nproc_per_node=2 -m adapter_trainer") == 1
    assert _train_steps(out) == [1, 2, 3]  # rank 0 was never signalled, and stopped with rank 1
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000003"]


def test_a_forked_child_leaves_the_signal_to_its_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DataLoader worker forked before its init set SIG_IGN inherits the handlers: in it they do nothing (SLURM's
    SIGTERM reaches every process of the job; the worker must not raise in its bootstrap)."""
    previous = interrupt.stop_at_once_on_sigterm()  # as the command installs it, then the loop its own
    stop = interrupt.StopOnInterrupt(SimpleNamespace(is_main=True, all_reduce_sum=lambda t: t)).install()
    try:
        monkeypatch.setattr(interrupt.os, "getpid", lambda: -1)  # as seen from a child
        stop._on_signal(signal.SIGTERM, None)
        assert stop.first is None
        interrupt.uninstall()  # back to the outer handler: the one outside the loop
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # no KeyboardInterrupt in the child
    finally:
        interrupt.uninstall()
        signal.signal(signal.SIGTERM, previous)
