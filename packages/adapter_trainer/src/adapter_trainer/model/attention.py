"""The MoT layer's one attention over all positions, shaped for the fused kernels.

`sdpa_mask` picks the mask (none when causal order alone is exact, which flash attention needs; otherwise an explicit
causal + key-padding mask, `attention_mask_4d`); `attend` runs scaled_dot_product_attention with grouped k/v heads in
the form the fused kernels take: grouped (enable_gqa) where flash or cuDNN run, expanded to the query heads where the
memory-efficient kernel runs (it rejects enable_gqa); the math kernel is only the fallback. The kernel rules
themselves are `sdpa_kernels`' replay of torch's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from adapter_trainer.model import sdpa_kernels


def attention_mask_4d(attention_mask: torch.Tensor, n_new: int) -> torch.Tensor:
    """attention_mask [B, S_k] bool (True = real token) -> allowed [B, 1, S_new, S_k] for the last n_new queries.

    Query i (absolute position S_k - n_new + i) sees key j when j <= i (causal) and key j is real (padding).
    Each query also sees itself, so a pad query is never fully masked (a fully masked row would make sdpa return
    NaN, and NaN values leak through zero attention weights). Hand-written: transformers' create_causal_mask needs
    a model config and cache objects; this is four lines.
    """
    S_k = attention_mask.shape[1]
    q_pos = torch.arange(S_k - n_new, S_k, device=attention_mask.device)[:, None]  # [S_new, 1]
    k_pos = torch.arange(S_k, device=attention_mask.device)[None]  # [1, S_k]
    allowed = (k_pos <= q_pos)[None] & attention_mask[:, None, :].bool()  # [B, S_new, S_k]
    return (allowed | (k_pos == q_pos)[None])[:, None]  # [B, 1, S_new, S_k]


def sdpa_mask(attention_mask: torch.Tensor, n_new: int) -> torch.Tensor | None:
    """attention_mask [B, S_k] bool (True = real) -> attn_mask [B, 1, n_new, S_k] for `attend`, or None.

    None means causal order alone is exact, so sdpa can run without a mask (flash attention takes none):
      - no past (n_new == S_k) and no row has a pad before a real token (right padding or none): a real query i
        sees keys j <= i, all real. Pad queries see earlier pads too, unlike attention_mask_4d; their outputs are
        never read by a real position (every later query of the row is a pad) and carry no loss target.
      - one new query against a cache (n_new == 1) and no pad anywhere: it sees every key.
    Otherwise attention_mask_4d's explicit mask (left padding, pads inside a cache, several new queries after a
    past: sdpa's is_causal aligns the triangle top-left, which is wrong when n_new < S_k). One host sync per call.
    """
    S_k = attention_mask.shape[1]
    m = attention_mask.bool()
    if n_new == S_k and not bool((m[:, 1:] & ~m[:, :-1]).any()):  # no real token right after a pad
        return None
    if n_new == 1 and bool(m.all()):
        return None
    return attention_mask_4d(m, n_new)  # [B, 1, n_new, S_k]


def _flash_takes_it(q: torch.Tensor) -> bool:
    """Whether a maskless call can keep grouped k/v (enable_gqa): fp16/bf16 compute (q's dtype, or autocast's) on
    CUDA sm80+ or CPU, whose flash kernels take it. Elsewhere (fp32, older GPUs, MPS) k/v are expanded so the
    memory-efficient kernel, which rejects enable_gqa, stays reachable."""
    dev = q.device.type
    dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else q.dtype
    if dtype not in (torch.float16, torch.bfloat16):
        return False
    return dev == "cpu" or (dev == "cuda" and torch.cuda.get_device_capability(q.device) >= (8, 0))


def _cudnn_takes_grouped(q, k, v, allowed, is_causal: bool, dropout_p: float) -> bool:
    """Whether CUDA would run this call with grouped k/v (enable_gqa) on cuDNN (sdpa_kernels' replay of torch's
    rules; host-side queries only). False off CUDA, so CPU keeps its calls."""
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

    Kernel eligibility (torch 2.11's sdp_utils, restated in sdpa_kernels): flash takes no attn_mask and needs
    fp16/bf16 but takes enable_gqa; cuDNN (first on sm90) takes a mask and enable_gqa but needs fp16/bf16;
    memory-efficient takes a mask but not enable_gqa. So k/v are expanded to the H query heads (as transformers'
    repeat_kv) unless there is no mask and flash can run (`_flash_takes_it`), or a mask and cuDNN runs
    (`_cudnn_takes_grouped`), with enable_gqa and the un-expanded k/v. One query (S == 1, a decoding step) with grouped heads folds each group into the query axis
    instead, so the cache's k/v are read in place. allowed=None means causal (S == S_k) or one query seeing every key
    (S == 1).
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
        # A mask and half precision on a GPU where cuDNN runs first (sm90: H100): cuDNN takes enable_gqa, so the
        # k/v stay grouped (the x4 expansion exists for the memory-efficient kernel, which rejects enable_gqa).
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, is_causal=is_causal, scale=scale, dropout_p=dropout_p, enable_gqa=True
        )  # [B, H, S, hd]
    if S == 1 and rep > 1:
        # One query (a decoding step): fold each group's query heads into the query axis, so k/v stay the cache's
        # own buffers (expanding them would copy the whole past every step, H/KV times what torch.cat copied).
        # Query head h reads k/v head h // rep, as repeat_interleave pairs them; the mask [B, 1, 1, S_k] broadcasts.
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
