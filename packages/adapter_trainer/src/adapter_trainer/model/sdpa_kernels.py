"""Which scaled_dot_product_attention kernel CUDA runs for a call: torch 2.11's rules, replayed on the host.

A transcription of `select_sdp_backend` (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp) for the dense calls
`attention.attend` makes: torch's own checks need a CUDA device, so they are restated here, tested on CPU, and
compared by `make bench-gpu` with the kernel the profiler saw.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Device:
    """What the selection reads from the GPU and the build: compute capability and the runtime cuDNN version."""

    capability: tuple[int, int]  # (major, minor): H100 (9, 0), A100 (8, 0)
    cudnn_version: int  # torch.backends.cudnn.version(): 91900 for cuDNN 9.19.0
    cudnn_enabled: bool = True  # torch.backends.cuda.cudnn_sdp_enabled()
    cudnn_deprioritized: bool = False  # TORCH_CUDNN_SDPA_DEPRIORITIZED=1: the default order even on sm90


H100 = Device((9, 0), 91900)  # torch 2.11.0+cu130 and its bundled nvidia-cudnn-cu13 9.19
A100 = Device((8, 0), 91900)


@dataclass(frozen=True)
class Call:
    """The arguments of one scaled_dot_product_attention call that the rules read (after autocast's casts)."""

    q_shape: tuple[int, int, int, int]  # [B, H, S_q, hd]
    kv_shape: tuple[int, int, int, int]  # [B, KV, S_k, hd]
    dtype: torch.dtype
    mask_shape: tuple[int, ...] | None = None  # [B|1, H|1, S_q|1, S_k|1] or None
    is_causal: bool = False
    enable_gqa: bool = False
    dropout_p: float = 0.0
    requires_grad: bool = False

    @classmethod
    def of(cls, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False) -> Call:
        """The Call of F.scaled_dot_product_attention's arguments (dtype: autocast's when it is on)."""
        dev = q.device.type
        dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else q.dtype
        return cls(
            tuple(q.shape), tuple(k.shape), dtype, None if attn_mask is None else tuple(attn_mask.shape), is_causal,
            enable_gqa, dropout_p, torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)),
        )  # fmt: skip


def _heads_ok(c: Call, gqa: bool) -> bool:
    H, KV = c.q_shape[1], c.kv_shape[1]
    return H == KV or (gqa and c.enable_gqa and KV > 0 and H % KV == 0)


def _mask_ok(c: Call) -> bool:
    if c.mask_shape is None:
        return True
    B, H, S_q, _ = c.q_shape
    m = c.mask_shape
    if len(m) not in (2, 4) or m[-2] not in (1, S_q) or m[-1] not in (1, c.kv_shape[2]):
        return False
    return len(m) == 2 or (m[0] in (1, B) and m[1] in (1, H))


def _in(cap: tuple[int, int], lo: tuple[int, int], hi: tuple[int, int]) -> bool:
    return lo <= cap <= hi


def can_use_cudnn(c: Call, d: Device) -> bool:
    hd, S_q, S_k = c.q_shape[3], c.q_shape[2], c.kv_shape[2]
    return (
        d.cudnn_enabled
        and c.dtype in HALF
        and _mask_ok(c)
        and _in(d.capability, (8, 0), (12, 1))
        and c.dropout_p * 16 == int(c.dropout_p * 16)
        and S_q > 0
        and S_k > 0
        and _heads_ok(c, gqa=True)
        and c.q_shape[0] <= 65535
        and c.q_shape[1] <= 65535
        and hd <= 128
        and hd % 8 == 0
        and S_k != 1
        and not (c.dropout_p > 0 and S_q == 1)
    )


def can_use_flash(c: Call, d: Device) -> bool:
    S_q, S_k = c.q_shape[2], c.kv_shape[2]
    return (
        c.mask_shape is None
        and c.q_shape[3] <= 256
        and _in(d.capability, (8, 0), (12, 1))
        and not (c.is_causal and S_q != S_k)
        and c.dtype in HALF
        and _heads_ok(c, gqa=True)
        and S_q > 0
        and S_k > 0
    )


def can_use_mem_efficient(c: Call, d: Device) -> bool:
    align = 8 if c.dtype in HALF else 4  # minimum_gemm_alignment on sm80+
    return (
        _in(d.capability, (5, 0), (12, 1))
        and c.q_shape[3] % align == 0
        and c.q_shape[2] > 0
        and c.kv_shape[2] > 0
        and _heads_ok(c, gqa=False)  # torch 2.11: no GQA in the memory-efficient kernel
        and c.dtype in (*HALF, torch.float32)
    )


def prefers_cudnn(d: Device) -> bool:
    """check_prefer_cudnn_attention (cu13 builds): sm9x / sm10x with a runtime cuDNN newer than 9.15."""
    return not d.cudnn_deprioritized and d.cudnn_version > 91500 and d.capability[0] in (9, 10)


def expected_kernel(c: Call, d: Device) -> str:
    """ "cudnn" | "flash" | "mem_efficient" | "math": the first kernel of the device's order that takes the call."""
    rules = {"cudnn": can_use_cudnn, "flash": can_use_flash, "mem_efficient": can_use_mem_efficient}
    order = ("cudnn", "flash", "mem_efficient") if prefers_cudnn(d) else ("flash", "mem_efficient")
    return next((name for name in order if rules[name](c, d)), "math")


def cuda_device(device: torch.device) -> Device:
    """The running GPU's Device (host-side queries only: no sync)."""
    env = os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "").upper() in ("1", "ON", "YES", "TRUE", "Y")
    return Device(
        torch.cuda.get_device_capability(device),
        torch.backends.cudnn.version() or 0,
        torch.backends.cuda.cudnn_sdp_enabled(),
        env,
    )
