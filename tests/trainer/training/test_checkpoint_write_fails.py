"""A checkpoint that cannot be written (a full disk, a failed write) ends stage 2 in one line naming the directory,
that it is full, and the resume command; no temp dir stays, and the newest complete checkpoint is the one
trainer.resume=latest finds."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
import torch

from adapter_trainer.training import checkpoint
from tests.trainer.helpers import run_module_in_process, tiny_demo_overrides

pytestmark = pytest.mark.usefixtures("reused_tokenizers")


@pytest.mark.parametrize(("free", "says"), [(0, "the filesystem of {ckpts} is full; free space there"),
                                            (1 << 40, "a write into {ckpts} failed (")])  # fmt: skip
def test_a_checkpoint_that_cannot_be_written_is_one_line_and_the_previous_checkpoint_resumes(
    models, shards, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], free, says
) -> None:
    """The second checkpoint's optimizer.pt fails as torch's own writer fails on a full disk (a RuntimeError of its
    C++ stream, no errno); the free space the filesystem reports decides the words."""
    out = tmp_path / "run"
    ckpts = out / "checkpoints"
    args = tiny_demo_overrides(models, shards, out, "trainer.device=cpu", "trainer.max_steps=3",
                               "trainer.ckpt_every=1")  # fmt: skip
    save, calls = torch.save, []

    def full(obj, f, *a, **k):
        if str(f).endswith("optimizer.pt"):
            calls.append(f)
            if len(calls) == 2:
                raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
        return save(obj, f, *a, **k)

    usage = shutil.disk_usage
    monkeypatch.setattr(checkpoint.torch, "save", full)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: usage(p)._replace(free=free))
    capfd.readouterr()
    code = run_module_in_process("adapter_trainer", *args)
    captured = capfd.readouterr()
    assert code == 2, (code, captured.out[-2000:], captured.err[-2000:])
    last = captured.err.strip().splitlines()[-1]
    assert last.startswith("adapter_trainer: error: checkpoint step-000002 not written: "), last
    assert says.format(ckpts=ckpts) in last and "the newest checkpoint is step-000001" in last, last
    assert "trainer.resume=latest" in last
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-000001"]  # no .step-000002.tmp
    assert checkpoint.find_checkpoint("latest", out) == ckpts / "step-000001"

    monkeypatch.setattr(checkpoint.torch, "save", save)  # room made: the printed resume continues the run
    assert run_module_in_process("adapter_trainer", *args, "trainer.resume=latest") == 0
    assert (ckpts / "step-000003").is_dir()


def test_a_full_disk_under_the_metrics_is_one_line_naming_the_newest_checkpoint(
    models, shards, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from adapter_trainer.training import metric_logging

    out = tmp_path / "run"
    args = tiny_demo_overrides(models, shards, out, "trainer.device=cpu", "trainer.max_steps=3",
                               "trainer.ckpt_every=1")  # fmt: skip
    log = metric_logging.JsonlLogger.log_dict

    def full(self, payload, step):
        if step == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "metrics.jsonl"))
        return log(self, payload, step)

    monkeypatch.setattr(metric_logging.JsonlLogger, "log_dict", full)
    capfd.readouterr()
    code = run_module_in_process("adapter_trainer", *args)
    err = capfd.readouterr().err.strip()
    assert code == 2 and "Traceback" not in err, err[-3000:]
    last = err.splitlines()[-1]
    assert f"the filesystem of {out} is full (No space left on device" in last, last
    assert "the newest checkpoint is step-000001; resume with" in last, last
