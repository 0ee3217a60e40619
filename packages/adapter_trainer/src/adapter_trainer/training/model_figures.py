"""Figures an adapter model reports about its own weights (logged and kept in final_metrics.json): `caption_scale`
(audio_tower=musicgen: how open its caption path is) when the model has it."""

from __future__ import annotations

from torch import nn

FIGURES = ("caption_scale",)  # methods a model may offer: () -> float


def model_figures(model: nn.Module) -> dict[str, float]:
    """{name: value} of each figure in FIGURES the model has (one host read each: call it at log time only)."""
    return {name: float(getattr(model, name)()) for name in FIGURES if callable(getattr(model, name, None))}
