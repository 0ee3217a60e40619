"""The `model.mot.audio_tower=musicgen` variant: audio rows run MusicGen's own decoder, text rows the frozen Llama, and
the caption reaches the audio through MusicGen's own cross-attention in every MusicGen layer (docs/architecture.md,
"The model (MoT)", draws it).

MusicGen layer m reads Llama layer ℓ(m)'s caption states (evenly spaced) through its own norm and a projection that
starts at 0 (g_m starts at 1), so at init the audio logits ARE MusicGen's unconditional ones. Keys come from the
caption rows after BOS only: an empty caption has no keys, MusicGen's own null condition. The interface is
`MoTAdapterModel`'s; generation keeps its keys/values in `MusicgenRowsCache` (musicgen_cache).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import LlamaForCausalLM, MusicgenForCausalLM

from adapter_trainer.data.token_layout import AudioVocab, Batch
from adapter_trainer.model.adapter_params import AdapterParams
from adapter_trainer.model.kv_cache import LayerKV, MoTKVCache
from adapter_trainer.model.loss import LossOutput, compute_loss
from adapter_trainer.model.musicgen_cache import CaptionKeys, MusicgenRowsCache, decode_constants, decode_layer


def default_caption_layer_map(n_audio_layers: int, n_llm_layers: int) -> list[int]:
    """MusicGen layer m -> the Llama layer whose caption states it reads, evenly spaced: round(m (L-1) / (M-1))."""
    if n_audio_layers == 1:
        return [n_llm_layers - 1]
    return [round(m * (n_llm_layers - 1) / (n_audio_layers - 1)) for m in range(n_audio_layers)]


def new_projection(d_llm: int, d_audio: int, eps: float, ref: torch.Tensor) -> tuple[nn.RMSNorm, nn.Linear]:
    """The caption path's RMSNorm(d_llm) and Linear(d_llm -> d_audio, no bias), the projection zero."""
    norm = nn.RMSNorm(d_llm, eps=eps, device=ref.device, dtype=ref.dtype)
    proj = nn.Linear(d_llm, d_audio, bias=False, device=ref.device, dtype=ref.dtype)
    nn.init.zeros_(proj.weight)
    return norm, proj


def projection_rms(norm: nn.RMSNorm, proj: nn.Linear) -> torch.Tensor:
    """[] the RMS of proj(norm(x)) for x of i.i.d. unit-variance components: ||W diag(w)||_F / sqrt(d_audio)."""
    W = proj.weight.detach().float() * norm.weight.detach().float()[None, :]  # [d_audio, d_llm]
    return W.norm() / math.sqrt(W.shape[0])


class CaptionCrossAttention(nn.Module):
    """MusicGen layer m's caption path: its own norm and projection of the caption states (`norm`, `proj`) and its
    own cross-attention (encoder_attn, trained in place) reading them, added to the audio rows times the gate g_m."""

    def __init__(self, mg_layer: nn.Module, d_llm: int, eps: float) -> None:
        super().__init__()
        ref = mg_layer.fc1.weight
        self.norm, self.proj = new_projection(d_llm, mg_layer.embed_dim, eps, ref)
        self.query_norm = mg_layer.encoder_attn_layer_norm  # MusicGen's own
        self.attn = mg_layer.encoder_attn
        self.gate = nn.Parameter(torch.ones((), device=ref.device, dtype=ref.dtype))  # [] g_m

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, d_audio] projected caption states -> keys, values [B, heads, T, head_dim]."""
        B, T, _ = x.shape
        a = self.attn
        k = a.k_proj(x).view(B, T, a.num_heads, a.head_dim).transpose(1, 2)
        v = a.v_proj(x).view(B, T, a.num_heads, a.head_dim).transpose(1, 2)
        return k, v

    def forward(self, h: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], keys: CaptionKeys) -> torch.Tensor:
        """h [B, A, d_audio] audio rows after self-attention -> h + g_m * cross-attention (0 in rows with no caption)."""
        a = self.attn
        B, A, _ = h.shape
        q = a.q_proj(self.query_norm(h)).view(B, A, a.num_heads, a.head_dim).transpose(1, 2)  # [B, H, A, hd]
        out = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=keys.mask)  # [B, H, A, hd]
        out = a.out_proj(out.transpose(1, 2).reshape(B, A, -1))  # [B, A, d_audio]
        if a.out_proj.bias is not None:  # MusicGen's has none: the zeroed values already give 0
            out = out.masked_fill(~keys.present, 0.0)
        return h + self.gate.to(h.dtype) * out


class MusicgenRowsMoT(AdapterParams):
    """forward(tokens [B,S,K], is_audio [B,S], attention_mask) -> logits [B, S, K, C + 1]; see the module docstring.

    Raises:
        ValueError: sizes that do not match; the message names the fix.
    """

    def __init__(
        self,
        llm: LlamaForCausalLM,
        audio_lm: MusicgenForCausalLM,
        vocab: AudioVocab,
        pattern: str,
    ) -> None:
        super().__init__()
        acfg = audio_lm.config
        K, C = vocab.n_codebooks, vocab.codebook_size
        assert pattern == "delay", pattern  # MusicGen's layers read its delay pattern (config.validate_config)
        if (acfg.num_codebooks, acfg.vocab_size) != (K, C):
            raise ValueError(
                f"audio LM has {acfg.num_codebooks} codebooks x {acfg.vocab_size} codes but the vocab/shards have "
                f"{K} x {C}; use shards encoded with the audio LM's codec"
            )
        L, M = llm.config.num_hidden_layers, acfg.num_hidden_layers
        self.vocab, self.pattern, self.layer_map = vocab, pattern, default_caption_layer_map(M, L)
        self.n_slots, self.n_heads, self.head_size = K, K, C + 1
        self.activation_checkpointing = False
        llm.requires_grad_(False)
        audio_lm.requires_grad_(False)
        ref = llm.model.embed_tokens.weight
        audio_lm.to(device=ref.device, dtype=ref.dtype)
        self.llm = llm
        self.decoder = audio_lm.model.decoder  # MusicGen's tables, positions, layers and final norm
        self.lm_heads = audio_lm.lm_heads
        self.bos_id, self.pad_id = int(acfg.bos_token_id), int(acfg.pad_token_id)
        d_llm, eps = llm.config.hidden_size, llm.config.rms_norm_eps
        self.caption = nn.ModuleList(CaptionCrossAttention(layer, d_llm, eps) for layer in self.decoder.layers)
        self.requires_grad_(False)
        self.caption.requires_grad_(True)  # gates, norms, projections and MusicGen's cross-attention
        self.end_head = nn.Parameter(torch.randn(K, acfg.hidden_size, device=ref.device, dtype=ref.dtype) * 0.02)

    def caption_scale(self) -> float:
        """How open the caption path is: the mean over MusicGen layers m of |g_m| · RMS(proj_m(norm_m(x))) for x of
        i.i.d. unit-variance components, i.e. |g_m| · ||W_m diag(w_m)||_F / sqrt(d_audio) (W_m the projection,
        w_m the norm's weight). 0 at init. One host read: log it, do not call it per step."""
        with torch.no_grad():
            scale = [c.gate.detach().float().abs() * projection_rms(c.norm, c.proj) for c in self.caption]
            return float(torch.stack(scale).mean())

    def _text_states(
        self, tokens: torch.Tensor, is_audio: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The Llama over the text rows -> (the caption states [B, T, d_llm] of Llama layer layer_map[m] for each
        MusicGen layer m, text mask [B, T])."""
        text_mask = attention_mask.bool() & ~is_audio  # [B, S]
        T = int(text_mask.nonzero()[:, 1].max()) + 1 if bool(text_mask.any()) else 1  # the text prefix
        ids = torch.where(text_mask, tokens[..., 0], torch.zeros_like(tokens[..., 0]))[:, :T]  # [B, T]
        mask = text_mask[:, :T]
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # HF-style: pads take no position
        out = self.llm.model(
            input_ids=ids,
            attention_mask=mask.long(),
            position_ids=positions,
            output_hidden_states=True,
            use_cache=False,
        )
        # hidden_states[l + 1] is layer l's output; the last one is after the Llama's final RMSNorm (transformers adds
        # the normed state last), the others before it: each caption norm takes either
        states = [torch.where(mask[..., None], out.hidden_states[ell + 1], 0.0) for ell in self.layer_map]
        return states, mask  # masked rows zeroed: a fully masked pad row's NaN never reaches a key

    def _caption_keys(self, tokens: torch.Tensor, is_audio: torch.Tensor, attention_mask: torch.Tensor) -> CaptionKeys:
        """The caption rows' keys/values for every MusicGen layer, the key mask and which rows have a caption."""
        states, text_mask = self._text_states(tokens, is_audio, attention_mask)
        caption = text_mask & (text_mask.long().cumsum(-1) > 1)  # [B, T] text rows after each row's first (BOS)
        present = caption.any(-1)  # [B]
        kv = [c.keys_values(c.proj(c.norm(s))) for c, s in zip(self.caption, states)]
        # a row without a caption: zero values, so its attention (over every key, see CaptionKeys) gives exactly 0
        absent = ~present[:, None, None, None]  # [B, 1, 1, 1]
        kv = [(k, v.masked_fill(absent, 0.0)) for k, v in kv]
        mask = (caption | ~present[:, None])[:, None, None, :]  # [B, 1, 1, T]
        return CaptionKeys(kv=kv, mask=mask, present=present[:, None, None])

    def _audio_ids(self, tokens: torch.Tensor, is_audio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [B, S, K] -> (MusicGen ids [B, S, K] at audio rows, is_code [B, S, K]): AUDIO_START -> BOS,
        AUDIO_PAD / AUDIO_END -> pad (it has no end id), code (k, c) in slot k -> c."""
        V, C, K = self.vocab.text_vocab_size, self.vocab.codebook_size, self.vocab.n_codebooks
        local = tokens - V - (torch.arange(K, device=tokens.device) * C)  # [B, S, K] c for codebook k's codes
        is_code = is_audio[..., None] & (local >= 0) & (local < C)
        start = is_audio[..., None] & (tokens == self.vocab.audio_start)
        special = torch.where(start, torch.full_like(local, self.bos_id), torch.full_like(local, self.pad_id))
        return torch.where(is_code, local, special), is_code

    def _audio_block(
        self,
        audio_ids: torch.Tensor,  # [B, A, K] MusicGen ids of the new audio positions
        allowed: torch.Tensor | None,  # [B, 1, A, A_past + A] bool self-attention mask; None = every cached key
        caption: CaptionKeys,
        cache: MoTKVCache | None = None,  # the audio rows' keys/values so far (generation), written in place
    ) -> torch.Tensor:
        """MusicGen's decoder over the new audio rows, caption cross-attention added -> final-normed h [B, A, d_audio]."""
        B, A, K = audio_ids.shape
        dec = self.decoder
        past = cache.seq_len if cache is not None else 0
        h = sum(dec.embed_tokens[k](audio_ids[..., k]) for k in range(K))  # [B, A, d_audio]
        # positions past..past+A-1, counted from AUDIO_START (position 0) as MusicGen counts from its BOS
        h = h + dec.embed_positions(audio_ids.transpose(1, 2), past_key_values_length=past).to(h.dtype)
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled() and cache is None
        for m, layer in enumerate(dec.layers):
            kv = cache.layer(m) if cache is not None else None
            args = (layer, self.caption[m], h, allowed, caption.kv[m], caption, kv)
            h = checkpoint(_decoder_layer, *args, use_reentrant=False) if recompute else _decoder_layer(*args)
        if cache is not None:
            cache.advance(A)
        return dec.layer_norm(h)  # [B, A, d_audio]

    def hidden_states(
        self, tokens: torch.Tensor, is_audio: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """tokens [B, S, K], is_audio [B, S], attention_mask [B, S] -> h [B, S, d_audio]: MusicGen's final-normed
        states at audio rows, zeros at text rows (they predict nothing)."""
        if tokens.shape[-1] != self.n_slots:
            raise ValueError(f"tokens have J={tokens.shape[-1]} slots but the delay pattern needs {self.n_slots}")
        if attention_mask is None:
            attention_mask = torch.ones(is_audio.shape, dtype=torch.bool, device=is_audio.device)
        attention_mask = attention_mask.bool()
        caption = self._caption_keys(tokens, is_audio, attention_mask)
        ids, _ = self._audio_ids(tokens, is_audio)
        pos, valid = _audio_positions(is_audio & attention_mask)  # [B, A], [B, A]
        audio_ids = ids.gather(1, pos[..., None].expand(-1, -1, ids.shape[-1]))  # [B, A, K]
        A = audio_ids.shape[1]
        causal = torch.ones(A, A, dtype=torch.bool, device=valid.device).tril()
        h_audio = self._audio_block(audio_ids, causal[None, None] & valid[:, None, None, :], caption)  # [B, A, d]
        B, S = is_audio.shape
        out = h_audio.new_zeros(B, S, h_audio.shape[-1])
        rows = torch.arange(B, device=pos.device)[:, None].expand_as(pos)
        out[rows[valid], pos[valid]] = h_audio[valid]
        return out  # [B, S, d_audio]

    def audio_logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [N, d_audio] final-normed audio states -> [N, K, C + 1]: MusicGen's heads, then the AUDIO_END logit."""
        codes = torch.stack([head(h) for head in self.lm_heads], dim=1)  # [N, K, C]
        end = h @ self.end_head.to(h.dtype).T  # [N, K]
        return torch.cat([codes, end[..., None]], dim=-1)

    def forward(self, tokens: torch.Tensor, is_audio: torch.Tensor, attention_mask: torch.Tensor | None = None):
        """-> logits [B, S, K, C + 1] (text rows: whatever the heads make of zeros)."""
        B, S, _ = tokens.shape
        h = self.hidden_states(tokens, is_audio, attention_mask)
        return self.audio_logits(h.reshape(B * S, -1)).reshape(B, S, self.n_heads, self.head_size)

    def compute_loss(self, batch: Batch) -> LossOutput:
        return compute_loss(self, batch)

    def forward_step(
        self,
        tokens: torch.Tensor,
        is_audio: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: MusicgenRowsCache | None = None,
    ) -> tuple[torch.Tensor, MusicgenRowsCache]:
        """Generation: the prompt (text rows then AUDIO_START, left-padded) with an empty cache (None, or
        `new_generation_cache`'s), then audio positions only, the cache's. Returns logits [B, S_new, K, C + 1] of the
        new positions (zeros at the prompt's text rows) and the cache, written in place."""
        attention_mask = attention_mask.bool()
        if not isinstance(cache, MusicgenRowsCache) or cache.caption is None:  # the prompt (any empty cache)
            capacity = getattr(cache, "capacity", 0) if cache is not None else 0
            audio_cache = cache.audio if isinstance(cache, MusicgenRowsCache) else MoTKVCache.allocate(capacity)
            caption = self._caption_keys(tokens, is_audio, attention_mask)
            pos, valid = _audio_positions(is_audio & attention_mask)
            if not bool(valid.all()):
                raise ValueError("generation prompts end with AUDIO_START in every row (left padding)")
            ids, _ = self._audio_ids(tokens, is_audio)
            audio_ids = ids.gather(1, pos[..., None].expand(-1, -1, ids.shape[-1]))  # [B, A, K]
            A = audio_ids.shape[1]
            causal = torch.ones(A, A, dtype=torch.bool, device=tokens.device).tril()[None, None]  # [1, 1, A, A]
            gates = [float(c.gate) for c in self.caption]  # one host read each, at the prompt
            constants = decode_constants(self.decoder, self.lm_heads, self.end_head, self.vocab, self.pad_id, gates)
            cache = MusicgenRowsCache(caption=caption, audio=audio_cache, decode=constants)
            h = self._audio_block(audio_ids, causal, caption, cache.audio)  # [B, A, d_audio]
        else:
            if not bool(is_audio.all()):
                raise ValueError("after the prompt, generation feeds audio positions only")
            ids, _ = self._audio_ids(tokens, is_audio)
            h = self._audio_block(ids, None, cache.caption, cache.audio)  # [B, S_new, d_audio]
        cache.seq_len += tokens.shape[1]
        B, S_new = tokens.shape[:2]
        n_audio = h.shape[1]
        logits = self.audio_logits(h.reshape(-1, h.shape[-1])).reshape(B, n_audio, self.n_heads, -1)
        if n_audio < S_new:  # the prompt's text rows get zeros (the sampler reads the last position only)
            logits = torch.cat([logits.new_zeros(B, S_new - n_audio, *logits.shape[2:]), logits], dim=1)
        return logits, cache

    def decode_step(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor, cache: MusicgenRowsCache
    ) -> tuple[torch.Tensor, MusicgenRowsCache]:
        """forward_step for one audio position per row after the prompt, with no host read of device values:
        tokens [B, 1, K] -> logits [B, 1, K, C + 1]. attention_mask is the sampler's (all audio rows are real)."""
        if tokens.shape[1] != 1 or not isinstance(cache, MusicgenRowsCache) or cache.decode is None:
            raise ValueError("decode_step takes one position of K slots per row after a prefill (forward_step)")
        c, dec, B = cache.decode, self.decoder, tokens.shape[0]
        ids = tokens[:, 0]  # [B, K]
        is_code = (ids >= c.lo) & (ids < c.lo + self.vocab.codebook_size)
        rows = torch.where(is_code, ids - c.shift, c.pad_rows)  # [B, K] rows of the stacked tables
        past = cache.audio.seq_len
        h = F.embedding(rows, c.table).sum(1, keepdim=True)  # [B, 1, d_audio]
        if past >= dec.embed_positions.weights.shape[0]:  # beyond the sinusoids made so far: MusicGen makes more
            dec.embed_positions(tokens.transpose(1, 2), past_key_values_length=past)
        h = h + dec.embed_positions.weights[past].to(h.dtype)  # position `past` from AUDIO_START
        for m, layer in enumerate(dec.layers):
            h = decode_layer(layer, h, c.qkv[m], cache.audio.layer(m), cache.caption.kv[m], cache.caption, c.gates[m])
        cache.audio.advance(1)
        cache.seq_len += 1
        h = F.layer_norm(h[:, 0], h.shape[-1:], dec.layer_norm.weight, dec.layer_norm.bias, dec.layer_norm.eps)
        return F.linear(h, c.heads).view(B, 1, self.n_heads, self.head_size), cache

    def new_generation_cache(self, max_len: int) -> MusicgenRowsCache:
        """The sampler's empty cache, with room for max_len audio positions per row (the prompt fills it)."""
        return MusicgenRowsCache.allocate(max_len)

    def train(self, mode: bool = True) -> MusicgenRowsMoT:
        """Train mode for the trainable modules only; the frozen towers stay in eval() (no dropout)."""
        super().train(mode)
        if mode:
            self.llm.eval()
            self.decoder.eval()
            self.lm_heads.eval()
        return self

    def pretrained_copy_parameters(self) -> list[nn.Parameter]:
        """Trainable parameters that start as pretrained weights: MusicGen's cross-attention and its norm (named
        `decoder.layers.m.encoder_attn*` in state dicts: the decoder registers them first)."""
        return [p for c in self.caption for p in (*c.attn.parameters(), *c.query_norm.parameters())]


def _decoder_layer(
    layer: nn.Module,
    caption: CaptionCrossAttention,
    h: torch.Tensor,
    allowed: torch.Tensor | None,
    caption_kv: tuple[torch.Tensor, torch.Tensor],
    keys: CaptionKeys,
    past: LayerKV | None = None,
) -> torch.Tensor:
    """MusicGen decoder layer m on the audio rows h [B, A, d_audio] (transformers' MusicgenDecoderLayer, dropout off:
    frozen), its cross-attention fed the caption. past: the layer's handle of the generation cache (`LayerKV`):
    the new keys/values are written there and the attention reads all of them."""
    a = layer.self_attn
    B, A, _ = h.shape
    x = layer.self_attn_layer_norm(h)
    q, k, v = (proj(x).view(B, A, a.num_heads, a.head_dim).transpose(1, 2) for proj in (a.q_proj, a.k_proj, a.v_proj))
    if past is not None:
        k, v = past.update(k, v)  # [B, H, A_past + A, hd]
    attn = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # [B, H, A, hd], scale head_dim**-0.5
    h = h + a.out_proj(attn.transpose(1, 2).reshape(B, A, -1))
    h = caption(h, caption_kv, keys)
    return h + layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(h))))


def _audio_positions(audio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """audio [B, S] bool (real audio rows, one contiguous run per row) -> (pos [B, A] their indices, right-padded with
    the run's last index, valid [B, A])."""
    n = audio.sum(1)  # [B]
    A = max(int(n.max()), 1)
    first = audio.long().argmax(1)  # [B] AUDIO_START
    offs = torch.arange(A, device=audio.device)[None, :]
    valid = offs < n[:, None]
    pos = first[:, None] + torch.minimum(offs, (n[:, None] - 1).clamp(min=0))
    return pos, valid
