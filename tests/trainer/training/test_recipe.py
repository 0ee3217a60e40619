"""Recipe on tiny demo models + synthetic shards: many backward steps, exact resume, refused resumes, encoder
isolation in a real `python -m adapter_trainer` subprocess, and the eval math."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from adapter_trainer.data.token_layout import IGNORE_INDEX, AudioVocab
from adapter_trainer.evaluation.stats import bootstrap_mean_ci, derangement, unigram_log_probs
from adapter_trainer.evaluation.target_ce import unigram_ce
from adapter_trainer.training.checkpoint import ResumeError
from adapter_trainer.training.metric_logging import read_jsonl
from adapter_trainer.training.optim import WarmupCosine
from adapter_trainer.training.recipe import MoTAdapterRecipe, recipe_main
from tests import REPO
from tests.contract.shard_fixture import write_synthetic_set
from tests.trainer.helpers import make_cfg, tiny_demo_overrides


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_synthetic_set(tmp_path_factory.mktemp("shards") / "set", n_train=24, n_eval=6, frames=(12, 24))


def train_losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["train/loss"] for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r}


def test_fifty_steps_each_with_backward_and_no_autograd_error(models, shards, tmp_path: Path) -> None:
    """Regression for "Trying to backward through the graph a second time": codes come from shards as plain
    integer tensors, so every step builds a fresh graph; 50 optimizer steps, each with its own backward."""
    cfg = make_cfg(models, shards, tmp_path / "run", "trainer.max_steps=50")
    recipe = MoTAdapterRecipe(cfg)
    recipe.setup()
    backward_calls = {"n": 0}
    first = recipe.trainable[0]
    first.register_hook(lambda g: backward_calls.__setitem__("n", backward_calls["n"] + 1))
    trainable_before = [p.detach().clone() for p in recipe.trainable]
    frozen = [(n, p.detach().clone()) for n, p in recipe.model.named_parameters() if not p.requires_grad]
    assert frozen, "the LLM / MusicGen weights must be frozen"
    recipe.train()
    assert recipe.progress.step == 50
    assert backward_calls["n"] == 50  # one backward per step, none skipped, none repeated
    assert all(not torch.equal(a, p.detach()) for a, p in zip(trainable_before, recipe.trainable[:5]))
    params = dict(recipe.model.named_parameters())
    assert all(torch.equal(v, params[n].detach()) for n, v in frozen)
    facts = recipe.last_batch_facts
    assert facts["tokens"]["dtype"] == "torch.int64" and facts["labels"]["dtype"] == "torch.int64"
    assert not any(f["requires_grad"] or f["has_grad_fn"] for f in facts.values())
    losses = train_losses(tmp_path / "run")
    assert sorted(losses) == list(range(1, 51)) and all(math.isfinite(v) for v in losses.values())
    assert np.mean([losses[s] for s in range(41, 51)]) < np.mean([losses[s] for s in range(1, 6)])  # it learns
    assert recipe.progress.tokens_seen > 0 and recipe.progress.epoch >= 1  # crossed epochs without trouble


@pytest.mark.parametrize("recompute", [False, True], ids=["plain", "activation_checkpointing"])
def test_resume_continues_identically(
    models, shards, tmp_path: Path, recompute: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import adapter_trainer.model.musicgen_rows as tower_module  # the default tower's layers

    recomputed = {"layers": 0}  # layer calls wrapped for recompute: the setting reaches the model

    def counting_checkpoint(*args, **kwargs):
        recomputed["layers"] += 1
        return real_checkpoint(*args, **kwargs)

    real_checkpoint = tower_module.checkpoint
    monkeypatch.setattr(tower_module, "checkpoint", counting_checkpoint)
    common = (
        "trainer.max_steps=8",
        "trainer.grad_accum_steps=2",
        "trainer.ckpt_every=4",
        f"trainer.activation_checkpointing={str(recompute).lower()}",
    )
    full = recipe_main(make_cfg(models, shards, tmp_path / "full", *common))
    ref = train_losses(tmp_path / "full")
    assert (tmp_path / "full/checkpoints/step-000004/adapter.safetensors").is_file()
    progress4 = json.loads((tmp_path / "full/checkpoints/step-000004/progress.json").read_text())
    assert progress4["step"] == 4 and progress4["index"] + progress4["epoch"] * 24 == 4 * 2 * 2

    # a second run dir that holds only the step-4 checkpoint, resumed with `latest`
    (tmp_path / "resumed/checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "full/checkpoints/step-000004", tmp_path / "resumed/checkpoints/step-000004")
    resumed = recipe_main(make_cfg(models, shards, tmp_path / "resumed", *common, "trainer.resume=latest"))
    got = train_losses(tmp_path / "resumed")
    assert sorted(got) == [5, 6, 7, 8]
    for s in (5, 6, 7, 8):
        assert got[s] == pytest.approx(ref[s], rel=1e-6, abs=1e-7), (s, got[s], ref[s])
    assert resumed["eval"]["ce"] == pytest.approx(full["eval"]["ce"], rel=1e-6)
    assert resumed["progress"] == full["progress"]
    # final adapter weights identical too
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "full/checkpoints/step-000008/adapter.safetensors"))
    b = load_file(str(tmp_path / "resumed/checkpoints/step-000008/adapter.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-6, atol=1e-7) for k in a)
    assert (recomputed["layers"] > 0) == recompute


def test_resume_with_a_different_sequence_length_is_refused(models, shards, step2_ckpt: Path, tmp_path: Path) -> None:
    cfg = make_cfg(
        models, shards, tmp_path / "r", "trainer.max_steps=4", f"trainer.resume={step2_ckpt}", "data.max_seq_len=40"
    )
    with pytest.raises(ResumeError) as e:
        MoTAdapterRecipe(cfg).setup()
    assert "data.max_seq_len: checkpoint=" in str(e.value) and "run=40" in str(e.value)
    assert str(step2_ckpt) in str(e.value)


def test_resume_with_different_data_is_refused(models, step2_ckpt: Path, tmp_path: Path) -> None:
    other = write_synthetic_set(tmp_path / "other", n_train=24, n_eval=6, frames=(12, 24), seed=99)
    cfg = make_cfg(models, other, tmp_path / "r", "trainer.max_steps=4", f"trainer.resume={step2_ckpt}")
    with pytest.raises(ResumeError, match="data.manifest_sha256"):
        MoTAdapterRecipe(cfg).setup()


def test_resume_from_missing_checkpoint_is_refused(models, shards, tmp_path: Path) -> None:
    cfg = make_cfg(models, shards, tmp_path / "empty", "trainer.resume=latest")
    with pytest.raises(ResumeError, match="holds no step-"):
        MoTAdapterRecipe(cfg).setup()


def test_training_process_never_loads_the_codec(models, shards, tmp_path: Path) -> None:
    """A real `python -m adapter_trainer +experiment=demo` run (the package's __main__ under runpy, observed from
    outside by tests/trainer/observed_train.py): afterwards no tokenizer_pipeline / EnCodec module is imported, no
    EncodecModel exists, and batches were plain integer tensors. Also checks the run's outputs."""
    out, dump = tmp_path / "run", tmp_path / "modules.json"
    run = ["trainer.max_steps=4", "trainer.eval_every=2", "trainer.ckpt_every=2", "trainer.eval_bootstrap=100"]
    cmd = [
        sys.executable,
        "-m",
        "tests.trainer.observed_train",
        str(dump),
        *tiny_demo_overrides(models, shards, out, *run, "trainer.tensorboard=true"),
    ]
    env = {k: v for k, v in os.environ.items() if k != "ADAPTER_TRAINER_CONF_DIR"}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(dump.read_text())
    mods = info["modules"]
    # the dump is from a real run: the run itself loaded the model builders and the shard reader
    added = info["modules_added_by_run"]
    assert "adapter_trainer.model.builders" in added and "adapter_trainer.model.mot" in added, added
    assert not [m for m in mods if m == "tokenizer_pipeline" or m.startswith("tokenizer_pipeline.")]
    assert not [m for m in mods if m.startswith("transformers.models.encodec")]
    assert info["encodec_instances"] == 0
    for name, facts in info["batch"].items():
        assert facts["dtype"] in ("torch.int64", "torch.bool"), (name, facts)
        assert not facts["requires_grad"] and not facts["has_grad_fn"], (name, facts)
    # outputs of a run: metrics, TensorBoard, plot, final metrics, checkpoints, Hydra files under output_dir
    final = json.loads((out / "final_metrics.json").read_text())
    lc = final["learning_check"]
    assert set(lc) >= {"rel_to_unigram_pct", "caption_gain", "caption_gain_ci95", "eval_ce", "unigram_ce"}
    assert lc["caption_gain_ci95"][0] <= lc["caption_gain"] <= lc["caption_gain_ci95"][1]
    assert "LEARNING CHECK" in proc.stdout
    assert (out / "loss_curve.png").stat().st_size > 1000
    assert any((out / "tb").iterdir())
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000002", "step-000004"]
    assert (out / ".hydra" / "config.yaml").is_file() and (out / "adapter_trainer.log").is_file()
    steps = [r["step"] for r in read_jsonl(out / "metrics.jsonl") if "eval/ce" in r]
    assert steps == [2, 4]


# ------------------------------------------------------------------------------------------- eval math (fast)


def test_unigram_ce_scores_exactly_the_labelled_code_targets() -> None:
    vocab = AudioVocab(text_vocab_size=10, n_codebooks=2, codebook_size=3)
    logp = unigram_log_probs([np.array([[0, 1], [0, 2], [1, 2]], dtype=np.int16)], 2, 3)
    np.testing.assert_allclose(np.exp(logp).sum(1), 1.0)
    np.testing.assert_allclose(np.exp(logp[0]), [3 / 6, 2 / 6, 1 / 6])  # add-one: counts (2,1,0)+1
    # labels [B=2, S=3, J=1]: codebook-0 code 0, codebook-1 code 2, END, ignored, a text id
    labels = torch.tensor([[[10], [15], [vocab.audio_end]], [[IGNORE_INDEX], [3], [11]]])
    u = unigram_ce(labels, vocab, logp)
    assert u.count_per_codebook.tolist() == [2, 1] and u.count_per_example.tolist() == [2, 1]
    np.testing.assert_allclose(u.sum_per_codebook, [-logp[0, 0] - logp[0, 1], -logp[1, 2]])


def test_derangement_and_bootstrap() -> None:
    rng = np.random.default_rng(0)
    for n in (2, 3, 10):
        p = derangement(n, rng)
        assert sorted(p.tolist()) == list(range(n)) and not np.any(p == np.arange(n))
    with pytest.raises(ValueError, match="at least 2"):
        derangement(1, rng)
    mean, lo, hi = bootstrap_mean_ci(np.array([1.0, 2.0, 3.0, 4.0]), 500, seed=0)
    assert mean == 2.5 and 1.0 <= lo < 2.5 < hi <= 4.0
    assert bootstrap_mean_ci(np.array([1.0, 2.0, 3.0, 4.0]), 500, seed=0) == (mean, lo, hi)  # seeded


def test_warmup_cosine_schedule() -> None:
    f = WarmupCosine(warmup=4, max_steps=14, min_ratio=0.1)
    assert [round(f(s), 3) for s in range(4)] == [0.2, 0.4, 0.6, 0.8]
    assert f(4) == pytest.approx(1.0) and f(14) == pytest.approx(0.1) and f(100) == pytest.approx(0.1)
    assert all(f(s) >= f(s + 1) for s in range(4, 14))
