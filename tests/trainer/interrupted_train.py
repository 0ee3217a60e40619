"""Run the real `python -m adapter_trainer` entry point with a Ctrl-C that reaches one rank alone, at a known step.

    torchrun --nproc_per_node=2 -m tests.trainer.interrupted_train STEP RANK <hydra overrides>

Rank RANK sends SIGINT to itself as it fetches the micro-batches of step STEP (after the previous step's boundary);
every other rank gets none. The package's `__main__` runs unchanged (runpy, as `python -m` runs it).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys

from adapter_trainer.training.recipe import MoTAdapterRecipe


def main() -> None:
    step, rank = int(sys.argv[1]), int(sys.argv[2])
    sys.argv = ["adapter_trainer", *sys.argv[3:]]
    fetch = MoTAdapterRecipe.next_train_batch
    sent: list[bool] = []

    def next_train_batch(self: MoTAdapterRecipe, batches):
        if self.dist.rank == rank and self.progress.step == step - 1 and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)
        return fetch(self, batches)

    MoTAdapterRecipe.next_train_batch = next_train_batch
    runpy.run_module("adapter_trainer", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
