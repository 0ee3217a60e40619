"""One MoT layer: a frozen Llama decoder layer whose audio positions get a MusicGen FFN block as their expert.

Rows are routed by modality over the flattened [B*S] positions, so each MLP runs only on its own rows; audio rows
use, by `audio_attention`, the Llama's projections (shared), a LoRA delta on q and v (lora) or their own copies
(separate). The expert's up projection starts at zero.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from adapter_trainer.model.attention import attend
from adapter_trainer.model.kv_cache import LayerKV
from adapter_trainer.model.lora import LoRADelta


class AudioExpert(nn.Module):
    """Audio FFN of one MoT layer: RMSNorm(d_llm) -> down -> MusicGen FFN block -> up (zero init). The MusicGen
    block is referenced, not copied: MoT layers may share one when the LLM is deeper than the audio LM."""

    def __init__(
        self, d_llm: int, d_audio: int, eps: float, musicgen_layer: nn.Module, norm_init: torch.Tensor
    ) -> None:
        super().__init__()
        w = norm_init
        self.norm = LlamaRMSNorm(d_llm, eps=eps).to(device=w.device, dtype=w.dtype)
        with torch.no_grad():
            self.norm.weight.copy_(norm_init)  # start from the LLM's own post-attention norm scale
        self.down = nn.Linear(d_llm, d_audio, bias=False, device=w.device, dtype=w.dtype)
        self.ffn_norm = musicgen_layer.final_layer_norm  # LayerNorm(d_audio), MusicGen's
        self.fc1 = musicgen_layer.fc1  # d_audio -> ffn_dim
        self.act = musicgen_layer.activation_fn
        self.fc2 = musicgen_layer.fc2  # ffn_dim -> d_audio
        self.up = nn.Linear(d_audio, d_llm, bias=False, device=w.device, dtype=w.dtype)
        nn.init.zeros_(self.up.weight)  # the expert contributes exactly 0 at init

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h [N, d_llm] (audio rows, post-attention residual stream) -> update [N, d_llm]."""
        a = self.down(self.norm(h))  # [N, d_audio]
        a = self.fc2(self.act(self.fc1(self.ffn_norm(a))))  # [N, d_audio]
        return self.up(a)  # [N, d_llm]


class MoTLayer(nn.Module):
    """A frozen LlamaDecoderLayer with a second (audio) FFN path and modality-routed attention projections."""

    def __init__(
        self, llm_layer: nn.Module, expert: AudioExpert, audio_attention: str, lora_rank: int, lora_alpha: float
    ) -> None:
        super().__init__()
        self.llm_layer = llm_layer
        self.audio = expert
        self.audio_attention = audio_attention
        attn = llm_layer.self_attn
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        w = attn.q_proj.weight
        if audio_attention == "lora":
            self.audio_lora = nn.ModuleDict(
                {
                    name: LoRADelta(
                        getattr(attn, name).in_features, getattr(attn, name).out_features, lora_rank, lora_alpha, w
                    )
                    for name in ("q_proj", "v_proj")
                }
            )
        elif audio_attention == "separate":
            # Copies of the Llama layer's norm and projections: the audio rows start exactly as under "shared".
            self.audio_attn = nn.ModuleDict(
                {
                    "input_layernorm": copy.deepcopy(llm_layer.input_layernorm),
                    **{name: copy.deepcopy(getattr(attn, name)) for name in ("q_proj", "k_proj", "v_proj", "o_proj")},
                }
            ).requires_grad_(True)

    def _qkv(self, flat: torch.Tensor, idx_text: torch.Tensor, idx_audio: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """flat [B*S, D] residual stream -> q [B*S, H*hd], k, v [B*S, KV*hd], each row from its modality's weights."""
        layer, attn = self.llm_layer, self.llm_layer.self_attn
        if self.audio_attention != "separate":
            x = layer.input_layernorm(flat)  # [B*S, D]
            q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)  # [B*S, H*hd], [B*S, KV*hd] x2
            if self.audio_attention == "lora" and idx_audio.numel():
                xa = x.index_select(0, idx_audio)  # [N_audio, D]
                q = q.index_add(0, idx_audio, self.audio_lora["q_proj"](xa).to(q.dtype))  # audio rows only
                v = v.index_add(0, idx_audio, self.audio_lora["v_proj"](xa).to(v.dtype))
            return q, k, v
        a = self.audio_attn
        xt = layer.input_layernorm(flat.index_select(0, idx_text))  # [N_text, D]
        xa = a["input_layernorm"](flat.index_select(0, idx_audio))  # [N_audio, D]
        return tuple(
            self._route(getattr(attn, name)(xt), a[name](xa), flat.shape[0], idx_text, idx_audio)
            for name in ("q_proj", "k_proj", "v_proj")
        )

    @staticmethod
    def _route(
        yt: torch.Tensor, ya: torch.Tensor, n: int, idx_text: torch.Tensor, idx_audio: torch.Tensor
    ) -> torch.Tensor:
        """Text rows yt [N_text, F] and audio rows ya [N_audio, F] -> [n, F] in position order."""
        out = yt.new_zeros(n, yt.shape[1])  # [B*S, F]
        return out.index_copy(0, idx_text, yt).index_copy(0, idx_audio, ya.to(yt.dtype))  # [B*S, F]

    def forward(
        self,
        h: torch.Tensor,  # [B, S, D]
        position_embeddings: tuple[torch.Tensor, torch.Tensor],  # cos, sin [B, S, head_dim]
        idx_text: torch.Tensor,  # [N_text] rows of the flattened [B*S]
        idx_audio: torch.Tensor,  # [N_audio]
        allowed: torch.Tensor | None,  # [B, 1, S, S_past + S] bool, or None = causal order suffices (sdpa_mask)
        past: LayerKV | None = None,  # this layer's MoTKVCache handle (keys, values [B, KV, S_past, hd])
        keep_kv: bool = True,  # False: return no keys/values (training: nothing caches them)
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """-> (h [B, S, D], (keys, values) [B, KV, S_past + S, hd] for the cache, or None when not keep_kv)."""
        layer, attn = self.llm_layer, self.llm_layer.self_attn
        B, S, D = h.shape
        hd = self.head_dim
        flat = h.reshape(B * S, D)  # [B, S, D] -> [B*S, D]
        q, k, v = self._qkv(flat, idx_text, idx_audio)  # [B*S, H*hd], [B*S, KV*hd], [B*S, KV*hd]
        q = q.view(B, S, -1, hd).transpose(1, 2)  # [B*S, H*hd] -> [B, H, S, hd]
        k = k.view(B, S, -1, hd).transpose(1, 2)  # [B*S, KV*hd] -> [B, KV, S, hd]
        v = v.view(B, S, -1, hd).transpose(1, 2)  # [B, KV, S, hd]
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)  # [B, H, S, hd], [B, KV, S, hd]
        # fp32 cos/sin promote q and k under bf16 autocast: back to v's dtype, so the cache stores K as V.
        q, k = q.to(v.dtype), k.to(v.dtype)
        if past is not None:
            k, v = past.update(k, v)  # [B, KV, S_past + S, hd], written in place into the cache
        o = attend(q, k, v, allowed, self.scaling, attn.attention_dropout if self.training else 0.0)  # [B, H, S, hd]
        o = o.transpose(1, 2).reshape(B * S, -1)  # [B, H, S, hd] -> [B*S, H*hd]
        if self.audio_attention == "separate":
            o = self._route(
                attn.o_proj(o.index_select(0, idx_text)),
                self.audio_attn["o_proj"](o.index_select(0, idx_audio)),
                B * S,
                idx_text,
                idx_audio,
            )  # [B*S, D]
        else:
            o = attn.o_proj(o)  # [B*S, D]
        flat = flat + o.to(flat.dtype)  # [B*S, D]
        delta = torch.zeros_like(flat)  # [B*S, D]
        if idx_text.numel():
            t = flat.index_select(0, idx_text)  # [N_text, D]
            delta = delta.index_copy(0, idx_text, layer.mlp(layer.post_attention_layernorm(t)).to(flat.dtype))
        if idx_audio.numel():
            a = flat.index_select(0, idx_audio)  # [N_audio, D]
            delta = delta.index_copy(0, idx_audio, self.audio(a).to(flat.dtype))
        return (flat + delta).reshape(B, S, D), ((k, v) if keep_kv else None)  # [B*S, D] -> [B, S, D]
