"""`python -m tests.pipeline.held_encode <stage 1 overrides>`: the real `python -m tokenizer_pipeline` entry point,
with the encoder's loop held: once its first shard is kept, the process touches `$HELD_ENCODE_MARK` and its second
shard waits (in Python, as a long encode would) until a signal stops the run."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.pipeline.faulty_encode import run_with_second_shard


def _hold() -> None:
    Path(os.environ["HELD_ENCODE_MARK"]).touch()  # shard 1's record is saved before shard 2 starts
    while True:
        time.sleep(0.05)


if __name__ == "__main__":
    run_with_second_shard(_hold)
