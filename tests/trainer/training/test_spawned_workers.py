"""DataLoader workers started with `spawn`, as on macOS (and Windows), where the default is not `fork`: the train
batches are pickled into fresh interpreters instead of inherited. The run must train on the same batches as the
in-process loader (equal losses, one thread each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO
from tests.trainer.helpers import make_cfg

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.multiprocess]

RUN = ("trainer.max_steps=2", "trainer.grad_accum_steps=2")
SPAWNED = """
import multiprocessing, sys
import torch
from pathlib import Path
from tests.trainer.helpers import make_cfg
from adapter_trainer.training.recipe import recipe_main

multiprocessing.set_start_method("spawn", force=True)
torch.set_num_threads(1)
models = {"llm": Path(sys.argv[1]), "musicgen": Path(sys.argv[2])}
recipe_main(make_cfg(models, Path(sys.argv[3]), Path(sys.argv[4]), *sys.argv[5:]))
"""


def losses(run: Path) -> list[float]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r["train/loss"] for r in map(json.loads, lines) if "train/loss" in r]


@pytest.mark.budget(60, reason="spawned DataLoader workers each start a fresh interpreter and import torch")
def test_spawned_workers_train_on_the_same_batches(models, shards, tmp_path: Path) -> None:
    from adapter_trainer.training.recipe import recipe_main

    recipe_main(make_cfg(models, shards, tmp_path / "inline", *RUN, "trainer.num_workers=0"))
    args = [str(models["llm"]), str(models["musicgen"]), str(shards), str(tmp_path / "spawned")]
    proc = subprocess.run(
        [sys.executable, "-c", SPAWNED, *args, *RUN, "trainer.num_workers=2"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "workers/rank=2" in proc.stdout
    assert losses(tmp_path / "spawned") == losses(tmp_path / "inline")
