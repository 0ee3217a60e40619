"""AdamW parameter groups and the warmup + cosine learning-rate schedule of the recipe."""

from __future__ import annotations

import math
from typing import Any

import torch

from adapter_trainer.config import OptimizerConfig


class WarmupCosine:
    """LR factor: linear warmup to 1 over `warmup` steps, then cosine to `min_ratio` at `max_steps`."""

    def __init__(self, warmup: int, max_steps: int, min_ratio: float) -> None:
        self.warmup, self.max_steps, self.min_ratio = warmup, max_steps, min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / (self.warmup + 1)
        progress = min(1.0, (step - self.warmup) / max(1, self.max_steps - self.warmup))
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def param_groups(
    trainable: list[torch.nn.Parameter], copies: list[torch.nn.Parameter], opt: OptimizerConfig
) -> list[dict[str, Any]]:
    """AdamW groups: new parameters (decay / no decay, lr) first, then copies of pretrained weights (decay / no decay,
    lr x opt.pretrained_copy_lr_scale) when there are any. Weight decay only on >= 2-D tensors.

    Group 0 is the new >= 2-D weights: its lr is the one logged as train/lr.
    """
    copy_ids = {id(p) for p in copies}
    new = [p for p in trainable if id(p) not in copy_ids]
    groups = [
        {"params": [p for p in new if p.ndim >= 2], "weight_decay": opt.weight_decay},
        {"params": [p for p in new if p.ndim < 2], "weight_decay": 0.0},
    ]
    if copies:
        lr = opt.lr * opt.pretrained_copy_lr_scale
        groups += [
            {"params": [p for p in copies if p.ndim >= 2], "weight_decay": opt.weight_decay, "lr": lr},
            {"params": [p for p in copies if p.ndim < 2], "weight_decay": 0.0, "lr": lr},
        ]
    return groups


def build_optimizer(
    trainable: list[torch.nn.Parameter], copies: list[torch.nn.Parameter], opt: OptimizerConfig
) -> torch.optim.AdamW:
    """AdamW over `param_groups` (fp32 master weights: the trainable tensors are fp32 whatever model.dtype is).

    On MPS the fused kernel: torch 2.11's foreach kernels have no MPS version, so its default there is a Python loop
    over the tensors (a few kernel launches each). CPU and CUDA keep torch's default.
    """
    fused = True if trainable and trainable[0].device.type == "mps" else None
    return torch.optim.AdamW(
        param_groups(trainable, copies, opt), lr=opt.lr, betas=(opt.betas[0], opt.betas[1]), fused=fused
    )


def build_scheduler(optimizer: torch.optim.Optimizer, schedule: WarmupCosine) -> torch.optim.lr_scheduler.LambdaLR:
    """LambdaLR over `schedule`, wrapped in a plain lambda so LambdaLR does not store (and on resume restore) the
    schedule's fields: the config's warmup/max_steps win, e.g. when a run is resumed with a larger max_steps."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: schedule(step))
