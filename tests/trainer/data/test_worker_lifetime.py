"""data.worker_lifetime: DataLoader workers that ignore SIGTERM (as the training batch workers do) end when the loop is
left, even one stuck in a read, and when a process exits with an iterator still alive; they die with a parent killed
outright (tests/trainer/training/test_every_run_ends.py runs the real trainer through each of these)."""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap
import time

import pytest
import torch

from adapter_trainer.data.streaming import _worker_init
from adapter_trainer.data.worker_lifetime import closing_workers, start_workers
from tests import REPO
from tests.run_end import run_to_end


class StuckAfterFirst(torch.utils.data.Dataset):
    """Even items at once; odd ones block for an hour (a read that never returns): with 2 workers, the second one is
    stuck in its first item."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> torch.Tensor:
        if i % 2:
            time.sleep(3600)
        return torch.tensor([i])


def loader(dataset: torch.utils.data.Dataset) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, worker_init_fn=_worker_init)


@pytest.mark.budget(60, reason="torch's shutdown waits 5 s for each worker stuck in its read before it is killed")
@pytest.mark.parametrize("left_by", ["its end", "an error"])
def test_leaving_the_loop_ends_workers_stuck_in_a_read_that_ignore_sigterm(left_by: str) -> None:
    workers = []
    with contextlib.suppress(KeyError), closing_workers(start_workers(loader(StuckAfterFirst()))) as batches:
        assert int(next(batches)) == 0
        workers = list(batches._workers)  # type: ignore[attr-defined]
        assert len(workers) == 2 and all(w.is_alive() for w in workers)
        if left_by == "an error":
            raise KeyError("a refusal raised in the loop")
    assert workers and not any(w.is_alive() for w in workers)
    assert all(w.exitcode is not None for w in workers)


LEFT_ALIVE = textwrap.dedent(
    """
    import sys
    from tests.trainer.data.test_worker_lifetime import StuckAfterFirst, loader
    from adapter_trainer.data.worker_lifetime import start_workers

    batches = start_workers(loader(StuckAfterFirst()))  # a global: alive until the interpreter's exit
    next(batches)
    print("workers started", flush=True)
    sys.exit(3)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the run's processes in /proc")
@pytest.mark.budget(60, reason="a subprocess that imports torch and starts 2 workers")
def test_a_process_that_exits_with_its_iterator_alive_ends_its_workers() -> None:
    """multiprocessing's exit hook sends SIGTERM (ignored) and waits for ever; the module's own hook runs first."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ended = run_to_end([sys.executable, "-c", LEFT_ALIVE], env=env, cwd=REPO, end_line="workers started")
    assert ended.returncode == 3, ended.stderr[-3000:]
