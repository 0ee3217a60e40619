"""Accumulation and resume: window-normalised loss, the resume fingerprint, optimizer changes
applied on resume, and fresh runs refused in a directory that holds checkpoints."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from adapter_trainer.data.token_layout import collate
from adapter_trainer.training.checkpoint import ResumeError, prepare_output_dir
from adapter_trainer.training.metric_logging import read_jsonl
from adapter_trainer.training.optim import WarmupCosine
from adapter_trainer.training.recipe import MoTAdapterRecipe, recipe_main
from adapter_trainer.training.step import backward_accum_group, count_targets
from tests.trainer.helpers import example, make_cfg, tiny_mot


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def test_accumulated_micro_batches_give_the_big_batch_gradient() -> None:
    model, vocab = tiny_mot(lora_rank=2)
    for p in model.parameters():  # non-zero up-projections, so every trainable tensor gets a gradient
        if p.requires_grad and not p.any():
            torch.nn.init.normal_(p, std=0.02)
    exs = [example(vocab, 3, 6, seed=0), example(vocab, 9, 30, seed=1), example(vocab, 5, 14, seed=2)]
    micro = [collate(exs[:1], pad_id=2), collate(exs[1:], pad_id=2)]  # 1 short clip | 2 longer clips
    counts = [count_targets(b) for b in micro]
    assert counts[0] * 3 < counts[1]  # very different target counts per micro-batch
    nullcast = contextlib.nullcontext

    model.zero_grad(set_to_none=True)
    big = backward_accum_group(model, [collate(exs, pad_id=2)], autocast=nullcast)
    g_big = _grads(model)
    model.zero_grad(set_to_none=True)
    acc = backward_accum_group(model, micro, autocast=nullcast)
    g_acc = _grads(model)
    assert g_big.keys() == g_acc.keys() and len(g_big) > 10
    assert acc.n_targets == big.n_targets == sum(counts)
    assert acc.loss == pytest.approx(big.loss, rel=1e-5)
    for n in g_big:  # float32 sums in another order (and padded rows in the big batch): rtol 1e-4, atol 1e-7
        torch.testing.assert_close(g_acc[n], g_big[n], rtol=1e-4, atol=1e-7, msg=n)

    # the old rule (mean of the micro-batch means) weighs the short clip's targets more: a different gradient
    model.zero_grad(set_to_none=True)
    for b in micro:
        (model.compute_loss(b).loss / len(micro)).backward()
    g_old = _grads(model)
    assert any(not torch.allclose(g_old[n], g_big[n], rtol=1e-2, atol=1e-6) for n in g_big)


def test_fingerprint_covers_seed_text_and_sequence_budgets(models, shards, step2_ckpt: Path, tmp_path: Path) -> None:
    cfg = make_cfg(
        models,
        shards,
        tmp_path / "r",
        "trainer.max_steps=4",
        f"trainer.resume={step2_ckpt}",
        "trainer.seed=7",
        "data.text=aspects",
        "data.max_seq_len=40",
        "data.max_caption_tokens=8",
    )
    with pytest.raises(ResumeError) as e:
        MoTAdapterRecipe(cfg).setup()
    msg = str(e.value)
    for line in (
        "trainer.seed: checkpoint=1234 run=7",
        "data.text: checkpoint='caption' run='aspects'",
        "data.max_seq_len: checkpoint=48 run=40",
        "data.max_caption_tokens: checkpoint=12 run=8",
    ):
        assert line in msg, (line, msg)


def test_changed_optimizer_settings_are_applied_on_resume(models, shards, step2_ckpt: Path, tmp_path: Path) -> None:
    same = MoTAdapterRecipe(
        make_cfg(models, shards, tmp_path / "a", "trainer.max_steps=4", f"trainer.resume={step2_ckpt}")
    )
    same.setup()
    saved = torch.load(step2_ckpt / "optimizer.pt", weights_only=True)
    assert same.optimizer_changes == []
    assert same.optimizer.param_groups[0]["lr"] == pytest.approx(saved["param_groups"][0]["lr"], rel=1e-12)

    changed = MoTAdapterRecipe(
        make_cfg(
            models,
            shards,
            tmp_path / "b",
            "trainer.max_steps=4",
            f"trainer.resume={step2_ckpt}",
            "optimizer.lr=1e-3",
            "optimizer.betas=[0.8,0.9]",
            "optimizer.weight_decay=0.1",
            "optimizer.pretrained_copy_lr_scale=0.5",
        )
    )
    changed.setup()
    factor = WarmupCosine(3, 4, changed.cfg.optimizer.min_lr_ratio)(2)  # the schedule at step 2 under the new config
    decay, no_decay, copy_decay, copy_no_decay = changed.optimizer.param_groups  # new tensors, then pretrained copies
    assert decay["initial_lr"] == 1e-3 and decay["lr"] == pytest.approx(1e-3 * factor, rel=1e-12)
    assert tuple(decay["betas"]) == (0.8, 0.9) and decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert copy_no_decay["params"] and copy_no_decay["initial_lr"] == 5e-4  # the experts' norms: lr x the new scale
    assert copy_no_decay["lr"] == pytest.approx(5e-4 * factor, rel=1e-12) and copy_no_decay["weight_decay"] == 0.0
    assert changed.scheduler.get_last_lr()[0] == pytest.approx(1e-3 * factor, rel=1e-12)
    lr0 = same.cfg.optimizer.lr  # the demo preset's lr, which the checkpoint was trained with
    assert f"optimizer.lr: {lr0!r} -> 0.001" in changed.optimizer_changes, changed.optimizer_changes
    assert any(c.startswith("optimizer.betas:") for c in changed.optimizer_changes)
    # AdamW's moments still come from the checkpoint
    state = changed.optimizer.state_dict()["state"]
    assert state.keys() == saved["state"].keys()
    assert all(torch.equal(state[i]["exp_avg"], saved["state"][i]["exp_avg"]) for i in state)
    changed.train()  # and training goes on with the new settings
    assert changed.progress.step == 4


def test_fresh_run_into_a_dir_with_checkpoints_is_refused(models, shards, step2_ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "old"
    shutil.copytree(step2_ckpt, out / "checkpoints" / step2_ckpt.name)
    with pytest.raises(ResumeError) as e:
        MoTAdapterRecipe(make_cfg(models, shards, out, "trainer.max_steps=2")).setup()
    assert "trainer.resume=latest" in str(e.value) and "trainer.overwrite=true" in str(e.value)
    assert (out / "checkpoints" / step2_ckpt.name / "adapter.safetensors").is_file()  # nothing was touched
    prepare_output_dir(out, resume="latest", overwrite=False)  # resuming it is fine
    prepare_output_dir(out, resume=None, overwrite=True)  # an explicit overwrite deletes the old checkpoints
    assert not (out / "checkpoints").exists()


def test_resume_with_other_optimizer_groups_is_refused_clearly() -> None:
    """A checkpoint from before copies of pretrained weights had their own AdamW groups (2 groups, 3 tensors) meets
    this run's 4 groups: a ResumeError naming the cause and the fix, not torch's size-mismatch ValueError."""
    from adapter_trainer.training.checkpoint import ResumeError, load_optimizer_with_config

    ps = [torch.nn.Parameter(torch.zeros(2, 2)) for _ in range(3)]
    old = torch.optim.AdamW([{"params": ps[:2]}, {"params": ps[2:]}], lr=1e-3)
    old_sched = torch.optim.lr_scheduler.LambdaLR(old, lambda step: 1.0)
    new = torch.optim.AdamW(
        [{"params": ps[:1]}, {"params": ps[2:]}, {"params": ps[1:2], "lr": 1e-4}, {"params": []}], lr=1e-3
    )
    new_sched = torch.optim.lr_scheduler.LambdaLR(new, lambda step: 1.0)
    with pytest.raises(ResumeError, match="AdamW groups hold .* another model or checkpoint layout; retrain"):
        load_optimizer_with_config(new, new_sched, old.state_dict(), old_sched.state_dict(), lambda step: 1.0)
    # same groups: fine
    load_optimizer_with_config(old, old_sched, old.state_dict(), old_sched.state_dict(), lambda step: 1.0)


def test_resuming_a_finished_run_logs_its_last_eval_once(models, shards, step2_ckpt: Path, tmp_path: Path) -> None:
    """A run resumed at its last step evaluates again for the report, but metrics.jsonl keeps one eval record for
    that step (the one the finished run logged), as a run that was never interrupted."""
    out = tmp_path / "finished"
    shutil.copytree(step2_ckpt.parent.parent, out)
    before = [r for r in read_jsonl(out / "metrics.jsonl") if "eval/ce" in r]
    assert [r["step"] for r in before] == [2]
    recipe_main(make_cfg(models, shards, out, "trainer.max_steps=2", "trainer.resume=latest"))
    after = [r for r in read_jsonl(out / "metrics.jsonl") if "eval/ce" in r]
    assert after == before
    assert json.loads((out / "final_metrics.json").read_text())["eval"]["ce"] == pytest.approx(before[0]["eval/ce"])


def test_a_metrics_line_torn_by_a_killed_run_is_dropped_on_resume(tmp_path: Path) -> None:
    from adapter_trainer.training.metric_logging import JsonlLogger

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "train/loss": 2.0}\n{"step": 2, "eval/ce": 1.5}\n{"step": 3, "train/lo')
    logger = JsonlLogger(path, truncate_after_step=2)
    assert logger.steps_with("eval/ce") == {2}
    logger.log_dict({"train/loss": 1.0}, 3)
    logger.close()
    assert [r["step"] for r in read_jsonl(path)] == [1, 2, 3]
