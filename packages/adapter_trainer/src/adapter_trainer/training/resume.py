"""Resume a run in place from trainer.resume: adapter weights, optimizer moments, GradScaler, RNG, data position."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from adapter_trainer.config import OptimizerConfig
from adapter_trainer.training import checkpoint

if TYPE_CHECKING:  # builders/mot pull in transformers: not at import time
    from adapter_trainer.model.mot import MoTAdapterModel


def resume_run(
    resume: str,
    output_dir: Path,
    *,
    fingerprint: dict[str, Any],
    model: MoTAdapterModel,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    schedule: Any,
    scaler: torch.amp.GradScaler | None,
    optimizer_cfg: OptimizerConfig,
) -> tuple[checkpoint.TrainingProgress, list[str]]:
    """Load the checkpoint trainer.resume names into the just-built run. Returns (its progress, optimizer changes)."""
    ckpt_dir = checkpoint.find_checkpoint(resume, output_dir)
    ckpt = checkpoint.load_checkpoint(ckpt_dir)
    checkpoint.check_fingerprint(ckpt.fingerprint, fingerprint, ckpt_dir)
    model.load_trainable_state_dict(ckpt.adapter)
    # Config wins for optimizer.* (documented in checkpoint.py); the checkpoint gives the moments and step.
    checkpoint.load_optimizer_with_config(optimizer, scheduler, ckpt.optimizer, ckpt.scheduler, schedule)
    changes = checkpoint.optimizer_changes(ckpt_dir, asdict(optimizer_cfg))
    for line in changes:
        print(f"resume: {line} (applied: the config wins for optimizer settings)")
    if scaler is not None and ckpt.scaler is not None:
        scaler.load_state_dict(ckpt.scaler)
    checkpoint.restore_rng(ckpt.rng_torch, ckpt.rng)
    progress = ckpt.progress
    print(f"resumed from {ckpt_dir} at step {progress.step} (epoch {progress.epoch}, index {progress.index})")
    return progress, changes
