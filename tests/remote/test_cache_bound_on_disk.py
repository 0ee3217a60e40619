"""The shard cache never holds more than data.cache.max_bytes on disk, as `du -sb` counts the directory (tars, downloads
in flight, index sidecars, locks, counters, the directories themselves), polled while a real training run reads a
remote set over S3 and over HTTP at a tight bound, with prefetch and 2 DataLoader workers; and its count is du's."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

from adapter_trainer.data.remote.cache import BOOKKEEPING_BYTES, ShardCache
from tests import REPO
from tests.contract.shard_fixture import write_synthetic_set
from tests.remote.disk import du_bytes
from tests.run_end import run_to_end
from tests.trainer.helpers import tiny_demo_overrides

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="du -sb and /proc")


@pytest.fixture(scope="module")
def v5_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 train clips in 15 shards, 8 eval clips in 2; format 5 (each split's index sidecar is as large as 4 shards)."""
    root = tmp_path_factory.mktemp("bound") / "set"
    return write_synthetic_set(root, n_train=60, n_eval=8, frames=(100, 200), samples_per_shard=4)


def tight_bound(root: Path) -> int:
    """Room for one index sidecar and a third of the tars: the other sidecar and most tars are evicted or not kept."""
    splits = json.loads((root / "manifest.json").read_text())["splits"].values()
    tars = sum(s["bytes"] for split in splits for s in split["shards"])
    return BOOKKEEPING_BYTES + max(split["index"]["bytes"] for split in splits) + tars // 3


class Footprint:
    """A thread that polls `du -sb` of a directory until stopped: the largest value seen."""

    def __init__(self, root: Path) -> None:
        self.root, self.peak, self.polls = root, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, du_bytes(self.root))
            self.polls += 1
            self._stop.wait(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=30)
        return self.peak


@pytest.mark.budget(60, reason="a real 12-step training run from a remote set, its disk polled throughout")
@pytest.mark.parametrize("store", ["s3", "http"])
def test_a_run_at_a_tight_bound_never_holds_more_than_it_on_disk(store, v5_set, models, request, tmp_path) -> None:
    if store == "s3":
        s3 = request.getfixturevalue("s3_env")
        url = f"{s3.make_bucket('bound')}/set"
        s3.upload_dir(v5_set, url)
    else:
        server = request.getfixturevalue("http_server")
        shutil.copytree(v5_set, server.root / "set")
        url = f"{server.url}/set"
    bound, cache_dir = tight_bound(v5_set), tmp_path / "cache"
    ov = tiny_demo_overrides(
        models, url, tmp_path / "run", "trainer.device=cpu", "trainer.max_steps=12", "trainer.num_workers=2",
        f"data.cache.dir={cache_dir}", f"data.cache.max_bytes={bound}", "data.cache.prefetch=4",
        "trainer.eval_bootstrap=100", "trainer.eval_caption_shuffles=1",
    )  # fmt: skip
    footprint = Footprint(cache_dir)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    ended = run_to_end([sys.executable, "-m", "adapter_trainer", *ov], env=env, cwd=REPO, end_line=r"^  resume: ")
    peak = footprint.stop()
    assert ended.returncode == 0 and ended.exit_after_end_line_s is not None, ended.stderr[-3000:]
    stats = ShardCache(cache_dir).stats()
    assert stats["evictions"] > 0 and footprint.polls > 20, (stats, footprint.polls)  # the bound really bit
    assert peak <= bound, f"du -sb peaked at {peak:,} bytes over the bound of {bound:,} ({stats})"
    assert stats["peak_bytes"] <= bound, stats


def test_the_cache_counts_its_directory_as_du_does(tmp_path) -> None:
    """used_bytes() is `du -sb` of the directory when no download is in flight: tars, index copies, locks, the
    counters and the directories themselves."""
    cache = ShardCache(tmp_path / "c", max_bytes=10**6)
    cache._ready()
    (tmp_path / "c" / f"{'a' * 64}.tar").write_bytes(os.urandom(12_345))
    with cache.download_lock("b" * 64):
        assert cache.keep_index("b" * 64, os.urandom(7_000))
    cache._bump(downloads=1)
    assert cache.index_path("b" * 64).stat().st_size == 7_000
    assert cache.used_bytes() == du_bytes(tmp_path / "c") > 12_345 + 7_000
