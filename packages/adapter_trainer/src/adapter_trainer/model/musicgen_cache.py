"""The generation state of `model.mot.audio_tower=musicgen`: the caption's cross-attention keys (`CaptionKeys`,
training's too), the cache kept between steps (`MusicgenRowsCache`) and the one-position decoding layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from adapter_trainer.data.token_layout import AudioVocab
from adapter_trainer.model.kv_cache import LayerKV, MoTKVCache


@dataclass
class CaptionKeys:
    """The caption as every MusicGen layer's cross-attention reads it."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per MusicGen layer, keys and values [B, H, T, hd]
    # [B, 1, 1, T] bool: the keys each row attends to, its caption rows; a row without any gets every key (SDPA over
    # an all-False mask can be NaN, and NaN would reach the gradients) over values that are zero, so its output is 0
    mask: torch.Tensor
    present: torch.Tensor  # [B, 1, 1] bool: the row has a caption (at least one text row after BOS)


@dataclass
class MusicgenRowsCache:
    """What generation keeps between steps: the caption's keys/values per MusicGen layer and the audio rows'
    self-attention keys/values per MusicGen layer.

    The self-attention keys/values live in a `MoTKVCache`, written in place (transformers' `DynamicCache` copies
    the whole past every step).
    """

    caption: CaptionKeys | None  # None until the prompt (forward_step with an empty cache)
    audio: MoTKVCache  # per MusicGen layer [B, H, A, hd]; its seq_len is the audio positions so far
    seq_len: int = 0  # positions seen so far (text + audio, pads included)
    decode: DecodeConstants | None = None  # decode_step's, made at the prompt

    @classmethod
    def allocate(cls, max_len: int) -> MusicgenRowsCache:
        """An empty cache with room for `max_len` audio positions per row (`generate_codes`' `new_cache`)."""
        return cls(caption=None, audio=MoTKVCache.allocate(max_len))


@dataclass
class DecodeConstants:
    """What `decode_step` reads instead of calling modules (a module call costs as much as a small matmul on a CPU):
    taken from the weights once at the prompt, valid while they do not change (generation)."""

    table: torch.Tensor  # [K * (C + 1), d_audio] MusicGen's K embedding tables stacked (C codes + its BOS/pad row)
    lo: torch.Tensor  # [K] first combined-vocab id of codebook k's codes
    shift: torch.Tensor  # [K] combined id -> table row for codebook k's codes (id - shift)
    pad_rows: torch.Tensor  # [K] table row of codebook k's pad id (AUDIO_PAD / AUDIO_END read as pad)
    heads: torch.Tensor  # [K * (C + 1), d_audio] head k's C code rows then its AUDIO_END row
    qkv: list[tuple[torch.Tensor, torch.Tensor | None]]  # per MusicGen layer its self-attention's q/k/v stacked [3d, d]
    gates: list[float]  # g_m per MusicGen layer


def decode_constants(
    decoder: nn.Module,
    lm_heads: nn.ModuleList,
    end_head: torch.Tensor,
    vocab: AudioVocab,
    pad_id: int,
    gates: list[float],
) -> DecodeConstants:
    """decode_step's stacked tables, heads and q/k/v, from MusicGen's decoder and heads and the AUDIO_END head [K, d]
    as they are now; gates: g_m per layer, already read."""
    V, C, K = vocab.text_vocab_size, vocab.codebook_size, vocab.n_codebooks
    tables = [e.weight for e in decoder.embed_tokens]  # K x [C + 1, d_audio]
    n = tables[0].shape[0]
    k = torch.arange(K, device=tables[0].device)
    with torch.no_grad():
        code_rows = [  # K x [C + 1, d_audio]
            torch.cat([head.weight, end_head[i, None].to(head.weight.dtype)]) for i, head in enumerate(lm_heads)
        ]
        return DecodeConstants(
            table=torch.cat(tables),
            lo=V + k * C,
            shift=V + k * C - k * n,  # code c of codebook k, id V + kC + c -> row k n + c
            pad_rows=k * n + pad_id,
            heads=torch.cat(code_rows),
            qkv=[
                stacked(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)
                for layer in decoder.layers
            ],
            gates=gates,
        )


def stacked(*projections: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Linear layers of one input stacked into one weight [sum of outs, d_in] (and bias, None if they have none)."""
    weight = torch.cat([p.weight for p in projections])
    bias = torch.cat([p.bias for p in projections]) if projections[0].bias is not None else None
    return weight, bias


def decode_layer(
    layer: nn.Module,
    h: torch.Tensor,
    qkv: tuple[torch.Tensor, torch.Tensor | None],
    past: LayerKV,
    caption_kv: tuple[torch.Tensor, torch.Tensor],
    keys: CaptionKeys,
    gate: float,
) -> torch.Tensor:
    """`musicgen_rows._decoder_layer` for one new position per row (h [B, 1, d_audio]), as functional calls on the same weights
    (no module calls); the self-attention reads every cached position (audio rows have no pads)."""
    a, c = layer.self_attn, layer.encoder_attn
    B, _, d = h.shape
    H, hd = a.num_heads, a.head_dim

    def norm(ln: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (d,), ln.weight, ln.bias, ln.eps)

    q, k, v = F.linear(norm(layer.self_attn_layer_norm, h), *qkv).view(B, 3, H, 1, hd).unbind(1)  # [B, H, 1, hd]
    k, v = past.update(k, v)  # [B, H, A, hd]
    attn = F.scaled_dot_product_attention(q, k, v)  # [B, H, 1, hd]
    h = h + F.linear(attn.reshape(B, 1, d), a.out_proj.weight, a.out_proj.bias)
    q = F.linear(norm(layer.encoder_attn_layer_norm, h), c.q_proj.weight, c.q_proj.bias).view(B, H, 1, hd)
    out = F.scaled_dot_product_attention(q, *caption_kv, attn_mask=keys.mask)  # [B, H, 1, hd]
    out = F.linear(out.reshape(B, 1, d), c.out_proj.weight)
    if c.out_proj.bias is not None:
        out = (out + c.out_proj.bias).masked_fill(~keys.present, 0.0)
    h = torch.add(h, out, alpha=gate)
    x = F.linear(norm(layer.final_layer_norm, h), layer.fc1.weight, layer.fc1.bias)
    return h + F.linear(layer.activation_fn(x), layer.fc2.weight, layer.fc2.bias)
