"""The trainable part of an adapter model, by stable name: what checkpoints and exported folders hold.

Both adapter models (`mot.MoTAdapterModel`, `musicgen_rows.MusicgenRowsMoT`) freeze their towers and train only new or
copied tensors; `AdapterParams` gives them one way to read and load those tensors.
"""

from __future__ import annotations

import torch
from torch import nn


class AdapterParams(nn.Module):
    """`trainable_state_dict` / `load_trainable_state_dict` over the parameters with requires_grad."""

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Only the trainable tensors (adapters, audio norms/embeddings/heads, LoRA...), detached, by stable name."""
        return {name: p.detach().clone() for name, p in self.named_parameters() if p.requires_grad}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load what trainable_state_dict wrote; refuses missing/unexpected names and shape changes."""
        params = {name: p for name, p in self.named_parameters() if p.requires_grad}
        missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        if missing or unexpected:
            raise ValueError(
                f"adapter checkpoint does not match this model: missing {missing[:8]}, unexpected {unexpected[:8]}; "
                f"resume with the same model config (audio_tower, pattern, audio_attention, lora_rank, init choices)"
            )
        for name, p in params.items():
            if tuple(state[name].shape) != tuple(p.shape):
                raise ValueError(
                    f"adapter tensor {name}: checkpoint shape {tuple(state[name].shape)} != model {tuple(p.shape)}"
                )
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(state[name].to(device=p.device, dtype=p.dtype))
