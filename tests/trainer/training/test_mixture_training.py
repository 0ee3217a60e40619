"""The recipe on data.shards mixtures: a plain list trains exactly as before, a weighted mixture resumes mid-epoch
onto exactly the examples of an unbroken run, its weights are part of the resume fingerprint, per-sample v3 weights
switch the order to a mixture, and `python -m adapter_trainer` trains on the command line's weighted form."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from adapter_trainer.config import ConfigError
from adapter_trainer.data.mixture import MixtureOrder
from adapter_trainer.data.shards import open_shard_sets
from adapter_trainer.data.split_index import build_index
from adapter_trainer.data.streaming import epoch_permutation
from adapter_trainer.training.checkpoint import ResumeError
from adapter_trainer.training.recipe import MoTAdapterRecipe
from tests import REPO
from tests.contract.shard_fixture import synthetic_clips, write_shard_set, write_synthetic_set
from tests.trainer.helpers import make_cfg, run_module_in_process, run_recipe_recording_keys, tiny_demo_overrides

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """a: 8 train / 4 eval clips; b: 3 train / 2 eval clips (a small set a big one would drown)."""
    root = tmp_path_factory.mktemp("mixsets")
    a = write_synthetic_set(root / "a", n_train=8, n_eval=4, frames=(12, 20))
    b = write_shard_set(
        root / "b",
        {
            "train": synthetic_clips(3, seed=5, prefix="bb", frames=(12, 20)),
            "eval": synthetic_clips(2, seed=6, prefix="be", frames=(12, 20)),
        },
    )
    return [a, b]


def _weighted(a: Path, b: Path, wa: float = 3, wb: float = 1) -> str:
    return f"data.shards=[{{path: {a}, weight: {wa}}}, {{path: {b}, weight: {wb}}}]"


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def test_a_plain_list_trains_on_the_concatenation_order_as_before(models, sets, tmp_path: Path) -> None:
    a, b = sets
    common = ("trainer.max_steps=7",)  # 14 examples: crosses the 11-clip epoch
    plain, keys = run_recipe_recording_keys(make_cfg(models, a, tmp_path / "p", f"data.shards=[{a},{b}]", *common))
    index = build_index(open_shard_sets([str(a), str(b)], model_n_codebooks=4, model_codebook_size=2048), "train")
    order = [*epoch_permutation(1234, 0, 11), *epoch_permutation(1234, 1, 11)]
    assert sum(keys, []) == [index.key(int(i)) for i in order[:14]]
    assert plain["progress"]["epoch"] == 1 and plain["progress"]["index"] == 3
    # entries without weights are the same concatenation: the same losses to the last bit
    dicts, _ = run_recipe_recording_keys(
        make_cfg(models, a, tmp_path / "d", f"data.shards=[{{path: {a}}}, {b}]", *common)
    )
    assert _losses(tmp_path / "d") == _losses(tmp_path / "p")
    assert dicts["eval"]["ce"] == plain["eval"]["ce"]
    fp = json.loads((tmp_path / "p/checkpoints/step-000007/fingerprint.json").read_text())
    assert "data.mixture" not in fp  # checkpoints of concatenated sets keep the fingerprint they always had


def test_a_weighted_run_resumed_mid_epoch_sees_the_unbroken_runs_examples(models, sets, tmp_path: Path) -> None:
    a, b = sets
    common = (_weighted(a, b), "data.mixture_epoch_size=10", "trainer.max_steps=8", "trainer.ckpt_every=3")
    full, full_keys = run_recipe_recording_keys(make_cfg(models, a, tmp_path / "full", *common))
    progress3 = json.loads((tmp_path / "full/checkpoints/step-000003/progress.json").read_text())
    assert (progress3["epoch"], progress3["index"]) == (0, 6)  # mid-epoch: 6 of 10 draws
    (tmp_path / "resumed/checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "full/checkpoints/step-000003", tmp_path / "resumed/checkpoints/step-000003")
    resumed, keys = run_recipe_recording_keys(
        make_cfg(models, a, tmp_path / "resumed", *common, "trainer.resume=latest")
    )
    assert keys == full_keys[3:] and len(keys) == 5
    ref, got = _losses(tmp_path / "full"), _losses(tmp_path / "resumed")
    assert sorted(got) == [4, 5, 6, 7, 8]
    assert all(got[s] == pytest.approx(ref[s], rel=1e-6, abs=1e-7) for s in got)
    assert resumed["progress"] == full["progress"] and full["progress"]["epoch"] == 1
    # the run drew what the mixture order says, and the small set far above its 3/11 share of a concatenation
    sets_ = open_shard_sets([str(a), str(b)], model_n_codebooks=4, model_codebook_size=2048)
    index = build_index(sets_, "train")
    order = MixtureOrder(1234, [(0, 8), (8, 11)], [3.0, 1.0], epoch_size=10)
    assert sum(full_keys, []) == [index.key(order.clip(*divmod(k, 10))) for k in range(16)]
    per_set = full["learning_check"]["per_shard_set"]
    assert list(per_set) == [str(a), str(b)] and [p["n_clips"] for p in per_set.values()] == [4, 2]
    # other weights are another example stream: refused on resume
    with pytest.raises(ResumeError, match=r"data.mixture"):
        other = make_cfg(
            models,
            a,
            tmp_path / "resumed",
            _weighted(a, b, 1, 1),
            "data.mixture_epoch_size=10",
            "trainer.resume=latest",
        )
        MoTAdapterRecipe(other).setup()


def test_per_sample_weights_make_a_plain_list_a_size_weighted_mixture(models, sets, tmp_path: Path) -> None:
    a, _ = sets
    clips = {
        "train": synthetic_clips(4, seed=7, prefix="hv", frames=(12, 20)),
        "eval": synthetic_clips(2, seed=8, prefix="hw", frames=(12, 20)),
    }
    heavy = write_shard_set(tmp_path / "w", clips, weights={"hv0000001": 5.0})
    eval_only = write_shard_set(tmp_path / "e", {"train": [], "eval": synthetic_clips(2, seed=9, prefix="eo")})
    recipe = MoTAdapterRecipe(make_cfg(models, a, tmp_path / "r", f"data.shards=[{a},{heavy},{eval_only}]"))
    recipe.setup()
    order = recipe.train_data.order
    assert isinstance(order, MixtureOrder)
    assert order.p.tolist() == pytest.approx([8 / 12, 4 / 12, 0])  # each set keeps its share of the concatenation
    assert order.cum_weights[0] is None and order.cum_weights[1].tolist() == [1.0, 6.0, 7.0, 8.0]
    assert order.epoch_size == 12 and "data.mixture" not in recipe.fingerprint  # the data hash covers the weights
    # with set weights, a set without train clips cannot be drawn from: refused naming it
    weighted = f"data.shards=[{{path: {a}, weight: 2}}, {eval_only}]"
    with pytest.raises(ConfigError, match=rf"data.shards entry '{eval_only}' has no clips in split"):
        MoTAdapterRecipe(make_cfg(models, a, tmp_path / "r2", weighted)).setup()


def test_the_command_line_trains_a_weighted_mixture(
    models, sets, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The weighted form as `python -m adapter_trainer` parses it from the command line, run in this process (the
    refusal below checks the entry's exit status in a process of its own)."""
    a, b = sets
    args = tiny_demo_overrides(
        models,
        a,
        tmp_path / "cli",
        "trainer.device=cpu",
        "trainer.max_steps=3",
        "trainer.eval_caption_shuffles=1",
        "trainer.eval_bootstrap=100",
        "trainer.num_workers=0",
        _weighted(a, b),
    )
    capfd.readouterr()
    code = run_module_in_process("adapter_trainer", *args)
    out, err = capfd.readouterr()
    assert code == 0, err[-3000:]
    final = json.loads((tmp_path / "cli/final_metrics.json").read_text())
    per_set = final["learning_check"]["per_shard_set"]
    assert list(per_set) == [str(a), str(b)] and all(p["n_clips"] > 0 for p in per_set.values())
    assert final["learning_check"]["eval_ce"] == final["eval"]["ce"] and final["step"] == 3
    assert f"set {b}: CE" in out
    assert f"mixture: 11 examples per epoch; share per draw {a}: 0.750, {b}: 0.250" in out


def test_the_command_line_refuses_a_bad_entry_in_one_line(models, sets, tmp_path: Path) -> None:
    a, b = sets
    args = tiny_demo_overrides(models, a, tmp_path / "bad", f"data.shards=[{{path: {a}, weight: 0}}, {b}]")
    env = {k: v for k, v in os.environ.items() if k != "ADAPTER_TRAINER_CONF_DIR"}
    proc = subprocess.run(
        [sys.executable, "-m", "adapter_trainer", *args], cwd=REPO, capture_output=True, text=True, timeout=300, env=env
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "error: " in last and "data.shards[0]=" in last and "weight must be a finite number > 0" in last
