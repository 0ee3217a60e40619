"""The MoT layer's one attention over all positions, shaped for the fused kernels (docs/architecture.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from adapter_trainer.model import sdpa_kernels


def attention_mask_4d(attention_mask: torch.Tensor, n_new: int) -> torch.Tensor:
    """attention_mask [B, S_k] bool (True = real token) -> allowed [B, 1, S_new, S_k] for the last n_new queries.

    Query i (absolute position S_k - n_new + i) sees key j when j <= i (causal) and key j is real (padding).
    Each query also sees itself, so a pad query is never fully masked (sdpa returns NaN for a fully masked row).
    """
    S_k = attention_mask.shape[1]
    q_pos = torch.arange(S_k - n_new, S_k, device=attention_mask.device)[:, None]  # [S_new, 1]
    k_pos = torch.arange(S_k, device=attention_mask.device)[None]  # [1, S_k]
    allowed = (k_pos <= q_pos)[None] & attention_mask[:, None, :].bool()  # [B, S_new, S_k]
    return (allowed | (k_pos == q_pos)[None])[:, None]  # [B, 1, S_new, S_k]


def sdpa_mask(attention_mask: torch.Tensor, n_new: int) -> torch.Tensor | None:
    """attention_mask [B, S_k] bool (True = real) -> attn_mask [B, 1, n_new, S_k] for `attend`, or None.

    None when causal order alone is exact (flash attention takes no mask): no past and no pad before a real token
    (pad queries' outputs are never read and carry no target), or one new query and no pad anywhere. Otherwise
    attention_mask_4d's (sdpa's is_causal aligns the triangle top-left, wrong when n_new < S_k).
    """
    S_k = attention_mask.shape[1]
    m = attention_mask.bool()
    if n_new == S_k and not bool((m[:, 1:] & ~m[:, :-1]).any()):  # no real token right after a pad
        return None
    if n_new == 1 and bool(m.all()):
        return None
    return attention_mask_4d(m, n_new)  # [B, 1, n_new, S_k]


def _flash_takes_it(q: torch.Tensor) -> bool:
    """Whether a maskless call can keep grouped k/v (enable_gqa): fp16/bf16 compute on CUDA sm80+ or CPU (flash)."""
    dev = q.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else q.dtype
    if dtype not in (torch.float16, torch.bfloat16):
        return False
    return dev == "cpu" or (dev == "cuda" and torch.cuda.get_device_capability(q.device) >= (8, 0))


def _cudnn_takes_grouped(q, k, v, allowed, is_causal: bool, dropout_p: float) -> bool:
    """Whether CUDA would run this call with grouped k/v on cuDNN (sdpa_kernels' rules); False off CUDA."""
    if q.device.type != "cuda":
        return False
    call = sdpa_kernels.Call.of(q, k, v, allowed, dropout_p, is_causal, enable_gqa=True)
    return sdpa_kernels.expected_kernel(call, sdpa_kernels.cuda_device(q.device)) == "cudnn"


def attend(
    q: torch.Tensor,  # [B, H, S, hd]
    k: torch.Tensor,  # [B, KV, S_k, hd]
    v: torch.Tensor,  # [B, KV, S_k, hd]
    allowed: torch.Tensor | None,  # [B, 1, S, S_k] bool, or None (sdpa_mask)
    scale: float,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Scaled dot-product attention with grouped k/v heads, in the form the fused kernels accept -> [B, H, S, hd].

    k/v stay grouped (enable_gqa) where flash or cuDNN run, and are expanded to the H query heads for the
    memory-efficient kernel (it rejects enable_gqa). A decoding step (S == 1) folds each group into the query axis.
    allowed=None means causal (S == S_k) or one query seeing every key (S == 1).
    """
    S, S_k = q.shape[2], k.shape[2]
    if allowed is None and S not in (1, S_k):
        raise ValueError(f"attend without a mask needs S == S_k or S == 1 (got S={S}, S_k={S_k}); pass sdpa_mask's")
    is_causal = allowed is None and S > 1
    if allowed is None and _flash_takes_it(q):
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=is_causal, scale=scale, dropout_p=dropout_p, enable_gqa=True
        )  # [B, H, S, hd]
    B, H, _, hd = q.shape
    KV = k.shape[1]
    rep = H // KV
    if rep > 1 and S > 1 and _cudnn_takes_grouped(q, k, v, allowed, is_causal, dropout_p):
        # cuDNN runs first (sm90) and takes enable_gqa with a mask: k/v stay grouped.
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, is_causal=is_causal, scale=scale, dropout_p=dropout_p, enable_gqa=True
        )  # [B, H, S, hd]
    if S == 1 and rep > 1:
        # Fold each group's query heads into the query axis, so k/v stay the cache's own buffers (no copy of the
        # past per step). Query head h reads k/v head h // rep, as repeat_interleave pairs them.
        o = F.scaled_dot_product_attention(
            q.reshape(B, KV, rep, hd), k, v, attn_mask=allowed, scale=scale, dropout_p=dropout_p
        )  # [B, KV, rep, hd]
        return o.reshape(B, H, 1, hd)  # [B, KV, rep, hd] -> [B, H, 1, hd]
    if rep > 1:  # MHA (rep 1) has nothing to expand: repeat_interleave(1) would copy the whole cache
        k = k.repeat_interleave(rep, dim=1)  # [B, KV, S_k, hd] -> [B, H, S_k, hd]
        v = v.repeat_interleave(rep, dim=1)  # [B, KV, S_k, hd] -> [B, H, S_k, hd]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=allowed, is_causal=is_causal, scale=scale, dropout_p=dropout_p
    )  # [B, H, S, hd]
