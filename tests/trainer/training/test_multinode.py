"""Two nodes without a shared disk, simulated on one machine as a new user would try it: `torchrun --nnodes=2
--node_rank=0|1` with c10d rendezvous on 127.0.0.1, one CPU rank per node, each node in its own working directory and
a relative trainer.output_dir, so the same path holds different files on each node. Only the rank that writes
checkpoints (global rank 0) sees them; a resume must still continue the run exactly, and a resume rank 0 cannot make
must stop every rank in one line (exit 2), never with a traceback or a hang (every launch has a timeout)."""

from __future__ import annotations

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
from tests.trainer.helpers import tiny_demo_overrides

STEPS = 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(module: list[str], cwds: list[Path], timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """`torchrun --nnodes=2 --node_rank=k` for k = 0, 1, each in cwds[k]; both must end within `timeout`."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=1",
                f"--node_rank={k}",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{port}",
                "--rdzv_id=multinode-test",
                "-m",
                *module,
            ],  # fmt: skip
            cwd=cwds[k],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for k in (0, 1)
    ]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    finally:
        for p in procs:
            p.kill()
    return out


def rank_tracebacks(stderr: str) -> list[str]:
    """Traceback frames in our packages' code (torchrun adds its own ChildFailedError report for any child that exits
    non-zero: that is the launcher's, not a rank's)."""
    return [ln for ln in stderr.splitlines() if ln.strip().startswith('File "') and "/packages/" in ln]


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in read_jsonl(run / "metrics.jsonl") if "train/loss" in r}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from adapter_trainer.demo.models import write_demo_models

    root = tmp_path_factory.mktemp("multinode")
    models = write_demo_models(root / "models", seed=0)
    shards = write_synthetic_set(root / "shards", n_train=20, n_eval=7, frames=(12, 30), samples_per_shard=8)
    return {"root": root, "models": models, "shards": shards}


def train_args(world: dict, out: str, *extra: str) -> list[str]:
    return ["adapter_trainer", *tiny_demo_overrides(world["models"], world["shards"], Path(out),
            "trainer.ckpt_every=2", "trainer.eval_bootstrap=100", "trainer.eval_caption_shuffles=1",
            "optimizer.warmup_steps=2", "trainer.num_workers=0", *extra)]  # fmt: skip


def test_without_a_shared_disk_a_run_resumes_from_rank_0s_checkpoint(world, tmp_path: Path) -> None:
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for n in nodes:
        n.mkdir()
    shared = tmp_path / "shared_run"  # the reference: both nodes write into one directory
    for r in two_nodes(train_args(world, str(shared), f"trainer.max_steps={STEPS}"), nodes):
        assert r.returncode == 0, r.stderr[-3000:]
    first = two_nodes(train_args(world, "run", f"trainer.max_steps={STEPS}"), nodes)  # relative: one dir per node
    for r in first:
        assert r.returncode == 0, r.stderr[-3000:]
    writer = [n for n in nodes if (n / "run" / "checkpoints").is_dir()]
    assert len(writer) == 1  # only global rank 0 writes, on whichever node the rendezvous made rank 0
    run, other = writer[0] / "run", nodes[1 - nodes.index(writer[0])]
    assert not (other / "run" / "checkpoints").exists()
    assert losses(run) == pytest.approx(losses(shared), rel=1e-4)
    # as if the job died after step 2: rank 0's disk alone holds step-000002, and the run continues from it
    for step in range(4, STEPS + 1, 2):
        shutil.rmtree(run / "checkpoints" / f"step-{step:06d}")
    resumed = two_nodes(train_args(world, "run", f"trainer.max_steps={STEPS}", "trainer.resume=latest"), nodes)
    for r in resumed:
        assert r.returncode == 0, r.stderr[-3000:]
    assert any("resumed from" in r.stdout and "step-000002" in r.stdout for r in resumed)
    want, got = losses(shared), losses(run)
    assert sorted(got) == list(range(1, STEPS + 1))
    for s in want:
        assert got[s] == pytest.approx(want[s], rel=1e-4), (s, got[s], want[s])
    assert not (other / "run" / "checkpoints").exists()


def test_a_resume_rank_0_cannot_find_stops_every_rank_in_one_line(world, tmp_path: Path) -> None:
    nodes = [tmp_path / "a", tmp_path / "b"]
    for n in nodes:
        n.mkdir()
    results = two_nodes(train_args(world, "fresh", "trainer.max_steps=2", "trainer.resume=latest"), nodes, timeout=300)
    for r in results:
        assert r.returncode != 0
        assert not rank_tracebacks(r.stderr), r.stderr[-3000:]
        assert "Connection closed by peer" not in r.stderr, r.stderr[-3000:]
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("adapter_trainer: error:")]
        assert len(errors) == 1 and "trainer.resume=latest but" in errors[0], r.stderr[-3000:]
        assert re.search(r"exitcode\s*:\s*2\b", r.stderr), r.stderr[
            -3000:
        ]  # the rank's own status, in torchrun's report


def pipeline_args(tmp_path: Path, out_dir: str) -> list[str]:
    from tests.pipeline.helpers import make_corpus, make_tiny_codec

    if not (tmp_path / "corpus").is_dir():
        make_corpus(tmp_path / "corpus")
        make_tiny_codec(tmp_path / "codec" / "tiny_encodec")
    return ["tokenizer_pipeline", f"csv={tmp_path / 'corpus' / 'subset.csv'}", f"audio_dir={tmp_path / 'corpus' / 'audio'}",
            f"out_dir={out_dir}", f"codec.name_or_path={tmp_path / 'codec' / 'tiny_encodec'}", "codec.device=cpu",
            "codec.batch_size=3", "shard.max_samples=2", "min_seconds=0.5", "threads=1", "workers=0"]  # fmt: skip


def test_the_pipeline_on_two_nodes_writes_one_set_into_a_shared_out_dir(tmp_path: Path) -> None:
    from tokenizer_pipeline.shards.verify import verify

    nodes = [tmp_path / "n0", tmp_path / "n1"]
    for n in nodes:
        n.mkdir()
    out = tmp_path / "shared_shards"
    for r in two_nodes(pipeline_args(tmp_path, str(out)), nodes, timeout=300):
        assert r.returncode == 0, r.stderr[-3000:]
    problems, summary = verify(out)
    assert not problems and summary, problems
    assert not list(out.glob(".progress/.shared-*"))  # the probe is removed


def test_the_pipeline_refuses_an_out_dir_that_only_rank_0_sees_before_encoding(tmp_path: Path) -> None:
    nodes = [tmp_path / "n0", tmp_path / "n1"]
    for n in nodes:
        n.mkdir()
    results = two_nodes(pipeline_args(tmp_path, "shards"), nodes, timeout=300)
    for r in results:
        assert r.returncode != 0, r.stderr[-3000:]
        assert not rank_tracebacks(r.stderr), r.stderr[-3000:]
        # rank 0 prints its `error:` line; another rank hands it to torchrun, whose report quotes it (cli.py)
        errors = [ln for ln in r.stderr.splitlines() if "error: out_dir=shards is not shared" in ln]
        assert errors and all("tokenizer_pipeline.push" in e for e in errors), r.stderr
        assert re.search(r"exitcode\s*:\s*2\b", r.stderr), r.stderr[-3000:]
    assert not [p for n in nodes for p in n.rglob("*.tar")]  # refused before any encoding
