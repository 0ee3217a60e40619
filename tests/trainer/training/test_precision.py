"""Precision: trainable params are fp32 master weights whatever model.dtype is, the frozen towers
follow model.dtype, fp16 is refused off CUDA with the alternative named; frozen towers stay in eval()."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from adapter_trainer.config import ConfigError
from adapter_trainer.training.recipe import MoTAdapterRecipe
from tests.trainer.helpers import make_cfg, tiny_mot


def test_bf16_towers_keep_fp32_trainable_weights_and_tiny_updates(models, shards, tmp_path: Path) -> None:
    cfg = make_cfg(
        models,
        shards,
        tmp_path / "run",
        "model.mot.audio_tower=llm",  # the tower whose 1.1 M trainable audio weights the update count below reads
        "model.dtype=bfloat16",
        "trainer.precision=bf16",
        "trainer.max_steps=1",
        "optimizer.lr=1e-5",
        "optimizer.warmup_steps=0",
        "optimizer.grad_clip=0",
    )
    recipe = MoTAdapterRecipe(cfg)
    recipe.setup()
    named = dict(recipe.model.named_parameters())
    trainable = {n: p for n, p in named.items() if p.requires_grad}
    frozen = {n: p for n, p in named.items() if not p.requires_grad}
    assert trainable and frozen
    assert {str(p.dtype) for p in trainable.values()} == {"torch.float32"}, {
        n: p.dtype for n, p in trainable.items() if p.dtype != torch.float32
    }
    assert {str(p.dtype) for p in frozen.values()} == {"torch.bfloat16"}

    # AdamW's first step moves each weight by ~lr = 1e-5. For |w| >= 2^-6, bf16's spacing is >= 2^-13, so a bf16
    # weight would round that update away; the fp32 master weights must keep it.
    before = {n: p.detach().clone() for n, p in trainable.items()}
    recipe.train()
    n_kept = 0
    for n, p in trainable.items():
        big = before[n].abs() >= 2**-6
        w0, update = before[n][big], (p.detach() - before[n])[big]  # [N], [N]
        n_kept += int((update != 0).sum())
        assert not update.numel() or float(update.abs().max()) < 1e-4, n  # the update really is ~lr
        # the same update added to the bf16 weights rounds back to them (what bf16 trainable weights did)
        w0_bf16 = w0.to(torch.bfloat16)
        assert torch.equal((w0_bf16.float() + update).to(torch.bfloat16), w0_bf16), n
    assert n_kept > 1000, f"only {n_kept} sub-bf16-resolution updates were kept"
    assert {str(p.dtype) for p in recipe.trainable} == {"torch.float32"}  # still fp32 after the step


def test_fp16_on_cpu_is_refused_with_the_alternative(models, shards, tmp_path: Path) -> None:
    cfg = make_cfg(models, shards, tmp_path / "run", "model.dtype=float16", "trainer.precision=fp16")
    with pytest.raises(ConfigError) as e:
        MoTAdapterRecipe(cfg).setup()
    msg = str(e.value)
    assert "trainer.precision=fp16 needs CUDA" in msg and "trainer.precision=bf16 with model.dtype=bfloat16" in msg
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize(
    "dtype,precision,fix",
    [("bfloat16", "fp32", "trainer.precision=bf16"), ("float16", "bf16", "trainer.precision=fp16")],
)
def test_low_precision_towers_need_the_matching_autocast(models, shards, tmp_path: Path, dtype, precision, fix) -> None:
    with pytest.raises(ConfigError) as e:
        make_cfg(models, shards, tmp_path / "run", f"model.dtype={dtype}", f"trainer.precision={precision}")
    assert fix in str(e.value) and "model.dtype=float32" in str(e.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 + GradScaler runs only on CUDA (refused on CPU above)")
def test_fp16_with_grad_scaler_trains_on_cuda(models, shards, tmp_path: Path) -> None:
    cfg = make_cfg(
        models,
        shards,
        tmp_path / "run",
        "model.dtype=float16",
        "trainer.precision=fp16",
        "trainer.device=cuda",
        "trainer.max_steps=2",
    )
    recipe = MoTAdapterRecipe(cfg)
    recipe.setup()
    recipe.train()  # used to fail with "Attempting to unscale FP16 gradients"
    assert recipe.progress.step == 2 and {p.dtype for p in recipe.trainable} == {torch.float32}


def test_frozen_towers_stay_in_eval_mode_during_training() -> None:
    model, _ = tiny_mot(lora_rank=2)
    model.train()
    lora = {n for n, m in model.named_modules() if n.endswith(("lora_A", "lora_B"))}
    assert lora
    for name, m in model.llm.named_modules():
        full = f"llm.{name}" if name else "llm"
        assert m.training == (full in lora), full  # only LoRA trains inside the frozen Llama
    for layer in model.layers:
        assert layer.audio.down.training and layer.audio.up.training and layer.audio.norm.training
        assert not layer.audio.fc1.training and not layer.audio.fc2.training  # frozen MusicGen FFN
    assert model.embed_adapter.training and model.lm_heads[0].training
    model.eval()
    assert not any(m.training for m in model.modules())
