"""Two nodes without a shared disk, simulated on one machine: `torchrun --nnodes=2` on 127.0.0.1, one CPU rank per
node, each node in its own working directory. For the trainer, node 1 runs in its own mount namespace where node 0's
directory is an empty tmpfs (`unshare -m`): the same absolute path holds different files on each node, as on two
machines (the recipe sends rank 0's absolute output_dir to every rank, so separate working directories alone would
share it). Static rendezvous there, so node_rank 0 is global rank 0. Only rank 0 sees the checkpoints; a resume
must still continue the run exactly, and a resume rank 0 cannot make must stop every rank in one line (exit 2),
never with a traceback or a hang (every launch runs under tests/run_end.py's stall guard). The pipeline does not send out_dir: a relative
out_dir in separate working directories is already two directories (c10d rendezvous).

The trainer's reference is one process at the same global batch (2 ranks x 2 = 1 x 4), which trains like two ranks
within rel 1e-4 (tests/trainer/training/test_distributed.py): a two-node run on a shared disk costs a launch more."""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from adapter_trainer.training.metric_logging import read_jsonl
from tests import REPO
from tests.contract.shard_fixture import write_synthetic_set
from tests.run_end import Ended, run_live
from tests.trainer.helpers import tiny_demo_overrides

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.budget(60, reason="two-node torchrun launches (a train, a resume) and a one-process reference run"),
]

STEPS = 4  # checkpoints at 2 and 4: a resume from step 2 still trains and checkpoints on both nodes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def can_isolate(tmp_path: Path) -> bool:
    """True when `unshare -m` can hide a directory from a child process (root, or a user namespace allowed)."""
    hidden = tmp_path / "probe-hidden"
    hidden.mkdir()
    (hidden / "marker").write_text("x")
    cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
           f'mount -t tmpfs none "{hidden}" && test ! -e "{hidden}/marker"']  # fmt: skip
    try:
        return subprocess.run(cmd, capture_output=True).returncode == 0
    except OSError:
        return False


@pytest.fixture()
def isolated(tmp_path: Path) -> None:
    if not can_isolate(tmp_path):
        pytest.skip("needs `unshare -m` (a mount namespace) to give the second node a disk of its own")


def two_nodes(module: list[str], cwds: list[Path], isolate: bool = False) -> list[Ended]:
    """`torchrun --nnodes=2 --node_rank=k` for k = 0, 1, each in cwds[k], side by side; each fails as stalled when it
    prints nothing and spends no CPU for a minute (tests/run_end.py).
    isolate: node 1 does not see node 0's directory (a tmpfs over it in its own mount namespace), and the static
    rendezvous makes node 0 global rank 0 (docs/real-data.md, "Many nodes, no shared disk")."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    run = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]
    if isolate:
        run += ["--master-addr=127.0.0.1", f"--master-port={port}"]
    else:
        run += ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=multinode-test"]
    cmds = [[*run, f"--node-rank={k}", "-m", *module] for k in (0, 1)]
    if isolate:
        cmds[1] = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                   f'mount -t tmpfs none "{cwds[0]}" && exec "$@"', "sh", *cmds[1]]  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(run_live, cmds[k], cwd=cwds[k], env=env) for k in (0, 1)]
        return [r.result() for r in runs]


def rank_tracebacks(stderr: str) -> list[str]:
    """Traceback frames in our packages' code (torchrun adds its own ChildFailedError report for any child that exits
    non-zero: that is the launcher's, not a rank's)."""
    return [ln for ln in stderr.splitlines() if ln.strip().startswith('File "') and "/packages/" in ln]


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in read_jsonl(run / "metrics.jsonl") if "train/loss" in r}


@pytest.fixture(scope="module")
def world(models, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The session's demo models (read only), a shard set, and the reference: one process, global batch 4, a
    checkpoint every 2 steps."""
    from adapter_trainer.training.recipe import recipe_main
    from tests.trainer.training.test_distributed import compose

    root = tmp_path_factory.mktemp("multinode")
    shards = write_synthetic_set(root / "shards", n_train=20, n_eval=7, frames=(12, 30), samples_per_shard=8)
    world = {"root": root, "models": models, "shards": shards, "reference": root / "one_process"}
    args = train_args(world, str(world["reference"]), f"trainer.max_steps={STEPS}", "trainer.batch_size=4")
    recipe_main(compose(args[1:]))
    return world


def train_args(world: dict, out: str, *extra: str) -> list[str]:
    return ["adapter_trainer", *tiny_demo_overrides(world["models"], world["shards"], Path(out),
            "trainer.ckpt_every=2", "trainer.eval_bootstrap=100", "trainer.eval_caption_shuffles=1",
            "optimizer.warmup_steps=2", "trainer.num_workers=0", *extra)]  # fmt: skip


@pytest.mark.budget(150, reason="2 nodes x 1 rank of the musicgen tower, then a resumed run")
def test_without_a_shared_disk_a_run_resumes_from_rank_0s_checkpoint(world, isolated, tmp_path: Path) -> None:
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for n in nodes:
        n.mkdir()
    run = nodes[0] / "run"  # rank 0's disk; node 1 sees an empty directory at this path
    for r in two_nodes(train_args(world, str(run), f"trainer.max_steps={STEPS}"), nodes, isolate=True):
        assert r.returncode == 0, r.stderr[-3000:]
    want = losses(world["reference"])
    assert sorted(want) == list(range(1, STEPS + 1))
    assert losses(run) == pytest.approx(want, rel=1e-4)
    # as if the job died after step 2: rank 0's disk alone holds step-000002, and the run continues from it
    for step in range(4, STEPS + 1, 2):
        shutil.rmtree(run / "checkpoints" / f"step-{step:06d}")
    resumed = two_nodes(
        train_args(world, str(run), f"trainer.max_steps={STEPS}", "trainer.resume=latest"), nodes, isolate=True
    )
    for r in resumed:
        assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in resumed[0].stdout and "step-000002" in resumed[0].stdout
    got = losses(run)
    assert sorted(got) == list(range(1, STEPS + 1))
    for s in want:
        assert got[s] == pytest.approx(want[s], rel=1e-4), (s, got[s], want[s])
    assert (run / "checkpoints" / f"step-{STEPS:06d}").is_dir()  # the resumed run checkpointed on rank 0's disk


@pytest.mark.parametrize("case", ["no checkpoint", "optimizer.pt missing"])
def test_a_resume_rank_0_cannot_make_stops_every_rank_in_one_line(world, isolated, case: str, tmp_path: Path) -> None:
    nodes = [tmp_path / "a", tmp_path / "b"]
    for n in nodes:
        n.mkdir()
    run = nodes[0] / "run"
    want = "trainer.resume=latest but"
    if case != "no checkpoint":  # the reference's step-2 checkpoint on rank 0's disk, without its optimizer state
        shutil.copytree(world["reference"] / "checkpoints" / "step-000002", run / "checkpoints" / "step-000002")
        (run / "checkpoints" / "step-000002" / "optimizer.pt").unlink()
        want = "cannot read the checkpoint"
    results = two_nodes(
        train_args(world, str(run), "trainer.max_steps=4", "trainer.resume=latest"), nodes, isolate=True
    )
    for r in results:
        assert r.returncode != 0
        assert not rank_tracebacks(r.stderr), r.stderr[-3000:]
        assert "Connection closed by peer" not in r.stderr, r.stderr[-3000:]
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("adapter_trainer: error:")]
        assert len(errors) == 1 and want in errors[0], r.stderr[-3000:]
        assert re.search(r"exitcode\s*:\s*2\b", r.stderr), r.stderr[
            -3000:
        ]  # the rank's own status, in torchrun's report


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pipeline's input (read only): a small corpus and a tiny codec."""
    from tests.pipeline.helpers import make_corpus, make_tiny_codec

    root = tmp_path_factory.mktemp("pipeline-input")
    make_corpus(root / "corpus")
    make_tiny_codec(root / "codec" / "tiny_encodec")
    return root


def pipeline_args(corpus: Path, out_dir: str) -> list[str]:
    return ["tokenizer_pipeline", f"csv={corpus / 'corpus' / 'subset.csv'}", f"audio_dir={corpus / 'corpus' / 'audio'}",
            f"out_dir={out_dir}", f"codec.name_or_path={corpus / 'codec' / 'tiny_encodec'}", "codec.device=cpu",
            "codec.batch_size=3", "shard.max_samples=2", "min_seconds=0.5", "threads=1", "workers=0"]  # fmt: skip


def test_the_pipeline_on_two_nodes_writes_one_set_into_a_shared_out_dir(corpus: Path, tmp_path: Path) -> None:
    from tokenizer_pipeline.shards.verify import verify

    nodes = [tmp_path / "n0", tmp_path / "n1"]
    for n in nodes:
        n.mkdir()
    out = tmp_path / "shared_shards"
    for r in two_nodes(pipeline_args(corpus, str(out)), nodes):
        assert r.returncode == 0, r.stderr[-3000:]
    problems, summary = verify(out)
    assert not problems and summary, problems
    assert not list(out.glob(".progress/.shared-*"))  # the probe is removed


def test_the_pipeline_refuses_an_out_dir_that_only_rank_0_sees_before_encoding(corpus: Path, tmp_path: Path) -> None:
    nodes = [tmp_path / "n0", tmp_path / "n1"]
    for n in nodes:
        n.mkdir()
    results = two_nodes(pipeline_args(corpus, "shards"), nodes)
    for r in results:
        assert r.returncode != 0, r.stderr[-3000:]
        assert not rank_tracebacks(r.stderr), r.stderr[-3000:]
        # rank 0 prints its `error:` line; another rank hands it to torchrun, whose report quotes it (__main__.py)
        errors = [ln for ln in r.stderr.splitlines() if "error: out_dir=shards is not shared" in ln]
        assert errors and all("tokenizer_pipeline.push" in e for e in errors), r.stderr
        assert re.search(r"exitcode\s*:\s*2\b", r.stderr), r.stderr[-3000:]
    assert not [p for n in nodes for p in n.rglob("*.tar")]  # refused before any encoding
