"""Minimal LoRA delta for the audio rows of the frozen Llama attention projections.

Hand-written (about 20 lines) rather than peft: peft wraps a whole `nn.Linear`, so its delta would also reach text
positions; here the delta is a separate module the MoT layer adds to audio rows only.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class LoRADelta(nn.Module):
    """delta(x) = (alpha / r) * B(A(x)); B zero-initialised, so the delta is exactly 0 at init.

    The frozen base projection is not held here: `MoTLayer` computes `base(x)` for every row and adds the delta
    to audio rows only, which keeps text rows exactly the frozen LLM's.
    """

    def __init__(self, in_features: int, out_features: int, rank: int, alpha: float, like: torch.Tensor) -> None:
        super().__init__()
        if rank <= 0:
            raise ValueError(
                f"LoRA rank must be > 0 (got {rank}); set model.mot.lora_rank>=1 with audio_attention=lora"
            )
        self.rank, self.scaling = rank, alpha / rank
        self.lora_A = nn.Linear(in_features, rank, bias=False, device=like.device, dtype=like.dtype)
        self.lora_B = nn.Linear(rank, out_features, bias=False, device=like.device, dtype=like.dtype)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, in] -> delta [N, out]."""
        return self.lora_B(self.lora_A(x)) * self.scaling  # [N, out]
