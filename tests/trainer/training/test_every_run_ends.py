"""Every run ends, on every path, and leaves no process behind (tests/run_end.py: each process it started is found by
a token in its environment; a stall is no CPU spent for a minute, or still running a minute after its final line).

The ways a run can stop after its DataLoader workers started (2 per rank; they ignore SIGTERM, for the scheduler's
sake, so nothing but the training process can end them): a remote shard that is corrupt or missing at its URL, a
bad sample in a local set, a bug raising inside a worker; one process, and torchrun's 2 ranks; and a training
process killed outright. The normal end is run to its end the same way by every torchrun test
(tests/trainer/training/test_distributed.py's `run_two_ranks`) and by tests/remote/test_cache_bound_on_disk.py.
The sets are format 5 with one train shard, so setup reads no tar and the first micro-batch meets the fault.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import REPO
from tests.contract.shard_fixture import write_synthetic_set
from tests.remote.servers import FaultyHTTPServer
from tests.run_end import run_to_end
from tests.trainer.faulty_train import FAULT
from tests.trainer.helpers import tiny_demo_overrides

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds a run's processes in /proc")

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
USER_ERROR = r"^adapter_trainer: error: "
# (the fault, the line the run ends with, its exit status in one process)
CASES = {
    "remote-corrupt": (r"shard train/shard-000000\.tar: http://\S+ has sha256 \w+, but the manifest lists", 2),
    "remote-missing": (r"shard train/shard-000000\.tar: cannot read http://\S+ \(HTTP 404", 2),
    "local-bad-sample": (r"shard-000000\.tar: sample 'tr\w+' does not decode safely", 2),
    "worker-bug": (FAULT, 1),
}


@pytest.fixture(scope="module")
def clean_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 train clips in one shard, 7 eval clips; format 5 (the index sidecars: setup opens no tar)."""
    root = tmp_path_factory.mktemp("ends") / "set"
    return write_synthetic_set(root, n_train=20, n_eval=7, frames=(12, 30), samples_per_shard=32)


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultyHTTPServer]:
    with FaultyHTTPServer(tmp_path_factory.mktemp("http_root")) as server:
        yield server


def _spoil_json_members(tar: Path) -> None:
    """Every sample's json member overwritten in place with bytes that are no JSON (sizes and offsets unchanged)."""
    with tarfile.open(tar) as t:
        spans = [(m.offset_data, m.size) for m in t.getmembers() if m.name.endswith(".json")]
    data = bytearray(tar.read_bytes())
    for offset, size in spans:
        data[offset : offset + size] = b"\xff" * size
    tar.write_bytes(bytes(data))


def shards_for(case: str, clean: Path, tmp_path: Path, http: FaultyHTTPServer) -> str:
    """The data.shards entry of a run that meets `case` (a copy of the clean set, spoiled)."""
    name = f"{case}-{tmp_path.name}"
    served = http.root / name
    if case in ("remote-corrupt", "remote-missing"):
        shutil.copytree(clean, served)
        tar = served / "train" / "shard-000000.tar"
        if case == "remote-missing":
            tar.unlink()
        else:
            body = bytearray(tar.read_bytes())
            body[700] ^= 0xFF
            tar.write_bytes(bytes(body))
        return f"{http.url}/{name}"
    local = tmp_path / "set"
    shutil.copytree(clean, local)
    if case == "local-bad-sample":
        _spoil_json_members(local / "train" / "shard-000000.tar")
    return str(local)


def command(models, shards: str, out: Path, *, ranks: int, faulty: bool, steps: int) -> list[str]:
    ov = tiny_demo_overrides(
        models, shards, out, "trainer.device=cpu", f"trainer.max_steps={steps}", "trainer.num_workers=2",
        f"trainer.batch_size={2 // ranks}", f"data.cache.dir={out.parent / 'cache'}", "trainer.eval_bootstrap=100",
        "trainer.eval_caption_shuffles=1",
    )  # fmt: skip
    module = "tests.trainer.faulty_train" if faulty else "adapter_trainer"
    if ranks == 1:
        return [sys.executable, "-m", module, *ov]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}", "-m", module,
            *ov]  # fmt: skip


@pytest.mark.budget(60, reason="a real training run that meets its fault at its first micro-batch, in a subprocess")
@pytest.mark.parametrize("case", list(CASES))
def test_a_run_that_stops_after_its_loader_started_ends_at_once(case, models, clean_set, http, tmp_path) -> None:
    line, code = CASES[case]
    shards = shards_for(case, clean_set, tmp_path, http)
    end = USER_ERROR + ".*" + line if code == 2 else line
    ended = run_to_end(command(models, shards, tmp_path / "run", ranks=1, faulty=case == "worker-bug", steps=20),
                       env=ENV, cwd=REPO, end_line=end)  # fmt: skip
    assert ended.returncode == code, ended.stderr[-3000:]
    assert ended.exit_after_end_line_s is not None, ended.stderr[-3000:]
    if code == 2:  # the refusal is the run's last line, and the only error it prints
        last = ended.stderr.strip().splitlines()[-1]
        assert last.startswith("adapter_trainer: error: ") and "Traceback" not in ended.stderr, ended.stderr[-3000:]


@pytest.mark.multiprocess
@pytest.mark.budget(90, reason="a torchrun job of 2 ranks x 2 workers that meets its fault at its first micro-batch")
@pytest.mark.parametrize("case", ["remote-corrupt", "worker-bug"])
def test_under_torchrun_every_rank_ends_when_one_stops(case, models, clean_set, http, tmp_path) -> None:
    """A rank stops on the fault (the other on it too, or on the first leaving their collective); torchrun ends the
    job, non-zero, within the bound after the fault's line. A refusal (a remote shard's; a local bad sample's is the
    same path: a UserError re-raised from a worker, one process above) and a bug in a worker."""
    line, _ = CASES[case]
    shards = shards_for(case, clean_set, tmp_path, http)
    ended = run_to_end(command(models, shards, tmp_path / "run", ranks=2, faulty=case == "worker-bug", steps=20),
                       env=ENV, cwd=REPO, end_line=line)  # fmt: skip
    assert ended.returncode == 1 and "ChildFailedError" in ended.stderr, ended.stderr[-3000:]
    assert ended.exit_after_end_line_s is not None, ended.stderr[-3000:]  # the fault's line was seen


@pytest.mark.budget(60, reason="a real training run killed by SIGKILL while its workers wait on a download")
def test_workers_end_with_a_training_process_killed_outright(models, clean_set, http, tmp_path) -> None:
    """The OOM killer or torchrun's SIGKILL runs no exit hook: the workers, busy in a download the server holds up,
    must die with their parent (data.worker_lifetime.end_with_parent), not when the download ends."""
    shards = shards_for("remote-corrupt", clean_set, tmp_path, http)  # any remote set: its first tar never arrives
    name = shards.rsplit("/", 1)[1]
    http.delay(f"{name}/train/shard-*", 120, times=10)
    cmd = command(models, shards, tmp_path / "run", ranks=1, faulty=False, steps=20) + ["data.cache.prefetch=0"]
    tar_sha = json.loads((clean_set / "manifest.json").read_text())["splits"]["train"]["shards"][0]["sha256"]

    def downloading() -> bool:  # a worker reserved the tar's download (no prefetch thread: only workers fetch tars)
        return any((tmp_path / "cache").glob(f"{tar_sha}-*.part"))

    ended = run_to_end(cmd, env=ENV, cwd=REPO, signal_when=(downloading, signal.SIGKILL), signal_group=False)
    assert ended.returncode == -signal.SIGKILL, ended.stderr[-3000:]
