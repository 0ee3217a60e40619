"""Device and precision for training and generation: the device, the precisions it allows, the autocast context.
A requested device that is missing is a ConfigError naming the override, never a silent fallback.
"""

from __future__ import annotations

import contextlib

import torch

from adapter_trainer.config import ConfigError

PRECISION_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(requested: str) -> torch.device:
    """`auto` -> cuda > mps > cpu. An explicitly requested device that is missing is a ConfigError, not a fallback."""
    has_mps = hasattr(torch.backends, "mps") and torch.backends.mps.is_available()
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "mps" if has_mps else "cpu")
    try:
        dev = torch.device(requested)
    except RuntimeError as e:
        raise ConfigError(
            f"trainer.device={requested!r} is not a device ({e}); use auto, cpu, cuda, cuda:N or mps"
        ) from e
    available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": has_mps}
    if dev.type not in available:
        raise ConfigError(f"trainer.device={requested!r} is not supported; use auto, cpu, cuda, cuda:N or mps")
    if not available[dev.type]:
        raise ConfigError(
            f"trainer.device={requested} was requested but {dev.type.upper()} is not available on this machine. "
            f"Override it: trainer.device=cpu (or trainer.device=auto to pick the best available device)"
        )
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ConfigError(
            f"trainer.device={requested}: only {torch.cuda.device_count()} CUDA device(s); "
            f"use trainer.device=cuda:0 or trainer.device=auto"
        )
    return dev


def check_precision(precision: str, device: torch.device) -> None:
    """fp16 only on CUDA (needs a GradScaler); bf16 on CUDA only where the GPU supports it."""
    if precision == "fp16" and device.type != "cuda":
        raise ConfigError(
            f"trainer.precision=fp16 needs CUDA (loss scaling with a GradScaler); on {device.type} use "
            f"trainer.precision=bf16 with model.dtype=bfloat16 (or float32), or trainer.precision=fp32 "
            f"with model.dtype=float32"
        )
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError("trainer.precision=bf16 is not supported by this GPU; use trainer.precision=fp16 or fp32")


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """torch.autocast for bf16/fp16 on `device`; a no-op context for fp32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=PRECISION_DTYPE[precision])


def device_memory_gb(device: torch.device) -> dict[str, float]:
    """The accelerator's memory in GiB for the training log (CUDA: allocated, peak since the last call, reserved;
    MPS: tensors, the driver's total, macOS's recommended maximum); empty on CPU."""
    gib = float(2**30)
    if device.type == "cuda":
        out = {
            "mem_allocated_gb": torch.cuda.memory_allocated(device) / gib,
            "mem_peak_gb": torch.cuda.max_memory_allocated(device) / gib,
            "mem_reserved_gb": torch.cuda.memory_reserved(device) / gib,
        }
        torch.cuda.reset_peak_memory_stats(device)
        return out
    if device.type == "mps":
        return {
            "mem_allocated_gb": torch.mps.current_allocated_memory() / gib,
            "mem_driver_gb": torch.mps.driver_allocated_memory() / gib,
            "mem_recommended_max_gb": torch.mps.recommended_max_memory() / gib,
        }
    return {}
