"""Minimal LoRA for the shared (frozen) Llama attention projections."""
from __future__ import annotations

import math

import torch
from torch import nn


class LoRALinear(nn.Module):
    """y = base(x) + (alpha / r) * B(A(x)); base frozen, B zero-initialised (starts exactly as `base`).

    The frozen `base` keeps its name (`<proj>.base.weight`), so the LLM's own weights stay addressable.
    """

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        if rank <= 0:
            raise ValueError(f"LoRA rank must be > 0 (got {rank}); set lora_rank=0 to disable LoRA")
        self.base = base
        self.base.requires_grad_(False)
        self.rank, self.scaling = rank, alpha / rank
        w = base.weight
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, device=w.device, dtype=w.dtype)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, device=w.device, dtype=w.dtype)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    @property
    def weight(self) -> torch.Tensor:
        """The frozen base weight (for code that inspects `proj.weight`)."""
        return self.base.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling  # [..., out]


def add_lora(module: nn.Module, names: tuple[str, ...], rank: int, alpha: float) -> None:
    """Replace the nn.Linear children `names` of `module` (e.g. q_proj, v_proj) by LoRALinear wrappers."""
    for name in names:
        base = getattr(module, name)
        if isinstance(base, LoRALinear):
            raise ValueError(f"{name} already has LoRA; build the MoT model from a fresh LLM")
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRA expects nn.Linear at {name}, got {type(base).__name__}")
        setattr(module, name, LoRALinear(base, rank, alpha))
