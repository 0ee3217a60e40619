"""Mixture-of-Transformers adapter: a frozen Llama whose audio positions get MusicGen's FFNs as experts.

Per Llama layer l (names/shapes here are the contract with recipe.py):

    x ─ input_layernorm ─ q/k/v ─ RoPE ─ ONE attention over all positions ─ o ─────────────────────────────── + ─┐
    ┌───────────────────────────────────────────────────────────────────────────────────────────────────────┘
    ├ text positions : post_attention_layernorm ─ Llama MLP (frozen) ─────────────────────────────────────── +
    └ audio positions: RMSNorm(d_llm) ─ down d_llm→d_audio ─ MusicGen layer m(l) FFN block
                       (final_layer_norm, fc1, act, fc2; frozen by default) ─ up d_audio→d_llm (ZERO init) ───── +

Attention (`MoTConfig.audio_attention`; text rows always use the frozen Llama's norm and q/k/v/o):
    shared   : audio rows use the Llama's norm and projections too (frozen).
    lora     : audio rows add a LoRA delta to q and v (trainable); text rows get none.
    separate : audio rows use their own input norm and q/k/v/o, copies of the Llama layer's, trainable.
Every position's key/value comes from its own modality's projections; one scaled_dot_product_attention runs over
all positions (causal AND key padding), so the attention implementation the Llama was loaded with (eager/sdpa/...)
does not matter and left or right padding both work. Positions (RoPE) are cumsum(attention_mask) - 1, as in HF
generation. The call is shaped for the fused GPU kernels (`sdpa_mask`, `attend`, rules in `sdpa_kernels`): no mask
at all (is_causal) when causal order alone is exact, which flash attention needs; otherwise an explicit mask, with
grouped k/v where cuDNN runs (sm90, bf16) and k/v expanded to the query heads elsewhere, which the memory-efficient
kernel takes (it rejects enable_gqa); the math kernel is only the fallback.

Routing is index_select / index_copy over the flattened [B*S] positions: each MLP runs only on its own rows.
At init the up adapters are zero (and LoRA / separate projections start equal to the Llama's), so the model
equals the frozen LLM at every text position; text positions never depend on audio-side parameters.

Generation: `forward_step` runs new positions against a `MoTKVCache` (per-layer keys/values of past positions).

Inputs: tokens [B, S, J] combined-vocab ids (token_layout), is_audio [B, S]. Audio positions embed through one
table over the audio range (K*C codes + START/END/PAD), summing the J slot embeddings (delay: J = K).
Heads (audio positions only): delay -> K heads over C + 1 (codes of codebook k, then AUDIO_END);
flatten -> one head over K*C + 1 (code (k, c) at k*C + c, then AUDIO_END).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import LlamaForCausalLM, MusicgenForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from adapter_trainer.config import AUDIO_ATTENTION  # the choices of model.mot.audio_attention, defined once
from adapter_trainer.data.token_layout import IGNORE_INDEX, AudioVocab, n_slots, target_frames
from adapter_trainer.model import sdpa_kernels
from adapter_trainer.model.lora import LoRADelta


@dataclass
class MoTConfig:
    layer_map: list[int] | None = None  # llm layer l -> musicgen layer m(l); None = evenly spaced
    freeze_audio_ffn: bool = True
    audio_attention: Literal["shared", "lora", "separate"] = "shared"  # attention projections of audio positions
    lora_rank: int = 0  # LoRA rank on q/v of audio rows; > 0 exactly when audio_attention="lora"
    lora_alpha: float = 16.0
    audio_embed_init: Literal["musicgen", "random"] = "musicgen"
    audio_head_init: Literal["musicgen", "random"] = "musicgen"
    random_init_scale: float = 0.1  # x text-embedding std, for "random" init
    caption_cond_rank: int = 0  # > 0: CaptionCond per layer (the caption summary into audio rows); 0 = off


@dataclass
class LossOutput:
    loss: torch.Tensor  # [] mean CE over all target tokens (codes + AUDIO_END), differentiable
    ce_sum_per_codebook: torch.Tensor  # [K] float, summed CE over code targets of codebook k (detached)
    count_per_codebook: torch.Tensor  # [K] long
    ce_sum_per_example: torch.Tensor  # [B] float, summed CE over code targets (detached)
    count_per_example: torch.Tensor  # [B] long
    end_ce_sum: torch.Tensor  # [] AUDIO_END targets
    end_count: torch.Tensor  # []
    # [B, S, J] float, CE of the code target in each label cell, 0 where none (detached); with
    # token_layout.target_frames it gives the CE per audio frame (the learning check's caption gain by position)
    ce_per_target: torch.Tensor | None = None


def default_layer_map(n_llm_layers: int, n_audio_layers: int) -> list[int]:
    """Evenly spaced: m(l) = round(l * (M - 1) / (L - 1)); 16 -> 24 gives 0, 2, 3, 5, ..., 23."""
    if n_llm_layers == 1:
        return [0]
    return [round(l * (n_audio_layers - 1) / (n_llm_layers - 1)) for l in range(n_llm_layers)]


class AudioExpert(nn.Module):
    """Audio FFN of one MoT layer: RMSNorm(d_llm) -> down -> MusicGen FFN block -> up (zero init).

    The MusicGen block (final_layer_norm, fc1, activation, fc2) is referenced, not copied: several
    MoT layers may share one MusicGen layer when the LLM is deeper than the audio LM.
    """

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


class CaptionCond(nn.Module):
    """The caption summary of one MoT layer into its audio rows: a rank-r map, up initialised to zero (so training
    starts exactly from the model without it), like a conditioning vector added to MusicGen's input.

    The summary is the mean over a row's text positions (BOS + caption) of the layer's input after the Llama layer's
    own input norm: text rows are the frozen LLM's, so it is a fixed function of the caption, available to every
    audio position at full strength from the first frame, whatever attention makes of the caption keys.
    """

    def __init__(self, d_llm: int, rank: int, ref: torch.Tensor) -> None:
        super().__init__()
        self.down = nn.Linear(d_llm, rank, bias=False, device=ref.device, dtype=ref.dtype)
        self.up = nn.Linear(rank, d_llm, bias=False, device=ref.device, dtype=ref.dtype)
        nn.init.zeros_(self.up.weight)

    def forward(self, summary: torch.Tensor) -> torch.Tensor:
        """summary [B, D] -> update [B, D] for the row's audio positions."""
        return self.up(self.down(summary))  # [B, D]


class MoTKVCache:
    """Keys and values of every MoT layer for the positions seen so far (what `forward_step` returns and takes).

    Preallocated and written in place, like transformers' `StaticCache`: `MoTKVCache.allocate(max_len)` reserves
    room for max_len positions; layer l's buffers [B, n_kv_heads, capacity, head_dim] are made on its first
    `update` (dtype and device of its keys), and each `update` writes the new positions at `seq_len` and returns
    the filled views, so a decoding step copies only its own keys (growing by torch.cat copied the whole past
    every step). `forward_step(cache=None)` returns a cache that is exactly full; if a cache runs out of room its
    buffers double (an amortised copy, never per step).

    keys[l], values[l]: [B, n_kv_heads, S_total, head_dim], layer l's keys after RoPE and values, before the GQA
    repeat. S_total is the length of the attention_mask passed to the last `forward_step` (pads included: they
    stay masked). Each position's key/value comes from its own modality's projections.
    """

    def __init__(self, keys: list[torch.Tensor] | None = None, values: list[torch.Tensor] | None = None) -> None:
        """A full cache of the given per-layer keys/values [B, KV, S_total, hd] (or an empty one)."""
        self._k, self._v = list(keys or []), list(values or [])  # per layer [B, KV, capacity, hd]
        self._len = int(self._k[0].shape[2]) if self._k else 0
        self.capacity = self._len
        # layer -> (sum [B, D], count [B, 1]) of the normed text rows seen so far (caption_cond_rank > 0)
        self.summaries: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.has_pads = False  # a pad among the cached positions (set by forward_step; decode_step needs a mask)

    @classmethod
    def allocate(cls, max_len: int) -> MoTKVCache:
        """An empty cache with room for `max_len` positions (buffers are made by each layer's first update)."""
        cache = cls()
        cache.capacity = int(max_len)
        return cache

    @property
    def seq_len(self) -> int:
        return self._len

    @property
    def keys(self) -> list[torch.Tensor]:
        return [k[:, :, : self._len] for k in self._k]  # per layer [B, KV, S_total, hd]

    @property
    def values(self) -> list[torch.Tensor]:
        return [v[:, :, : self._len] for v in self._v]

    def layer(self, index: int) -> _LayerKV:
        """Layer `index`'s handle, what MoTLayer.forward takes as `past`."""
        return _LayerKV(self, index)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write layer's new keys/values k, v [B, KV, S_new, hd] at seq_len -> filled views [B, KV, S_total + S_new, hd].

        seq_len itself moves on in `advance`, once every layer has written the same new positions.
        """
        end = self._len + k.shape[2]
        if layer == len(self._k):  # this layer's first write: make its buffers
            shape = (k.shape[0], k.shape[1], max(self.capacity, end), k.shape[3])
            self._k.append(k.new_empty(shape))  # [B, KV, capacity, hd]
            self._v.append(v.new_empty(shape))
        if end > self._k[layer].shape[2]:  # out of room: double (keeps appends amortised O(1))
            grow = max(end, 2 * self._k[layer].shape[2]) - self._k[layer].shape[2]
            pad = (0, 0, 0, grow)  # pads dim 2 (positions) at the end
            self._k[layer] = F.pad(self._k[layer], pad)
            self._v[layer] = F.pad(self._v[layer], pad)
        self._k[layer][:, :, self._len : end] = k
        self._v[layer][:, :, self._len : end] = v
        self.capacity = max(self.capacity, self._k[layer].shape[2])
        return self._k[layer][:, :, :end], self._v[layer][:, :, :end]  # [B, KV, S_total + S_new, hd]

    def advance(self, n_new: int) -> MoTKVCache:
        """Count the n_new positions every layer has just written (returns self)."""
        self._len += int(n_new)
        return self

    def select(self, batch_idx: torch.Tensor) -> MoTKVCache:
        """Rows batch_idx [B'] of the batch (reorder, repeat for sampling several continuations, drop finished)."""
        out = MoTKVCache()
        out._k = [k.index_select(0, batch_idx) for k in self._k]  # [B', n_kv, capacity, hd]
        out._v = [v.index_select(0, batch_idx) for v in self._v]
        out._len, out.capacity, out.has_pads = self._len, self.capacity, self.has_pads
        out.summaries = {
            l: (s.index_select(0, batch_idx), n.index_select(0, batch_idx)) for l, (s, n) in self.summaries.items()
        }  # [B', D], [B', 1]
        return out


@dataclass
class _LayerKV:
    """One layer's view of a MoTKVCache: `update(k, v)` writes there and returns the filled keys/values."""

    cache: MoTKVCache
    index: int

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.update(self.index, k, v)


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


class MoTLayer(nn.Module):
    """One Llama decoder layer with a second (audio) FFN path and modality-routed attention projections.

    Args:
        llm_layer: LlamaDecoderLayer (frozen); its input_layernorm, q/k/v/o, post_attention_layernorm and MLP serve
            text rows (and audio rows under audio_attention="shared"/"lora").
        expert: the audio FFN path.
        audio_attention: "shared" | "lora" | "separate" (module docstring).
    """

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
        past: _LayerKV | None = None,  # this layer's MoTKVCache handle (keys, values [B, KV, S_past, hd])
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
        # cos/sin are in the towers' dtype (fp32 under bf16 autocast) and promote q and k: back to v's (the compute
        # dtype), so the cache stores K as V and sdpa gets one dtype (autocast made this same cast in every call,
        # re-casting the whole cached K every layer every step). A no-op without autocast.
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


class MoTAdapterModel(nn.Module):
    """forward(tokens [B,S,J], is_audio [B,S]) -> logits; compute_loss(batch) -> LossOutput.

    Args:
        llm: LlamaForCausalLM (frozen, left untouched; any attn_implementation: the MoT layers run their own attention).
        audio_lm: MusicgenForCausalLM decoder; its FFN blocks, lm_heads and final layer_norm are referenced.
        vocab: the combined vocabulary (token_layout.AudioVocab).
        pattern: "delay" or "flatten".
        cfg: MoTConfig.

    Raises:
        ValueError: sizes of vocab / layer_map / init names that do not match the models (message says which).
    """

    def __init__(
        self, llm: LlamaForCausalLM, audio_lm: MusicgenForCausalLM, vocab: AudioVocab, pattern: str, cfg: MoTConfig
    ):
        super().__init__()
        lcfg, acfg = llm.config, audio_lm.config
        K, C = vocab.n_codebooks, vocab.codebook_size
        if (acfg.num_codebooks, acfg.vocab_size) != (K, C):
            raise ValueError(
                f"audio LM has {acfg.num_codebooks} codebooks x {acfg.vocab_size} codes but the vocab/shards have "
                f"{K} x {C}; use shards encoded with the audio LM's codec (n_codebooks/codebook_size must match)"
            )
        if vocab.text_vocab_size > lcfg.vocab_size:
            raise ValueError(
                f"vocab.text_vocab_size={vocab.text_vocab_size} exceeds the LLM's vocab_size={lcfg.vocab_size}; "
                f"build AudioVocab with the LLM's tokenizer size"
            )
        self.n_slots = n_slots(pattern, K)  # validates the pattern name
        for name in ("audio_embed_init", "audio_head_init"):
            if getattr(cfg, name) not in ("musicgen", "random"):
                raise ValueError(f"MoTConfig.{name}={getattr(cfg, name)!r}; allowed: ['musicgen', 'random']")
        if cfg.audio_attention not in AUDIO_ATTENTION:
            raise ValueError(f"MoTConfig.audio_attention={cfg.audio_attention!r}; allowed: {list(AUDIO_ATTENTION)}")
        if (cfg.lora_rank > 0) != (cfg.audio_attention == "lora"):
            raise ValueError(
                f"model.mot.lora_rank={cfg.lora_rank} with audio_attention={cfg.audio_attention!r}: LoRA is the "
                f"'lora' variant; set model.mot.audio_attention=lora model.mot.lora_rank=16 (or lora_rank=0)"
            )
        self.vocab, self.pattern, self.cfg = vocab, pattern, cfg
        # trainer.activation_checkpointing: recompute each MoT layer in backward (training with grad enabled only)
        self.activation_checkpointing = False
        # trainer.early_frames / early_frame_loss_weight: the loss weight of each window's first frames (training)
        self.early_frame_weight: tuple[int, float] = (0, 1.0)
        L, M = lcfg.num_hidden_layers, acfg.num_hidden_layers
        layer_map = list(cfg.layer_map) if cfg.layer_map is not None else default_layer_map(L, M)
        if len(layer_map) != L or not all(0 <= m < M for m in layer_map):
            raise ValueError(
                f"layer_map={layer_map} must have one entry per LLM layer ({L}) with values in [0, {M}); "
                f"leave it null for an evenly spaced map"
            )
        self.layer_map = layer_map
        d_llm, d_audio = lcfg.hidden_size, acfg.hidden_size
        self.d_llm, self.d_audio = d_llm, d_audio
        ref = llm.model.embed_tokens.weight
        dev, dt = ref.device, ref.dtype

        # Freeze everything that comes from the pretrained models; new modules below are trainable.
        llm.requires_grad_(False)
        audio_lm.requires_grad_(False)
        audio_lm.to(device=dev, dtype=dt)
        self.llm = llm
        mg_layers = audio_lm.model.decoder.layers
        self.layers = nn.ModuleList(
            MoTLayer(
                llm.model.layers[l],
                AudioExpert(
                    d_llm,
                    d_audio,
                    lcfg.rms_norm_eps,
                    mg_layers[layer_map[l]],
                    llm.model.layers[l].post_attention_layernorm.weight.detach(),
                ),
                cfg.audio_attention,
                cfg.lora_rank,
                cfg.lora_alpha,
            )
            for l in range(L)
        )
        for layer in self.layers:
            for mod in (layer.audio.ffn_norm, layer.audio.fc1, layer.audio.fc2):
                mod.requires_grad_(not cfg.freeze_audio_ffn)

        text_std = float(ref.detach().float().std())
        n_codes = vocab.n_codes
        # ---- audio embeddings: one table over the audio range [V, V + K*C + 3)
        if cfg.audio_embed_init == "musicgen":
            codes = torch.cat(
                [e.weight.detach()[:C] for e in audio_lm.model.decoder.embed_tokens], dim=0
            )  # [K*C, d_audio]
            self.code_embed = nn.Parameter(codes.clone())  # [K*C, d_audio] trainable, initialised from MusicGen's rows
            self.embed_adapter = nn.Linear(d_audio, d_llm, bias=False, device=dev, dtype=dt)  # trainable
            with torch.no_grad():  # scale so mapped code embeddings have the text embeddings' std
                sample = self.embed_adapter(codes[:: max(1, n_codes // 1024)])  # [<=1024, d_llm]
                self.embed_adapter.weight.mul_(text_std / max(float(sample.float().std()), 1e-8))
            self.special_embed = nn.Parameter(
                torch.randn(3, d_llm, device=dev, dtype=dt) * cfg.random_init_scale * text_std
            )  # [3, d_llm] START, END, PAD
        else:
            self.audio_embed = nn.Embedding(vocab.n_audio_ids, d_llm, device=dev, dtype=dt)
            nn.init.normal_(self.audio_embed.weight, std=cfg.random_init_scale * text_std)

        # ---- heads (audio positions): delay K x (C + 1), flatten 1 x (K*C + 1)
        self.n_heads = K if pattern == "delay" else 1
        self.head_size = C + 1 if pattern == "delay" else n_codes + 1
        if cfg.audio_head_init == "musicgen":
            self.out_adapter = nn.Linear(d_llm, d_audio, bias=False, device=dev, dtype=dt)  # trainable
            # MusicGen's lm_heads read hidden states after its final LayerNorm, so the adapter output goes through a
            # copy of it before copies of the lm_heads. Both are trainable (audio norm / audio heads); the audio LM's
            # own modules stay frozen and untouched.
            self.audio_out_norm = copy.deepcopy(audio_lm.model.decoder.layer_norm).requires_grad_(True)
            self.lm_heads = copy.deepcopy(audio_lm.lm_heads).requires_grad_(True)  # K x Linear(d_audio, C)
            self.end_head = nn.Parameter(
                torch.randn(self.n_heads, d_audio, device=dev, dtype=dt) * 0.02
            )  # [H, d_audio]
        else:
            self.head = nn.Linear(d_llm, self.n_heads * self.head_size, bias=False, device=dev, dtype=dt)
            nn.init.normal_(self.head.weight, std=0.02)  # small: near-uniform logits at init
        if cfg.caption_cond_rank < 0:
            raise ValueError(f"MoTConfig.caption_cond_rank={cfg.caption_cond_rank} must be >= 0 (0 = off)")
        # ---- caption summary into the audio rows of every layer (CaptionCond), trainable
        self.caption_cond = (
            nn.ModuleList(CaptionCond(d_llm, cfg.caption_cond_rank, ref) for _ in range(L))
            if cfg.caption_cond_rank > 0
            else None
        )

    # ------------------------------------------------------------------------------------------- embeddings
    def embed(self, tokens: torch.Tensor, is_audio: torch.Tensor) -> torch.Tensor:
        """tokens [B, S, J], is_audio [B, S] -> input embeddings [B, S, D]."""
        B, S, J = tokens.shape
        if self.n_slots != J:
            raise ValueError(f"tokens have J={J} slots but pattern={self.pattern!r} needs {self.n_slots}")
        V = self.vocab.text_vocab_size
        text_ids = torch.where(is_audio, torch.zeros_like(tokens[..., 0]), tokens[..., 0])  # [B, S]
        h = self.llm.model.embed_tokens(text_ids)  # [B, S, D]
        flat = h.reshape(B * S, self.d_llm)  # [B*S, D]
        idx_audio = is_audio.reshape(-1).nonzero().squeeze(1)  # [N_audio]
        if idx_audio.numel() == 0:
            return h
        local = tokens.reshape(B * S, J).index_select(0, idx_audio) - V  # [N_audio, J] in [0, K*C + 3)
        emb = self._embed_audio(local)  # [N_audio, D]
        return flat.index_copy(0, idx_audio, emb.to(flat.dtype)).reshape(B, S, self.d_llm)  # [B, S, D]

    def _embed_audio(self, local: torch.Tensor) -> torch.Tensor:
        """local [N, J] audio ids minus text_vocab_size, in [0, K*C + 3) -> embeddings [N, D] (slots summed)."""
        if self.cfg.audio_embed_init == "musicgen":
            n_codes = self.vocab.n_codes
            is_code = local < n_codes  # [N, J]
            code_vec = self.code_embed[local.clamp(max=n_codes - 1)] * is_code[..., None]  # [N, J, d_audio]
            spec_vec = self.special_embed[(local - n_codes).clamp(min=0)] * (~is_code)[..., None]  # [N, J, D]
            # The adapter is linear (no bias): summing the slots before or after it is the same.
            return self.embed_adapter(code_vec.sum(1)) + spec_vec.sum(1)  # [N, D]
        return self.audio_embed(local).sum(1)  # [N, J, D] -> [N, D]

    def _check_ids(self, tokens: torch.Tensor, is_audio: torch.Tensor) -> None:
        V, n = self.vocab.text_vocab_size, self.vocab.n_audio_ids
        first = tokens[..., 0]  # [B, S]
        bad_text = (~is_audio) & ((first < 0) | (first >= V))
        bad_audio = is_audio[..., None] & ((tokens < V) | (tokens >= V + n))
        if bool(bad_text.any()) or bool(bad_audio.any()):
            raise ValueError(
                f"token ids do not match is_audio: text ids must be in [0, {V}), audio ids in [{V}, {V + n}); "
                f"build batches with token_layout.encode_example/collate and a pad_id < {V}"
            )

    # -------------------------------------------------------------------------------------------- trunk
    def _trunk(
        self,
        tokens: torch.Tensor,
        is_audio: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: MoTKVCache | None,
        keep_kv: bool = True,
    ) -> tuple[torch.Tensor, MoTKVCache | None]:
        """tokens [B, S, J], is_audio [B, S], attention_mask [B, S_past + S] -> (final-normed h [B, S, D], cache).

        keep_kv=False (training, scoring: cache is None) keeps no layer's keys/values and returns no cache: under
        activation checkpointing they would otherwise all stay alive until the last layer (backward recomputes them).
        """
        self._check_ids(tokens, is_audio)
        B, S, _ = tokens.shape
        S_past = cache.seq_len if cache is not None else 0
        if attention_mask.shape != (B, S_past + S):
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)} but needs [B, S_past + S_new] = "
                f"[{B}, {S_past} + {S}]: pass the mask of every position so far (cache + new tokens)"
            )
        attention_mask = attention_mask.bool()
        h = self.embed(tokens, is_audio)  # [B, S, D]
        # HF-style positions: pads take no position, so left- and right-padded rows get the same real positions.
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, S_past:]  # [B, S]
        position_embeddings = self.llm.model.rotary_emb(h, position_ids=position_ids)  # cos, sin [B, S, head_dim]
        allowed = sdpa_mask(attention_mask, S)  # [B, 1, S, S_past + S], or None: causal order alone is exact
        flat_audio = is_audio.reshape(-1)  # [B*S]
        idx_audio = flat_audio.nonzero().squeeze(1)  # [N_audio]
        idx_text = (~flat_audio).nonzero().squeeze(1)  # [N_text]
        keys, values = [], []
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        text_rows = (~is_audio) & attention_mask[:, S_past:]  # [B, S] real text positions of this call
        summaries = cache.summaries if cache is not None else {}  # layer -> (sum, count) of text rows (CaptionCond)
        for l, layer in enumerate(self.layers):
            past = cache.layer(l) if cache is not None else None
            if self.caption_cond is not None:
                h = self._add_caption_summary(l, h, text_rows, is_audio, summaries)  # [B, S, D]
            if recompute:
                # Keeps only the layer's inputs; backward reruns it. Non-reentrant: restores the RNG state (dropout
                # draws the same masks) and lets gradients reach parameters that no input requires grad for.
                h, kv = checkpoint(
                    layer, h, position_embeddings, idx_text, idx_audio, allowed, past, keep_kv, use_reentrant=False
                )  # [B, S, D]
            else:
                h, kv = layer(h, position_embeddings, idx_text, idx_audio, allowed, past, keep_kv)  # [B, S, D]
            if kv is not None and cache is None:
                keys.append(kv[0])
                values.append(kv[1])
        if cache is not None:
            cache.advance(S)
        elif keep_kv:
            cache = MoTKVCache(keys, values)
            cache.summaries = summaries
        if cache is not None:  # the mask covers every position so far; decode_step's steps add real ones only
            cache.has_pads = not bool(attention_mask.all())
        return self.llm.model.norm(h), cache  # [B, S, D]

    def _add_caption_summary(
        self,
        l: int,
        h: torch.Tensor,  # [B, S, D] layer l's input
        text_rows: torch.Tensor,  # [B, S] bool, real text positions of this call
        is_audio: torch.Tensor,  # [B, S] bool
        summaries: dict[int, tuple[torch.Tensor, torch.Tensor]],  # the cache's (sum, count) per layer, updated here
    ) -> torch.Tensor:
        """h + CaptionCond_l(summary) on audio rows; summary = the mean of the row's normed text rows seen so far: in
        this call (training, scoring, a prompt) and in earlier calls (the cache), so a prompt fed in pieces or a
        decoding step with no text gets what one full call gets (a row's text always precedes its audio)."""
        if bool(text_rows.any()):
            x = self.layers[l].llm_layer.input_layernorm(h)  # [B, S, D] what the frozen attention sees
            m = text_rows.to(x.dtype)[..., None]  # [B, S, 1]
            total, count = (x * m).sum(1).detach(), m.sum(1)  # [B, D], [B, 1]
            if l in summaries:
                total, count = total + summaries[l][0], count + summaries[l][1]
            summaries[l] = (total, count)
        elif l in summaries:
            total, count = summaries[l]  # [B, D], [B, 1]
        else:
            return h  # audio only and nothing cached: no caption to summarise
        summary = total / count.clamp(min=1)  # [B, D] mean over the row's text positions
        delta = self.caption_cond[l](summary)  # [B, D]
        return h + delta[:, None, :].to(h.dtype) * is_audio[..., None].to(h.dtype)  # [B, S, D]

    def hidden_states(
        self, tokens: torch.Tensor, is_audio: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """tokens [B, S, J], is_audio [B, S], attention_mask [B, S] (True = real; None = all real) -> h [B, S, D].

        h is final-normed. Left or right padding: real positions get the same values either way.
        """
        if attention_mask is None:
            attention_mask = torch.ones(is_audio.shape, dtype=torch.bool, device=is_audio.device)  # [B, S]
        return self._trunk(tokens, is_audio, attention_mask, None, keep_kv=False)[0]

    def forward_step(
        self,
        tokens: torch.Tensor,
        is_audio: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: MoTKVCache | None = None,
    ) -> tuple[torch.Tensor, MoTKVCache]:
        """Incremental forward for generation: new positions against the cache of the earlier ones.

        Args:
            tokens: [B, S_new, J] combined-vocab ids of the new positions.
            is_audio: [B, S_new] bool.
            attention_mask: [B, S_past + S_new] bool, True = real token, covering the cached and the new positions
                (left-padded prompts work: positions are cumsum(attention_mask) - 1).
            cache: what the previous call returned, an empty `MoTKVCache.allocate(max_len)`, or None for the first
                call (S_past = 0). The call writes the new positions into it in place and returns it; `select` copies.

        Returns:
            logits [B, S_new, H, head_size] from the audio heads at EVERY new position (at a text position they are
            whatever the heads make of it; the AUDIO_START position's logits predict the first audio step), and the
            cache now holding S_past + S_new positions.
        """
        h, cache = self._trunk(tokens, is_audio, attention_mask, cache)  # [B, S_new, D]
        B, S, D = h.shape
        logits = self.audio_logits(h.reshape(B * S, D))  # [B*S_new, H, size]
        return logits.reshape(B, S, self.n_heads, self.head_size), cache  # [B, S_new, H, size]

    def decode_step(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor, cache: MoTKVCache
    ) -> tuple[torch.Tensor, MoTKVCache]:
        """`forward_step` for one new AUDIO position per row (a decoding step), reading nothing from the device.

        The same logits as forward_step(tokens, all-audio, attention_mask, cache), without its host syncs (the id
        check, nonzero routing, the mask choice, CaptionCond's text test): every row is audio, and whether the cache
        holds pads was recorded when it was filled. The ids are not checked (that reads them): they come from the
        sampler, which builds them from the vocab.

        Args:
            tokens: [B, 1, J] combined-vocab audio ids.
            attention_mask: [B, S_past + 1] bool, the cache's positions then the new one (real).
            cache: what forward_step (the prefill) or decode_step returned; written in place.

        Returns:
            logits [B, 1, H, head_size] and the cache holding S_past + 1 positions.
        """
        B, S, J = tokens.shape
        if S != 1 or self.n_slots != J or cache.seq_len == 0:
            raise ValueError(
                f"decode_step takes one position of {self.n_slots} slots per row after a prefill (got tokens "
                f"{tuple(tokens.shape)}, cache of {cache.seq_len} positions); use forward_step for prompts"
            )
        if attention_mask.shape != (B, cache.seq_len + 1):
            raise ValueError(
                f"attention_mask has shape {tuple(attention_mask.shape)} but needs [B, S_past + 1] = "
                f"[{B}, {cache.seq_len} + 1]"
            )
        dtype = self.llm.model.embed_tokens.weight.dtype
        h = self._embed_audio(tokens[:, 0] - self.vocab.text_vocab_size).to(dtype)[:, None]  # [B, J] -> [B, 1, D]
        position_ids = attention_mask.long().sum(-1, keepdim=True) - 1  # [B, 1], as forward_step's cumsum - 1
        position_embeddings = self.llm.model.rotary_emb(h, position_ids=position_ids)  # cos, sin [B, 1, hd]
        # one query sees every real key: the row's mask itself (attention_mask_4d's for n_new=1), or none at all
        allowed = attention_mask.bool()[:, None, None, :] if cache.has_pads else None  # [B, 1, 1, S_past + 1]
        idx_audio = torch.arange(B, device=h.device)  # [B] every row is audio
        idx_text = idx_audio[:0]  # [0]
        for l, layer in enumerate(self.layers):
            if self.caption_cond is not None and l in cache.summaries:
                total, count = cache.summaries[l]  # [B, D], [B, 1]
                h = h + self.caption_cond[l](total / count.clamp(min=1))[:, None, :].to(h.dtype)  # [B, 1, D]
            h, _ = layer(h, position_embeddings, idx_text, idx_audio, allowed, cache.layer(l))  # [B, 1, D]
        cache.advance(1)
        h = self.llm.model.norm(h)  # [B, 1, D]
        return self.audio_logits(h.reshape(B, -1)).reshape(B, 1, self.n_heads, self.head_size), cache

    def audio_logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [N, D] final-normed hidden states of audio positions -> logits [N, H, head_size].

        H = K (delay; head k = C codes of codebook k then AUDIO_END) or 1 (flatten; K*C codes then AUDIO_END).
        """
        N = h.shape[0]
        if self.cfg.audio_head_init == "random":
            return self.head(h).reshape(N, self.n_heads, self.head_size)  # [N, H*size] -> [N, H, size]
        a = self.audio_out_norm(self.out_adapter(h))  # [N, d_audio]
        codes = torch.stack([head(a) for head in self.lm_heads], dim=1)  # [N, K, C]
        end = a @ self.end_head.to(a.dtype).T  # [N, H]
        if self.pattern == "delay":
            return torch.cat([codes, end[..., None]], dim=-1)  # [N, K, C + 1]
        return torch.cat([codes.reshape(N, 1, -1), end[..., None]], dim=-1)  # [N, K, C] -> [N, 1, K*C + 1]

    def forward(
        self, tokens: torch.Tensor, is_audio: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """tokens [B, S, J], is_audio [B, S], attention_mask [B, S] (None = all real) -> logits [B, S, H, head_size].

        Text positions hold zeros. delay: [B, S, K, C + 1]; flatten: [B, S, 1, K*C + 1].
        """
        B, S, _ = tokens.shape
        h = self.hidden_states(tokens, is_audio, attention_mask)  # [B, S, D]
        idx_audio = is_audio.reshape(-1).nonzero().squeeze(1)  # [N_audio]
        logits_a = self.audio_logits(h.reshape(B * S, -1).index_select(0, idx_audio))  # [N_audio, H, size]
        out = logits_a.new_zeros(B * S, self.n_heads, self.head_size)  # [B*S, H, size]
        return out.index_copy(0, idx_audio, logits_a).reshape(B, S, self.n_heads, self.head_size)  # [B, S, H, size]

    # --------------------------------------------------------------------------------------------- loss
    def local_targets(self, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Global label ids [..., J] -> (head-local targets [..., J] with IGNORE_INDEX kept, codebook [..., J]).

        codebook is k for code targets, -1 for AUDIO_END and ignored targets.
        """
        V, C, K = self.vocab.text_vocab_size, self.vocab.codebook_size, self.vocab.n_codebooks
        rel = labels - V  # [..., J]
        is_end = labels == self.vocab.audio_end
        is_code = (rel >= 0) & (rel < K * C)
        ignored = labels == IGNORE_INDEX
        if bool((~(is_end | is_code | ignored)).any()):
            raise ValueError("labels must be code ids, AUDIO_END or IGNORE_INDEX (text/START/PAD never are targets)")
        book = torch.where(is_code, rel // C, torch.full_like(rel, -1))  # [..., J]
        if self.pattern == "delay":
            slot = torch.arange(K, device=labels.device)
            if bool((is_code & (book != slot)).any()):
                raise ValueError("delay labels: slot k must hold codes of codebook k (see token_layout.DelayPattern)")
            local = torch.where(is_code, rel - book * C, torch.full_like(rel, C))  # [..., K]; END -> C
        else:
            local = torch.where(is_code, rel, torch.full_like(rel, K * C))  # [..., 1]; END -> K*C
        local = torch.where(ignored, torch.full_like(local, IGNORE_INDEX), local)
        return local, book

    def compute_loss(self, batch) -> LossOutput:
        """CE over code and AUDIO_END targets of a token_layout.Batch (tokens/labels [B, S, J], is_audio [B, S]).

        Heads run only on positions that have a target, so text positions never produce logits.
        """
        tokens, is_audio, labels = batch.tokens, batch.is_audio, batch.labels
        B, S, J = labels.shape
        K = self.vocab.n_codebooks
        # The loss mask is the audio positions: a label at a text position (token_layout never writes one) is ignored.
        labels = torch.where(is_audio[..., None], labels, torch.full_like(labels, IGNORE_INDEX))  # [B, S, J]
        has_label = (labels != IGNORE_INDEX).any(-1)  # [B, S]
        h = self.hidden_states(tokens, is_audio, batch.attention_mask)  # [B, S, D]
        idx = has_label.reshape(-1).nonzero().squeeze(1)  # [N]
        logits = self.audio_logits(h.reshape(B * S, -1).index_select(0, idx)).float()  # [N, H, size]
        local, book = self.local_targets(labels.reshape(B * S, J).index_select(0, idx))  # [N, J], [N, J]
        ce = F.cross_entropy(
            logits.reshape(-1, self.head_size), local.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
        ).reshape(local.shape)  # [N*J] -> [N, J]
        valid = local != IGNORE_INDEX  # [N, J]
        is_code = book >= 0  # [N, J]
        is_end = valid & ~is_code
        n_valid = valid.sum()
        n_early, w_early = self.early_frame_weight
        if n_early > 0 and w_early != 1.0:  # weigh the codes of each window's first n_early frames w_early times
            frames = target_frames(tokens, labels, vocab=self.vocab, pattern=self.pattern)  # [B, S, J]
            frames = frames.reshape(B * S, J).index_select(0, idx)  # [N, J]
            early = (frames >= 0) & (frames < n_early)  # [N, J]
            ce_w = ce * torch.where(early, torch.full_like(ce, w_early), torch.ones_like(ce))  # [N, J]
        else:
            ce_w = ce
        # [] summed (weighted) CE / number of targets (0 with a graph when there is no target); plain CE by default
        loss = (ce_w * valid).sum() / n_valid.clamp(min=1)

        ce_d = ce.detach()
        example = (idx // S)[:, None].expand_as(book)  # [N, J] batch row of each target
        ce_book = torch.zeros(K, device=ce.device).index_add(0, book[is_code], ce_d[is_code])  # [K]
        n_book = torch.zeros(K, dtype=torch.long, device=ce.device).index_add(
            0, book[is_code], torch.ones_like(book[is_code])
        )
        ce_ex = torch.zeros(B, device=ce.device).index_add(0, example[is_code], ce_d[is_code])  # [B]
        n_ex = torch.zeros(B, dtype=torch.long, device=ce.device).index_add(
            0, example[is_code], torch.ones_like(book[is_code])
        )
        ce_cells = torch.zeros(B * S, J, device=ce.device).index_copy(
            0, idx, torch.where(is_code, ce_d, torch.zeros_like(ce_d))
        )  # [B*S, J]
        return LossOutput(
            loss=loss,
            ce_sum_per_codebook=ce_book,
            count_per_codebook=n_book,
            ce_sum_per_example=ce_ex,
            count_per_example=n_ex,
            end_ce_sum=ce_d[is_end].sum(),
            end_count=is_end.sum(),
            ce_per_target=ce_cells.reshape(B, S, J),  # [B*S, J] -> [B, S, J]
        )

    def train(self, mode: bool = True) -> MoTAdapterModel:
        """Train mode for the trainable modules only: frozen modules (the Llama and the referenced MusicGen blocks)
        stay in eval(), so their dropout never fires, whatever their configs say. A module counts as trainable when
        it owns a parameter with requires_grad (LoRA A/B inside the frozen attention, adapters, audio norms/heads)."""
        super().train(mode)
        if mode:
            for m in self.modules():
                own = list(m.parameters(recurse=False))
                if own and not any(p.requires_grad for p in own):
                    m.eval()
            self.llm.eval()  # the towers' parameter-free wrappers (attention, decoder layers) too
            for m in self.modules():  # ...but trainable modules nested in them (LoRA) train
                if any(p.requires_grad for p in m.parameters(recurse=False)):
                    m.training = True
        return self

    def pretrained_copy_parameters(self) -> list[nn.Parameter]:
        """Trainable parameters that START as pretrained weights (optimizer.pretrained_copy_lr_scale): `separate`
        attention's norm and q/k/v/o, each audio expert's norm (from the Llama's post-attention norm), MusicGen's
        FFN blocks when freeze_audio_ffn=false (trained in place), and under musicgen init the code embeddings,
        audio output norm and lm_heads. Everything else trainable (down/up adapters, LoRA, random-init tables) is new."""
        in_layer = (".audio_attn.", ".audio.norm.", ".audio.ffn_norm.", ".audio.fc1.", ".audio.fc2.")
        prefixes = ("code_embed", "audio_out_norm.", "lm_heads.")
        return [
            p
            for name, p in self.named_parameters()
            if p.requires_grad and (any(s in name for s in in_layer) or name.startswith(prefixes))
        ]

    # ------------------------------------------------------------------------------------- checkpoints
    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Only the trainable tensors (adapters, audio norms/embeddings/heads, LoRA), detached, by stable name."""
        return {name: p.detach().clone() for name, p in self.named_parameters() if p.requires_grad}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load what trainable_state_dict wrote; refuses missing/unexpected names and shape changes."""
        params = {name: p for name, p in self.named_parameters() if p.requires_grad}
        missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        if missing or unexpected:
            raise ValueError(
                f"adapter checkpoint does not match this model: missing {missing[:8]}, unexpected {unexpected[:8]}; "
                f"resume with the same model config (pattern, audio_attention, lora_rank, init choices, freeze_audio_ffn)"
            )
        for name, p in params.items():
            if tuple(state[name].shape) != tuple(p.shape):
                raise ValueError(
                    f"adapter tensor {name}: checkpoint shape {tuple(state[name].shape)} != model {tuple(p.shape)}"
                )
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(state[name].to(device=p.device, dtype=p.dtype))
