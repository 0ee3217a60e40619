"""Resume a run in place from trainer.resume: adapter weights, optimizer moments, GradScaler, RNG, data position."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from adapter_trainer.config import OptimizerConfig, TrainConfig
from adapter_trainer.training import checkpoint
from adapter_trainer.training.distributed import RankInfo

if TYPE_CHECKING:  # builders/mot pull in transformers: not at import time
    from adapter_trainer.model.mot import MoTAdapterModel


def read_on_main(
    resume: str, output_dir: Path, dist: RankInfo, optimizer_cfg: OptimizerConfig, max_steps: int | None = None
) -> tuple[Path, checkpoint.LoadedCheckpoint, list[str], list[str]]:
    """Rank 0 reads the checkpoint, the optimizer settings and trainer.max_steps changed since, and broadcasts them
    (nodes need no shared disk); a failure is one ResumeError line on every rank."""
    found, error = None, None
    if dist.is_main:
        ckpt_dir = None
        try:
            ckpt_dir = checkpoint.find_checkpoint(resume, output_dir)
            ckpt = checkpoint.load_checkpoint(ckpt_dir)
            steps = [] if max_steps is None else checkpoint.max_steps_change(ckpt_dir, max_steps)
            found = (ckpt_dir, ckpt, checkpoint.optimizer_changes(ckpt_dir, asdict(optimizer_cfg)), steps)
        except checkpoint.ResumeError as e:
            error = str(e)
        except Exception as e:  # a file of the checkpoint missing, truncated or not what it should be: one line
            first = (str(e).strip().splitlines() or [""])[0][:300]
            error = (
                f"cannot read the checkpoint {ckpt_dir} ({type(e).__name__}: {first}); resume from an earlier "
                f"step-* directory (trainer.resume=/path/to/step-XXXXXX) or move this one out of the way"
            )
    found, error = dist.broadcast_object((found, error))
    if error is not None:
        raise checkpoint.ResumeError(error if dist.is_main else f"rank 0: {error}")
    return found  # type: ignore[return-value]


def resume_run(
    cfg: TrainConfig,
    output_dir: Path,
    *,
    dist: RankInfo,
    fingerprint: dict[str, Any],
    model: MoTAdapterModel,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    schedule: Any,
    scaler: torch.amp.GradScaler | None,
) -> tuple[checkpoint.TrainingProgress, list[str]]:
    """Load the checkpoint cfg.trainer.resume names into the just-built run (the config wins for optimizer.*);
    returns (its progress, the optimizer settings that changed)."""
    ckpt_dir, ckpt, changes, steps = read_on_main(
        cfg.trainer.resume, output_dir, dist, cfg.optimizer, cfg.trainer.max_steps
    )
    checkpoint.check_fingerprint(ckpt.fingerprint, fingerprint, ckpt_dir)
    model.load_trainable_state_dict(ckpt.adapter)
    checkpoint.load_optimizer_with_config(optimizer, scheduler, ckpt.optimizer, ckpt.scheduler, schedule)
    for line in changes:
        print(f"resume: {line} (applied: the config wins for optimizer settings)")
    for line in steps:
        print(f"resume: {line} (applied: the LR schedule's cosine now ends at step {cfg.trainer.max_steps})")
    if scaler is not None and ckpt.scaler is not None:
        scaler.load_state_dict(ckpt.scaler)
    checkpoint.restore_rng(ckpt.rng_torch, ckpt.rng)
    progress = ckpt.progress
    print(f"resumed from {ckpt_dir} at step {progress.step} (epoch {progress.epoch}, index {progress.index})")
    return progress, changes
