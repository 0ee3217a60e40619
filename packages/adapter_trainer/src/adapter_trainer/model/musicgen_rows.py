"""The `model.mot.audio_tower=musicgen` variant: audio rows run MusicGen's own decoder, text rows the frozen Llama, and
the caption reaches the audio through a zero-gated cross-attention per MusicGen layer.

    text rows  (BOS caption):   Llama (frozen, all L layers) ─ hidden states after each layer ℓ ──────────────┐
    audio rows (AUDIO_START…):  MusicGen's K tables summed + sinusoidal positions (from 0 at AUDIO_START)     │
                                for m in 0..M-1, MusicGen decoder layer m (frozen unless named):               │
                                  self-attention over the audio rows (its norm and q/k/v/o, causal)           │
                                  + tanh(gate_m) · cross-attention(its encoder_attn_layer_norm, its q/k/v/o) ◄┘
                                        to RMSNorm_m → Linear(d_llm → d_audio)_m of Llama layer ℓ(m)'s caption rows
                                  + its FFN block
                                MusicGen's final LayerNorm ─ its K lm_heads (codes) + an AUDIO_END logit per head

At init every gate is 0, so the audio logits ARE `MusicgenForCausalLM`'s unconditional logits on the same codes
(tested to fp32 tolerance) and the text rows are the Llama's: the adapter starts where MusicGen is and only adds the
caption. MusicGen's cross-attention is its T5 slot (musicgen-small conditions every layer on projected T5 states,
`enc_to_dec_proj`; M2UGen feeds it an LLM's states the same way); here each layer m reads the Llama's caption states
after layer ℓ(m) (`layer_map`, evenly spaced by default: 24 MusicGen layers over 16 Llama layers).

Trains: per MusicGen layer the caption norm, projection and gate, MusicGen's cross-attention (its norm and q/k/v/o,
in place: the unconditional MusicGen never used them), and the AUDIO_END head. Frozen: both towers otherwise (MusicGen's
tables, self-attention, FFNs, final norm and heads). Only the delay pattern (MusicGen's own layout).

The same interface as `MoTAdapterModel` (`hidden_states` / `audio_logits` / `compute_loss`, `forward_step` for the
sampler, `trainable_state_dict`): the learning check, training, checkpoints and generation use either. Generation
keeps the caption's keys/values and the audio ids in `MusicgenRowsCache` and reruns MusicGen's layers over the audio
rows at each step (no self-attention KV cache yet: O(A^2) per step, fine at demo size).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import LlamaForCausalLM, MusicgenForCausalLM

from adapter_trainer.data.token_layout import AudioVocab, Batch
from adapter_trainer.model.adapter_params import AdapterParams
from adapter_trainer.model.loss import LossOutput, compute_loss


def default_caption_layer_map(n_audio_layers: int, n_llm_layers: int) -> list[int]:
    """MusicGen layer m -> the Llama layer whose caption states it reads, evenly spaced: round(m (L-1) / (M-1))."""
    if n_audio_layers == 1:
        return [n_llm_layers - 1]
    return [round(m * (n_llm_layers - 1) / (n_audio_layers - 1)) for m in range(n_audio_layers)]


class CaptionCrossAttention(nn.Module):
    """One MusicGen layer's caption path: the Llama's caption states -> RMSNorm -> Linear(d_llm, d_audio) -> keys and
    values of MusicGen's own cross-attention; its output enters the audio rows through tanh(gate), 0 at init."""

    def __init__(self, d_llm: int, eps: float, mg_layer: nn.Module) -> None:
        super().__init__()
        d_audio = mg_layer.embed_dim
        ref = mg_layer.fc1.weight
        self.norm = nn.RMSNorm(d_llm, eps=eps, device=ref.device, dtype=ref.dtype)
        self.proj = nn.Linear(d_llm, d_audio, bias=False, device=ref.device, dtype=ref.dtype)
        nn.init.normal_(self.proj.weight, std=d_llm**-0.5)  # unit-variance keys' inputs from the normed states
        self.query_norm = mg_layer.encoder_attn_layer_norm  # MusicGen's own, trained in place
        self.attn = mg_layer.encoder_attn
        self.gate = nn.Parameter(torch.zeros((), device=ref.device, dtype=ref.dtype))

    def keys_values(self, caption: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """caption [B, T, d_llm] (Llama states of the text rows) -> keys, values [B, heads, T, head_dim]."""
        x = self.proj(self.norm(caption))  # [B, T, d_audio]
        B, T, _ = x.shape
        a = self.attn
        k = a.k_proj(x).view(B, T, a.num_heads, a.head_dim).transpose(1, 2)
        v = a.v_proj(x).view(B, T, a.num_heads, a.head_dim).transpose(1, 2)
        return k, v

    def forward(self, h: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], text_mask: torch.Tensor) -> torch.Tensor:
        """h [B, A, d_audio] audio rows after self-attention; text_mask [B, T] -> h + tanh(gate) * cross-attention."""
        a = self.attn
        B, A, _ = h.shape
        q = a.q_proj(self.query_norm(h)).view(B, A, a.num_heads, a.head_dim).transpose(1, 2)  # [B, H, A, hd]
        out = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=text_mask[:, None, None, :])  # [B, H, A, hd]
        out = a.out_proj(out.transpose(1, 2).reshape(B, A, -1))  # [B, A, d_audio]
        return h + torch.tanh(self.gate).to(h.dtype) * out


@dataclass
class MusicgenRowsCache:
    """What generation keeps between steps: every layer's caption keys/values, the text mask and the audio ids."""

    caption_kv: list[tuple[torch.Tensor, torch.Tensor]]  # per MusicGen layer, [B, H, T, hd] each
    text_mask: torch.Tensor  # [B, T] bool
    audio_ids: torch.Tensor  # [B, A, K] MusicGen ids of the audio rows so far
    seq_len: int  # positions seen so far (text + audio, pads included)


class MusicgenRowsMoT(AdapterParams):
    """forward(tokens [B,S,K], is_audio [B,S], attention_mask) -> logits [B, S, K, C + 1]; see the module docstring.

    Raises:
        ValueError: pattern other than delay, sizes that do not match, a layer_map of the wrong length.
    """

    def __init__(
        self,
        llm: LlamaForCausalLM,
        audio_lm: MusicgenForCausalLM,
        vocab: AudioVocab,
        pattern: str,
        layer_map: list[int] | None = None,
    ) -> None:
        super().__init__()
        acfg = audio_lm.config
        K, C = vocab.n_codebooks, vocab.codebook_size
        if pattern != "delay":
            raise ValueError(
                f"model.mot.audio_tower=musicgen runs MusicGen's own layers, which read its delay pattern; "
                f"data.pattern={pattern!r} cannot be read by them: set data.pattern=delay (or audio_tower=llm)"
            )
        if (acfg.num_codebooks, acfg.vocab_size) != (K, C):
            raise ValueError(
                f"audio LM has {acfg.num_codebooks} codebooks x {acfg.vocab_size} codes but the vocab/shards have "
                f"{K} x {C}; use shards encoded with the audio LM's codec"
            )
        L, M = llm.config.num_hidden_layers, acfg.num_hidden_layers
        layer_map = list(layer_map) if layer_map is not None else default_caption_layer_map(M, L)
        if len(layer_map) != M or not all(0 <= ell < L for ell in layer_map):
            raise ValueError(
                f"model.mot.layer_map={layer_map}: with audio_tower=musicgen it has one entry per MusicGen layer ({M}), "
                f"the Llama layer (0..{L - 1}) whose caption states that layer reads; leave it null for an even map"
            )
        self.vocab, self.pattern, self.layer_map = vocab, pattern, layer_map
        self.n_slots, self.n_heads, self.head_size = K, K, C + 1
        self.activation_checkpointing = False
        self.early_frame_weight: tuple[int, float] = (0, 1.0)
        llm.requires_grad_(False)
        audio_lm.requires_grad_(False)
        ref = llm.model.embed_tokens.weight
        audio_lm.to(device=ref.device, dtype=ref.dtype)
        self.llm = llm
        self.decoder = audio_lm.model.decoder  # MusicGen's tables, positions, layers and final norm
        self.lm_heads = audio_lm.lm_heads
        self.bos_id, self.pad_id = int(acfg.bos_token_id), int(acfg.pad_token_id)
        self.caption = nn.ModuleList(
            CaptionCrossAttention(llm.config.hidden_size, llm.config.rms_norm_eps, layer).requires_grad_(True)
            for layer in self.decoder.layers
        )
        self.end_head = nn.Parameter(torch.randn(K, acfg.hidden_size, device=ref.device, dtype=ref.dtype) * 0.02)

    # ------------------------------------------------------------------------------------------------ pieces
    def _text_states(
        self, tokens: torch.Tensor, is_audio: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The Llama over the text rows -> (per MusicGen layer its caption states [B, T, d_llm], text mask [B, T])."""
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
        # the normed state last), the others before it: each layer's own caption norm takes either
        states = [torch.where(mask[..., None], out.hidden_states[ell + 1], 0.0) for ell in self.layer_map]
        return states, mask  # masked rows zeroed: a fully masked pad row's NaN never reaches a key

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
        audio_ids: torch.Tensor,  # [B, A, K] MusicGen ids, position 0 = AUDIO_START
        audio_mask: torch.Tensor,  # [B, A] bool, real positions (right padding)
        caption_kv: list[tuple[torch.Tensor, torch.Tensor]],
        text_mask: torch.Tensor,  # [B, T]
    ) -> torch.Tensor:
        """MusicGen's decoder over the audio rows, caption cross-attention added -> final-normed h [B, A, d_audio]."""
        B, A, K = audio_ids.shape
        dec = self.decoder
        h = sum(dec.embed_tokens[k](audio_ids[..., k]) for k in range(K))  # [B, A, d_audio]
        h = h + dec.embed_positions(audio_ids.transpose(1, 2)).to(h.dtype)  # positions 0..A-1 from AUDIO_START
        causal = torch.ones(A, A, dtype=torch.bool, device=h.device).tril()
        allowed = causal[None, None] & audio_mask[:, None, None, :]  # [B, 1, A, A]
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for m, layer in enumerate(dec.layers):
            args = (layer, self.caption[m], h, allowed, caption_kv[m], text_mask)
            h = checkpoint(_decoder_layer, *args, use_reentrant=False) if recompute else _decoder_layer(*args)
        return dec.layer_norm(h)  # [B, A, d_audio]

    # -------------------------------------------------------------------------------------------- interface
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
        states, text_mask = self._text_states(tokens, is_audio, attention_mask)
        caption_kv = [c.keys_values(s) for c, s in zip(self.caption, states)]
        ids, _ = self._audio_ids(tokens, is_audio)
        pos, valid = _audio_positions(is_audio & attention_mask)  # [B, A], [B, A]
        audio_ids = ids.gather(1, pos[..., None].expand(-1, -1, ids.shape[-1]))  # [B, A, K]
        h_audio = self._audio_block(audio_ids, valid, caption_kv, text_mask)  # [B, A, d_audio]
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
        """Generation: the prompt (text rows then AUDIO_START, left-padded) with cache=None, then one audio position
        per row and call. Returns logits [B, S_new, K, C + 1] of the new positions and the cache."""
        attention_mask = attention_mask.bool()
        if cache is None or not isinstance(cache, MusicgenRowsCache):  # the sampler may hand an empty MoTKVCache
            states, text_mask = self._text_states(tokens, is_audio, attention_mask)
            caption_kv = [c.keys_values(s) for c, s in zip(self.caption, states)]
            pos, valid = _audio_positions(is_audio & attention_mask)
            if not bool(valid.all()):
                raise ValueError("generation prompts end with AUDIO_START in every row (left padding)")
            ids, _ = self._audio_ids(tokens, is_audio)
            audio_ids = ids.gather(1, pos[..., None].expand(-1, -1, ids.shape[-1]))
            cache = MusicgenRowsCache(caption_kv, text_mask, audio_ids, tokens.shape[1])
            n_new_audio = audio_ids.shape[1]
        else:
            if not bool(is_audio.all()):
                raise ValueError("after the prompt, generation feeds audio positions only")
            ids, _ = self._audio_ids(tokens, is_audio)
            cache.audio_ids = torch.cat([cache.audio_ids, ids], dim=1)
            cache.seq_len += tokens.shape[1]
            n_new_audio = tokens.shape[1]
        A = cache.audio_ids.shape[1]
        valid = torch.ones(cache.audio_ids.shape[:2], dtype=torch.bool, device=tokens.device)
        h = self._audio_block(cache.audio_ids, valid, cache.caption_kv, cache.text_mask)  # [B, A, d_audio]
        B, S_new = tokens.shape[:2]
        logits = self.audio_logits(h[:, A - n_new_audio :].reshape(-1, h.shape[-1])).reshape(
            B, n_new_audio, self.n_heads, -1
        )
        if n_new_audio < S_new:  # the prompt's text rows get zeros (the sampler reads the last position only)
            logits = torch.cat([logits.new_zeros(B, S_new - n_new_audio, *logits.shape[2:]), logits], dim=1)
        return logits, cache

    def new_generation_cache(self, max_len: int) -> None:
        """The sampler's empty cache: none (forward_step makes a MusicgenRowsCache from the prompt)."""
        return None

    # ------------------------------------------------------------------------------------- training plumbing
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
        return [p for c in self.caption for p in (*c.attn.parameters(), *c.query_norm.parameters()) if p.requires_grad]


def _decoder_layer(
    layer: nn.Module,
    caption: CaptionCrossAttention,
    h: torch.Tensor,
    allowed: torch.Tensor,
    caption_kv: tuple[torch.Tensor, torch.Tensor],
    text_mask: torch.Tensor,
) -> torch.Tensor:
    """MusicGen decoder layer m on the audio rows (transformers' MusicgenDecoderLayer, dropout off: frozen), its
    cross-attention fed the caption through the gate."""
    a = layer.self_attn
    B, A, _ = h.shape
    x = layer.self_attn_layer_norm(h)
    q, k, v = (proj(x).view(B, A, a.num_heads, a.head_dim).transpose(1, 2) for proj in (a.q_proj, a.k_proj, a.v_proj))
    attn = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # [B, H, A, hd], scale head_dim**-0.5
    h = h + a.out_proj(attn.transpose(1, 2).reshape(B, A, -1))
    h = caption(h, caption_kv, text_mask)
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
