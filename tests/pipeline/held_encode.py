"""`python -m tests.pipeline.held_encode <stage 1 overrides>`: the real `python -m tokenizer_pipeline` entry point,
with the encoder's loop held: once its first shard is kept, the process touches `$HELD_ENCODE_MARK` and its second
shard waits (in Python, as a long encode would) until a signal stops the run."""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path

from tokenizer_pipeline.run import pipeline


def main() -> None:
    encode = pipeline.encode_shard
    calls = []

    def held(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            Path(os.environ["HELD_ENCODE_MARK"]).touch()  # shard 1's record is saved before shard 2 starts
            while True:
                time.sleep(0.05)
        return encode(*args, **kwargs)

    pipeline.encode_shard = held
    sys.argv = ["tokenizer_pipeline", *sys.argv[1:]]
    runpy.run_module("tokenizer_pipeline", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
