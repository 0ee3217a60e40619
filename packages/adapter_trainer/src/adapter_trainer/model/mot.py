"""Mixture-of-Transformers adapter, `audio_tower=llm`: a frozen Llama whose audio positions get MusicGen's FFNs as
experts (docs/architecture.md, "The model (MoT)", draws it; the layer itself is `layers.MoTLayer`).

One scaled_dot_product_attention runs over all positions (causal AND key padding); positions are
cumsum(attention_mask) - 1. At init the model equals the frozen LLM at every text position.

Inputs: tokens [B, S, J] combined-vocab ids (token_layout), is_audio [B, S]. Heads (audio positions only): delay -> K
heads over C + 1 (codes of codebook k, then AUDIO_END); flatten -> one head over K*C + 1.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import LlamaForCausalLM, MusicgenForCausalLM

from adapter_trainer.config import MoTConfig
from adapter_trainer.data.token_layout import AudioVocab, Batch, n_slots
from adapter_trainer.model.adapter_params import AdapterParams
from adapter_trainer.model.attention import sdpa_mask
from adapter_trainer.model.audio_tables import AudioTables
from adapter_trainer.model.kv_cache import MoTKVCache
from adapter_trainer.model.layers import AudioExpert, MoTLayer
from adapter_trainer.model.loss import LossOutput, compute_loss


def default_layer_map(n_llm_layers: int, n_audio_layers: int) -> list[int]:
    """Evenly spaced: m(l) = round(l * (M - 1) / (L - 1)); 16 -> 24 gives 0, 2, 3, 5, ..., 23."""
    if n_llm_layers == 1:
        return [0]
    return [round(l * (n_audio_layers - 1) / (n_llm_layers - 1)) for l in range(n_llm_layers)]


class MoTAdapterModel(AudioTables, AdapterParams):
    """forward(tokens [B,S,J], is_audio [B,S]) -> logits; compute_loss(batch) -> LossOutput.

    `llm` stays frozen and untouched; `audio_lm`'s FFN blocks, lm_heads and final layer_norm are referenced.
    ValueError: vocab sizes or init names that do not match the models.
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
        assert cfg.audio_tower == "llm", cfg.audio_tower  # the musicgen tower is MusicgenRowsMoT (builders.mot_model)
        assert (cfg.lora_rank > 0) == (cfg.audio_attention == "lora"), cfg  # config.validate_config
        self.n_slots = n_slots(pattern, K)  # validates the pattern name
        self.vocab, self.pattern, self.cfg = vocab, pattern, cfg
        # trainer.activation_checkpointing: recompute each MoT layer in backward (training with grad enabled only)
        self.activation_checkpointing = False
        L, M = lcfg.num_hidden_layers, acfg.num_hidden_layers
        self.layer_map = layer_map = default_layer_map(L, M)
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

        self._init_audio_tables(audio_lm, vocab, pattern, cfg, float(ref.detach().float().std()))

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

    def _trunk(
        self,
        tokens: torch.Tensor,
        is_audio: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: MoTKVCache | None,
        keep_kv: bool = True,
    ) -> tuple[torch.Tensor, MoTKVCache | None]:
        """tokens [B, S, J], is_audio [B, S], attention_mask [B, S_past + S] -> (final-normed h [B, S, D], cache).

        keep_kv=False (training, scoring) keeps no keys/values: under activation checkpointing they would all stay
        alive until the last layer.
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
        for l, layer in enumerate(self.layers):
            past = cache.layer(l) if cache is not None else None
            if recompute:
                # Keeps only the layer's inputs; backward reruns it. Non-reentrant: restores the RNG state (dropout
                # draws the same masks; CPU and CUDA only: torch 2.11 keeps no MPS RNG state, harmless while every
                # trained module has dropout 0) and lets gradients reach parameters no input requires grad for.
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
        if cache is not None:  # the mask covers every position so far; decode_step's steps add real ones only
            cache.has_pads = not bool(attention_mask.all())
        return self.llm.model.norm(h), cache  # [B, S, D]

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
        """Generation: tokens [B, S_new, J], is_audio [B, S_new] against `cache` (None, or an empty
        `MoTKVCache.allocate(max_len)`, for the first call; written in place), attention_mask [B, S_past + S_new]
        (True = real; left padding works) -> (audio-head logits [B, S_new, H, head_size] at every new position,
        the cache holding S_past + S_new positions)."""
        h, cache = self._trunk(tokens, is_audio, attention_mask, cache)  # [B, S_new, D]
        B, S, D = h.shape
        logits = self.audio_logits(h.reshape(B * S, D))  # [B*S_new, H, size]
        return logits.reshape(B, S, self.n_heads, self.head_size), cache  # [B, S_new, H, size]

    def decode_step(
        self, tokens: torch.Tensor, attention_mask: torch.Tensor, cache: MoTKVCache
    ) -> tuple[torch.Tensor, MoTKVCache]:
        """`forward_step` for one new AUDIO position per row, tokens [B, 1, J], attention_mask [B, S_past + 1], with
        no host sync (no id check, no nonzero routing): the sampler builds the ids -> (logits [B, 1, H, head_size],
        the cache, written in place)."""
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
            h, _ = layer(h, position_embeddings, idx_text, idx_audio, allowed, cache.layer(l))  # [B, 1, D]
        cache.advance(1)
        h = self.llm.model.norm(h)  # [B, 1, D]
        return self.audio_logits(h.reshape(B, -1)).reshape(B, 1, self.n_heads, self.head_size), cache

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

    def compute_loss(self, batch: Batch) -> LossOutput:
        """CE over the audio targets of a token_layout.Batch (`loss.compute_loss`: heads run only where a target is)."""
        return compute_loss(self, batch)

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
        attention's norm and q/k/v/o, each audio expert's norm (from the Llama's post-attention norm), and under
        musicgen init the code embeddings, audio output norm and lm_heads. Everything else trainable (down/up adapters, LoRA, random-init tables) is new."""
        in_layer = (".audio_attn.", ".audio.norm.")
        prefixes = ("code_embed", "special_code_embed", "audio_out_norm.", "lm_heads.")
        return [
            p
            for name, p in self.named_parameters()
            if p.requires_grad and (any(s in name for s in in_layer) or name.startswith(prefixes))
        ]
