"""`python -m tests.pipeline.faulty_encode <stage 1 overrides>` (torchrun -m works too, each rank raising): the real
`python -m tokenizer_pipeline` entry point, with a bug planted in the encoder's loop: the process's second shard
raises `RuntimeError(FAULT)`, after its decode workers started and its first shard was saved. `run_with_second_shard`
is the harness (tests/pipeline/held_encode.py plants another second shard)."""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable

from tokenizer_pipeline.run import pipeline

FAULT = "a bug planted in the shard encoder"


def run_with_second_shard(second: Callable[[], None]) -> None:
    """Run `python -m tokenizer_pipeline` with this process's argv; `second()` runs before its second shard."""
    encode = pipeline.encode_shard
    calls = []

    def planted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            second()
        return encode(*args, **kwargs)

    pipeline.encode_shard = planted
    sys.argv = ["tokenizer_pipeline", *sys.argv[1:]]
    runpy.run_module("tokenizer_pipeline", run_name="__main__", alter_sys=True)


def _raise() -> None:
    raise RuntimeError(FAULT)


if __name__ == "__main__":
    run_with_second_shard(_raise)
