"""Mixture-of-Transformers adapter. INTERFACE STUB (to be implemented); names/shapes are the contract with recipe.py."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn


@dataclass
class MoTConfig:
    layer_map: list[int] | None = None  # llm layer l -> musicgen layer m(l); None = evenly spaced
    freeze_audio_ffn: bool = True
    lora_rank: int = 0  # 0 = no LoRA on the shared attention
    lora_alpha: float = 16.0
    audio_embed_init: Literal["musicgen", "random"] = "musicgen"
    audio_head_init: Literal["musicgen", "random"] = "musicgen"
    random_init_scale: float = 0.1  # x text-embedding std, for "random" init


@dataclass
class LossOutput:
    loss: torch.Tensor  # [] mean CE over all target tokens (codes + AUDIO_END), differentiable
    ce_sum_per_codebook: torch.Tensor  # [K] float, summed CE over code targets of codebook k (detached)
    count_per_codebook: torch.Tensor  # [K] long
    ce_sum_per_example: torch.Tensor  # [B] float, summed CE over code targets (detached)
    count_per_example: torch.Tensor  # [B] long
    end_ce_sum: torch.Tensor  # [] AUDIO_END targets
    end_count: torch.Tensor  # []


class MoTAdapterModel(nn.Module):
    """forward(tokens [B,S,J], is_audio [B,S]) -> logits; compute_loss(batch) -> LossOutput."""

    def __init__(self, llm, audio_lm, vocab, pattern: str, cfg: MoTConfig): ...
    def forward(self, tokens: torch.Tensor, is_audio: torch.Tensor) -> torch.Tensor: ...
    def compute_loss(self, batch) -> LossOutput: ...
    def trainable_state_dict(self) -> dict[str, torch.Tensor]: ...
    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...
