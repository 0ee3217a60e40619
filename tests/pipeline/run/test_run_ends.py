"""Stage 1 ends on every path and leaves no process behind (tests/run_end.py): an error raised in the encoding loop
after its decode workers started (2 of them) ends the run at once, and the shards finished before it are kept for
the rerun. (Stage 1's decode workers ignore SIGINT and exit 0 on SIGTERM, so multiprocessing's exit hook still ends
them; the loop closes them itself, on every way out. Signals: tests/pipeline/run/test_stop_signals.py.)"""

from __future__ import annotations

import os
import sys

import pytest

from tests import REPO
from tests.pipeline.faulty_encode import FAULT
from tests.pipeline.helpers import make_corpus
from tests.run_end import run_to_end

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds a run's processes in /proc")


@pytest.mark.budget(60, reason="stage 1 in a subprocess that imports torch and the codec, with 2 decode workers")
def test_an_error_in_the_encoding_loop_ends_the_run_and_its_decode_workers(tiny_codec, tmp_path) -> None:
    csv_path, audio_dir, _ = make_corpus(tmp_path / "corpus", n_train=6, n_eval=2)
    out = tmp_path / "shards"
    args = [f"csv={csv_path}", f"audio_dir={audio_dir}", f"out_dir={out}", f"codec.name_or_path={tiny_codec}",
            "codec.device=cpu", "shard.max_samples=1", "min_seconds=0.5", "threads=1", "workers=2", "prefetch=1"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ended = run_to_end([sys.executable, "-m", "tests.pipeline.faulty_encode", *args], env=env, cwd=REPO, end_line=FAULT)
    assert ended.returncode == 1, ended.stderr[-3000:]
    assert ended.exit_after_end_line_s is not None
    # the first shard was finished before the second raised: kept, with its record, for the rerun
    assert (out / "train" / "shard-000000.tar").is_file() and (out / ".progress" / "train-shard-000000.json").is_file()
