"""Ctrl-C during training: the first one finishes the current step, saves a checkpoint at it and stops the run with
`TrainingInterrupted` (the command prints "interrupted at step N; resume with ..." and exits 130, no traceback); a
second one stops at once (KeyboardInterrupt).

Under torchrun a terminal's Ctrl-C reaches every rank (and torchrun forwards its own SIGINT to them): each rank
sets its flag, and the ranks agree at every step boundary (one all-reduce of the flags), so all of them stop after
the same step and rank 0 checkpoints that step, even when the signal reached only one rank. SIGINTs within
`SAME_CTRL_C_S` seconds of the first count as that one (the terminal's and torchrun's copies arrive together);
torchrun kills its workers 30 s after forwarding, so a step must end within that time for the checkpoint to be saved.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:  # torch is imported where a flag is reduced: the command imports TrainingInterrupted up front
    from adapter_trainer.training.distributed import RankInfo

SAME_CTRL_C_S = 2.0  # a second SIGINT sooner than this after the first is the same Ctrl-C (torchrun's forwarded copy)
INTERRUPTED_EXIT = 130  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C

_previous: list[Any] = []  # the SIGINT handler before `StopOnInterrupt.install` (restored by `uninstall`)


class TrainingInterrupted(Exception):
    """The run stopped after `step` on a Ctrl-C, with a checkpoint at that step."""

    def __init__(self, step: int, checkpoint: Path) -> None:
        super().__init__(f"interrupted at step {step}; checkpoint {checkpoint}")
        self.step, self.checkpoint = step, checkpoint


class StopOnInterrupt:
    """The training loop's SIGINT handler: `requested()` at each step boundary says whether any rank was
    interrupted."""

    def __init__(self, dist: RankInfo) -> None:
        self.dist = dist
        self.first: float | None = None  # time.monotonic() of the first SIGINT

    def install(self) -> StopOnInterrupt:
        """Take over SIGINT (the main thread only: Python runs signal handlers there)."""
        if threading.current_thread() is threading.main_thread():
            _previous.append(signal.signal(signal.SIGINT, self._on_sigint))
        return self

    def _on_sigint(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
            if self.dist.is_main:
                print(
                    "\nCtrl-C: finishing this step, then a checkpoint at it (Ctrl-C again to stop at once)",
                    file=sys.stderr,
                    flush=True,
                )
        elif now - self.first > SAME_CTRL_C_S:
            uninstall()
            raise KeyboardInterrupt

    def requested(self) -> bool:
        """Whether every rank stops after this step: any rank's Ctrl-C, summed over the ranks (identity alone)."""
        import torch

        flag = torch.tensor([0.0 if self.first is None else 1.0], dtype=torch.float64)
        return bool(self.dist.all_reduce_sum(flag).item() > 0)

    def checkpoint_and_stop(self, recipe: Any) -> NoReturn:
        """Save a checkpoint at the recipe's step (rank 0; one `ckpt_every` just wrote is kept), close its metric
        files and raise TrainingInterrupted on every rank."""
        step = recipe.progress.step
        ckpt = Path(recipe.output_dir) / "checkpoints" / f"step-{step:06d}"
        if recipe.dist.is_main and not ckpt.exists():
            ckpt = recipe.save_checkpoint()
        recipe.dist.barrier()  # no rank leaves before the checkpoint is written
        recipe.logger.close()
        uninstall()
        raise TrainingInterrupted(step, ckpt)


def uninstall() -> None:
    """Give SIGINT back to the handler it had before `install` (a no-op when none is installed)."""
    while _previous:
        signal.signal(signal.SIGINT, _previous.pop())
