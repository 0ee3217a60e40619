"""`python -m tests.trainer.faulty_train <hydra overrides>` (cwd: the repository root; torchrun -m works too): the real
`python -m adapter_trainer` entry point, with a bug planted in the batch builder: every DataLoader worker raises
`RuntimeError(FAULT)` on its first micro-batch (the training process, building batches itself without workers,
does not). What a run meets when its own code fails inside a worker, after the loader started."""

from __future__ import annotations

import runpy
import sys

import torch

from adapter_trainer.data.streaming import TrainBatches

FAULT = "a bug planted in the batch builder"


def main() -> None:
    build = TrainBatches.__getitem__

    def faulty(self: TrainBatches, start: int):
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError(FAULT)
        return build(self, start)

    TrainBatches.__getitem__ = faulty  # type: ignore[method-assign]
    sys.argv = ["adapter_trainer", *sys.argv[1:]]
    runpy.run_module("adapter_trainer", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
