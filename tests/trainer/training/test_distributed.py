"""torchrun with 2 CPU ranks (gloo) against one process: same examples, same losses, same eval and bootstrap,
rank 0 alone writes, and a checkpoint written by 2 ranks resumes in 1 process (another world size, same global
batch). The shard set has ONE train shard and each rank 2 workers: fewer shards than ranks x workers must not hang.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from adapter_trainer.config import TrainConfig, to_train_config
from adapter_trainer.hydra_cli import find_conf_dir
from adapter_trainer.training.metric_logging import read_jsonl
from tests import REPO
from tests.contract.shard_fixture import write_synthetic_set
from tests.run_end import run_to_end
from tests.trainer.helpers import run_recipe_recording_keys, tiny_demo_overrides

STEPS, GLOBAL_BATCH = 4, 4
pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.budget(60, reason="the module's setup: a one-process run, then a torchrun job of 2 ranks"),
]


def overrides(models: dict[str, Path], shards: Path, out: Path, batch_size: int, *extra: str) -> list[str]:
    return tiny_demo_overrides(
        models,
        shards,
        out,
        f"trainer.batch_size={batch_size}",
        "trainer.ckpt_every=2",
        f"trainer.max_steps={STEPS}",
        "trainer.eval_bootstrap=200",
        "trainer.eval_caption_shuffles=2",
        "optimizer.warmup_steps=2",
        *extra,
    )


def compose(ov: list[str]) -> TrainConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(find_conf_dir()), version_base="1.3"):
        return to_train_config(hydra_compose("config", overrides=ov))


def run_two_ranks(ov: list[str], out: Path) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node=2` of the real entry point, observed from outside the recipe
    (tests/trainer/observed_train.py writes out/dump.json and .rank1), run to its end by tests/run_end.py: it fails as
    stalled when it prints nothing and its processes spend no CPU for a minute, and when any process of the job (a
    rank, a DataLoader worker) outlives it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "tests.trainer.observed_train", str(out / "dump.json"), *ov]  # fmt: skip
    ended = run_to_end(cmd, env=env, cwd=REPO, end_line=r"^  resume: ")  # next_steps' last line
    assert ended.returncode == 0, ended.stdout[-3000:] + ended.stderr[-5000:]
    assert ended.exit_after_end_line_s is not None, ended.stdout[-3000:]
    return subprocess.CompletedProcess(cmd, ended.returncode, ended.stdout, ended.stderr)


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r}


@pytest.fixture(scope="module")
def setup_runs(models, tmp_path_factory: pytest.TempPathFactory):
    """The session's demo models (read only), a shard set, the one-process run and the 2-rank run."""
    root = tmp_path_factory.mktemp("ddp")
    # one train shard (32 per shard > 20 clips): 2 ranks x 2 workers > 1 shard; 7 eval clips: 4 + 3 per rank
    shards = write_synthetic_set(root / "shards", n_train=20, n_eval=7, frames=(12, 30), samples_per_shard=32)
    ref_out, ddp_out = root / "one", root / "two"
    ref, ref_keys = run_recipe_recording_keys(
        compose(overrides(models, shards, ref_out, GLOBAL_BATCH, "trainer.num_workers=0"))
    )
    proc = run_two_ranks(overrides(models, shards, ddp_out, GLOBAL_BATCH // 2, "trainer.num_workers=2"), ddp_out)
    return dict(
        models=models,
        shards=shards,
        ref_out=ref_out,
        ddp_out=ddp_out,
        ref=ref,
        ref_keys=ref_keys,
        stdout=proc.stdout,
        root=root,
    )


def test_two_ranks_see_exactly_the_examples_of_one_process(setup_runs) -> None:
    ref_keys = setup_runs["ref_keys"]
    r0 = json.loads((setup_runs["ddp_out"] / "dump.json").read_text())
    r1 = json.loads((setup_runs["ddp_out"] / "dump.json.rank1").read_text())
    assert (r0["rank"], r0["world_size"], r1["rank"]) == (0, 2, 1)
    assert len(ref_keys) == STEPS and all(len(k) == GLOBAL_BATCH for k in ref_keys)
    assert [a + b for a, b in zip(r0["keys_seen"], r1["keys_seen"])] == ref_keys
    assert r0["keys_seen"] != r1["keys_seen"]  # the ranks really split the batch


def test_two_ranks_train_and_evaluate_like_one_process(setup_runs) -> None:
    """Loss per step and eval within float tolerance (different batch shapes and reduction order: rel 1e-4)."""
    ref_l, ddp_l = losses(setup_runs["ref_out"]), losses(setup_runs["ddp_out"])
    assert sorted(ddp_l) == list(range(1, STEPS + 1))  # one record per step: rank 1 wrote nothing
    for s in ref_l:
        assert ddp_l[s] == pytest.approx(ref_l[s], rel=1e-4), (s, ddp_l[s], ref_l[s])
    ref = setup_runs["ref"]
    got = json.loads((setup_runs["ddp_out"] / "final_metrics.json").read_text())
    assert got["eval"]["n_clips"] == ref["eval"]["n_clips"] == 7  # each eval clip scored once across the ranks
    assert got["eval"]["n_code_targets"] == ref["eval"]["n_code_targets"]
    for key in ("ce", "unigram_ce", "ce_shuffled", "caption_gain", "caption_gain_lo", "caption_gain_hi"):
        assert got["eval"][key] == pytest.approx(ref["eval"][key], rel=1e-4, abs=1e-5), key
    assert got["progress"] == ref["progress"]
    assert (setup_runs["ddp_out"] / "checkpoints" / "step-000004" / "adapter.safetensors").is_file()
    assert (setup_runs["ddp_out"] / "loss_curve.png").is_file()
    assert setup_runs["stdout"].count("LEARNING CHECK") == 1  # rank 0 alone reports


def test_checkpoint_of_two_ranks_resumes_in_one_process(setup_runs, tmp_path: Path) -> None:
    """World size 2 x batch 2 -> 1 x batch 4 (same global batch): steps 3-4 continue the one-process run."""
    out = tmp_path / "resumed"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(setup_runs["ddp_out"] / "checkpoints" / "step-000002", out / "checkpoints" / "step-000002")
    _, keys = run_recipe_recording_keys(
        compose(
            overrides(
                setup_runs["models"],
                setup_runs["shards"],
                out,
                GLOBAL_BATCH,
                "trainer.num_workers=0",
                "trainer.resume=latest",
            )
        )
    )
    ref_l, got = losses(setup_runs["ref_out"]), losses(out)
    assert sorted(got) == [3, 4]
    for s in (3, 4):
        assert got[s] == pytest.approx(ref_l[s], rel=1e-4), (s, got[s], ref_l[s])
    assert keys == setup_runs["ref_keys"][2:]
