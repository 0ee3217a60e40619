"""`python -m tests.pipeline.faulty_encode <stage 1 overrides>` (torchrun -m works too, each rank raising): the real
`python -m tokenizer_pipeline` entry point, with a bug planted in the encoder's loop: the process's second shard
raises `RuntimeError(FAULT)`, after its decode workers started and its first shard was saved."""

from __future__ import annotations

import runpy
import sys

from tokenizer_pipeline.run import pipeline

FAULT = "a bug planted in the shard encoder"


def main() -> None:
    encode = pipeline.encode_shard
    calls = []

    def faulty(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError(FAULT)
        return encode(*args, **kwargs)

    pipeline.encode_shard = faulty
    sys.argv = ["tokenizer_pipeline", *sys.argv[1:]]
    runpy.run_module("tokenizer_pipeline", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
