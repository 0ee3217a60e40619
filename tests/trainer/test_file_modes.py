"""Files the trainer writes are readable by others as the umask says, safetensors included.

safetensors' save_file (and save_pretrained through it) writes 0600 whatever the umask: a checkpoint, an exported
adapter or the demo models on a shared cluster disk could not be read by a teammate. Every write goes through
`adapter_trainer.file_modes`; these tests set the umask themselves, so they do not depend on the caller's.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch

from adapter_trainer.file_modes import follow_umask, process_umask, save_safetensors


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


@pytest.fixture(params=[0o022, 0o027], ids=["umask022", "umask027"])
def umask(request: pytest.FixtureRequest):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def test_process_umask_reads_without_changing_it(umask: int) -> None:
    assert process_umask() == umask and process_umask() == umask


def test_save_safetensors_gives_the_mode_open_gives(tmp_path: Path, umask: int) -> None:
    save_safetensors({"w": torch.zeros(2)}, tmp_path / "a.safetensors", metadata={"format": "pt"})
    (tmp_path / "b.json").write_text("{}")
    assert mode(tmp_path / "a.safetensors") == mode(tmp_path / "b.json") == 0o666 & ~umask


def test_follow_umask_mends_a_whole_folder(tmp_path: Path, umask: int) -> None:
    (tmp_path / "sub").mkdir()
    for f in (tmp_path / "x", tmp_path / "sub" / "y"):
        f.write_text("1")
        f.chmod(0o600)  # what safetensors leaves
    follow_umask(tmp_path)
    assert [mode(f) for f in files_under(tmp_path)] == [0o666 & ~umask] * 2


def test_a_checkpoint_is_readable_as_the_umask_says(tmp_path: Path, umask: int) -> None:
    from adapter_trainer.training.checkpoint import TrainingProgress, save_checkpoint

    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.AdamW([p])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ckpt = save_checkpoint(
        tmp_path,
        adapter={"p": p},
        optimizer=opt,
        scheduler=sched,
        scaler=None,
        progress=TrainingProgress(step=1),
        fingerprint={},
        config_yaml="{}\n",
    )
    files = files_under(ckpt)
    assert "adapter.safetensors" in {f.name for f in files}
    assert {f.name: mode(f) for f in files} == {f.name: 0o666 & ~umask for f in files}


def test_the_demo_models_are_readable_as_the_umask_says(tmp_path: Path, umask: int) -> None:
    from adapter_trainer.demo.models import write_demo_models

    dirs = write_demo_models(tmp_path, seed=0)
    files = [f for d in dirs.values() for f in files_under(Path(d))]
    assert any(f.suffix == ".safetensors" for f in files)
    assert {str(f): mode(f) for f in files} == {str(f): 0o666 & ~umask for f in files}
