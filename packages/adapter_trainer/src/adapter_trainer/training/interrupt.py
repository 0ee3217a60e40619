"""Ctrl-C and SIGTERM during training: the first finishes the current step, checkpoints it and raises
`TrainingInterrupted` (exit 130 / 143, one line naming the resume command); a second stops at once.

Under torchrun the ranks agree at every step boundary (one all-reduce of the flags), so all stop after the same step
even when one rank got the signal. SIGINTs within `SAME_CTRL_C_S` of the first are that one (torchrun forwards the
terminal's); torchrun kills its workers 30 s after forwarding, so a step must end within that.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:  # torch is imported where a flag is reduced: the command imports TrainingInterrupted up front
    from adapter_trainer.training.distributed import RankInfo

SAME_CTRL_C_S = 2.0  # a second SIGINT sooner than this after the first is the same Ctrl-C (torchrun's forwarded copy)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_previous: list[tuple[int, Any]] = []  # (signal, its handler before `StopOnInterrupt.install`), restored by `uninstall`
last_signal: list[int] = []  # the signal that stopped training, when one did (for the command's exit code and line)


def stop_at_once_on_sigterm() -> Any:
    """Outside the training loop, SIGTERM raises KeyboardInterrupt as Ctrl-C does, so the command says how it ended.
    Main thread only; returns the handler it replaced (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    owner = os.getpid()

    def stop(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a forked child (a DataLoader worker before its init ran): the parent decides
            return
        last_signal[:] = [signum]
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, stop)


def exit_code(signum: int) -> int:
    """128 + the signal number, as a shell reports a command a signal stopped: 130 for Ctrl-C, 143 for SIGTERM."""
    return 128 + int(signum)


def signal_words(signum: int) -> str:
    """How the command's last line names the signal: "Ctrl-C" or "SIGTERM"."""
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


class TrainingInterrupted(Exception):
    """The run stopped after `step` on a Ctrl-C or SIGTERM (`signum`), with a checkpoint at that step."""

    def __init__(self, step: int, checkpoint: Path, signum: int = signal.SIGINT) -> None:
        super().__init__(f"interrupted at step {step}; checkpoint {checkpoint}")
        self.step, self.checkpoint, self.signum = step, checkpoint, signum


class StopOnInterrupt:
    """The training loop's SIGINT and SIGTERM handler: `requested()` at each step boundary says whether any rank was
    interrupted."""

    def __init__(self, dist: RankInfo) -> None:
        self.dist = dist
        self.owner = os.getpid()  # a forked child inherits the handler: only this process acts on a signal
        self.first: float | None = None  # time.monotonic() of the first SIGINT / SIGTERM
        self.signum: int = signal.SIGINT  # the signal the ranks stop on (SIGTERM when any rank got one)

    def install(self) -> StopOnInterrupt:
        """Take over SIGINT and SIGTERM (the main thread only: Python runs signal handlers there)."""
        if threading.current_thread() is threading.main_thread():
            last_signal.clear()
            for sig in STOP_SIGNALS:
                _previous.append((sig, signal.signal(sig, self._on_signal)))
        return self

    def _on_signal(self, signum: int, frame: Any) -> None:
        if os.getpid() != self.owner:  # a DataLoader worker forked before its init ignored the signals
            return
        now = time.monotonic()
        last_signal[:] = [signum]
        if self.first is None:
            self.first, self.signum = now, signum
            if self.dist.is_main:
                again = "Ctrl-C again" if signum == signal.SIGINT else "send it again"
                print(
                    f"\n{signal_words(signum)}: finishing this step, then a checkpoint at it ({again} to stop at once)",
                    file=sys.stderr,
                    flush=True,
                )
        elif now - self.first > SAME_CTRL_C_S:
            uninstall()
            raise KeyboardInterrupt

    def requested(self) -> bool:
        """Whether the ranks stop after this step (any rank's signal; SIGTERM when any got one)."""
        import torch

        got = self.first is not None
        flags = torch.tensor([float(got), float(got and self.signum == signal.SIGTERM)], dtype=torch.float32)
        total = self.dist.all_reduce_sum(flags)
        if total[1].item() > 0:
            self.signum = signal.SIGTERM
        return bool(total[0].item() > 0)

    def checkpoint_and_stop(self, recipe: Any) -> NoReturn:
        """Checkpoint the recipe's step (rank 0, unless it exists), close the loggers, raise TrainingInterrupted."""
        step = recipe.progress.step
        ckpt = Path(recipe.output_dir) / "checkpoints" / f"step-{step:06d}"
        # rank 0 writes it unless it exists; no rank leaves before it is written, a failed write stops every rank
        recipe.dist.run_on_main(lambda: None if ckpt.exists() else recipe.save_checkpoint())
        recipe.logger.close()
        uninstall()
        raise TrainingInterrupted(step, ckpt, self.signum)


def uninstall() -> None:
    """Give SIGINT and SIGTERM back to the handlers they had before `install` (a no-op when none is installed)."""
    while _previous:
        sig, handler = _previous.pop()
        signal.signal(sig, handler)
