"""The audio side's tables and heads of `MoTAdapterModel` (a mixin: the parameters stay the model's, by the same
names). `audio_embed_init/audio_head_init`: `musicgen` starts from MusicGen's tables and heads (docs/architecture.md,
"The model (MoT)"), `random` is one table over the audio range (`audio_embed`) and one linear head (`head`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import MusicgenForCausalLM

from adapter_trainer.data.token_layout import AudioVocab

RANDOM_INIT_SCALE = 0.1  # random-init tables: std as a fraction of the text embeddings' std


def _musicgen_row(audio_lm: MusicgenForCausalLM, name: str) -> int:
    """The embedding row of MusicGen's special id `name` (bos_token_id / pad_token_id), checked to exist."""
    row = getattr(audio_lm.config, name)
    n_rows = audio_lm.model.decoder.embed_tokens[0].num_embeddings
    if row is None or not 0 <= int(row) < n_rows:
        raise ValueError(
            f"the audio LM's {name}={row} is not a row of its {n_rows}-row code tables; MusicGen checkpoints use "
            f"{n_rows - 1} (one row past the codes): fix its config.json"
        )
    return int(row)


class AudioTables(nn.Module):
    """`_init_audio_tables` (from __init__), `_embed_audio` and `audio_logits` of the MoT adapter."""

    def _init_audio_tables(
        self, audio_lm: MusicgenForCausalLM, vocab: AudioVocab, pattern: str, cfg, text_std: float
    ) -> None:
        """The tables and heads of `cfg` (a MoTConfig) on the Llama's device and dtype (self.d_llm, self.d_audio set)."""
        K, C, d_llm, d_audio = vocab.n_codebooks, vocab.codebook_size, self.d_llm, self.d_audio
        ref = self.llm.model.embed_tokens.weight
        dev, dt = ref.device, ref.dtype

        n_codes = vocab.n_codes
        # ---- audio embeddings: one table over the audio range [V, V + K*C + 3)
        if cfg.audio_embed_init == "musicgen":
            codes = torch.cat(
                [e.weight.detach()[:C] for e in audio_lm.model.decoder.embed_tokens], dim=0
            )  # [K*C, d_audio]
            self.code_embed = nn.Parameter(codes.clone())  # [K*C, d_audio] trainable, initialised from MusicGen's rows
            # AUDIO_START and AUDIO_PAD slots read what transformers' MusicGen reads there: row bos_token_id of
            # codebook k's table at position 0 (the decoder start, in every codebook) and row pad_token_id in the
            # delay pattern's triangles (both C = 2048 in musicgen-small: one row past the codes). AUDIO_END (slot 0
            # after the last frame) reads the pad row too: MusicGen has no end id, its codebook 0 is pad there.
            special_rows = [_musicgen_row(audio_lm, name) for name in ("bos_token_id", "pad_token_id")]
            self.special_code_embed = nn.Parameter(
                torch.stack(
                    [
                        torch.stack([e.weight.detach()[r] for e in audio_lm.model.decoder.embed_tokens])
                        for r in special_rows
                    ]
                ).clone()
            )  # [2, K, d_audio]: [0] START's rows, [1] PAD's (and END's) rows, per codebook
            self.embed_adapter = nn.Linear(d_audio, d_llm, bias=False, device=dev, dtype=dt)  # trainable
            with torch.no_grad():  # scale so mapped code embeddings have the text embeddings' std
                sample = self.embed_adapter(codes[:: max(1, n_codes // 1024)])  # [<=1024, d_llm]
                self.embed_adapter.weight.mul_(text_std / max(float(sample.float().std()), 1e-8))
            self.special_embed = nn.Parameter(
                torch.randn(3, d_llm, device=dev, dtype=dt) * RANDOM_INIT_SCALE * text_std
            )  # [3, d_llm] START, END, PAD: trainable offsets on top of their MusicGen rows, zero at init
            with torch.no_grad():
                self.special_embed.zero_()  # (drawn first all the same: the RNG stream of later inits is unchanged)
        else:
            self.audio_embed = nn.Embedding(vocab.n_audio_ids, d_llm, device=dev, dtype=dt)
            nn.init.normal_(self.audio_embed.weight, std=RANDOM_INIT_SCALE * text_std)

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

    def _embed_audio(self, local: torch.Tensor) -> torch.Tensor:
        """local [N, J] audio ids minus text_vocab_size, in [0, K*C + 3) -> embeddings [N, D] (slots summed)."""
        if self.cfg.audio_embed_init == "musicgen":
            n_codes = self.vocab.n_codes
            is_code = local < n_codes  # [N, J]
            special = (local - n_codes).clamp(min=0)  # [N, J] 0 START, 1 END, 2 PAD where not a code
            code_vec = self.code_embed[local.clamp(max=n_codes - 1)] * is_code[..., None]  # [N, J, d_audio]
            # MusicGen's BOS / pad rows: slot k reads codebook k's (delay); flatten's one slot reads their sum, as
            # MusicGen's position 0 sums its K codebooks' BOS rows
            rows = self.special_code_embed
            if rows.shape[1] != local.shape[1]:
                rows = rows.sum(1, keepdim=True)  # [2, 1, d_audio]
            is_start = ((~is_code) & (special == 0))[..., None]  # [N, J, 1]
            is_pad = ((~is_code) & (special >= 1))[..., None]  # [N, J, 1] PAD, and END (MusicGen: pad)
            code_vec = code_vec + rows[0] * is_start + rows[1] * is_pad  # [N, J, d_audio]
            spec_vec = self.special_embed[special] * (~is_code)[..., None]  # [N, J, D]
            # The adapter is linear (no bias): summing the slots before or after it is the same.
            return self.embed_adapter(code_vec.sum(1)) + spec_vec.sum(1)  # [N, D]
        return self.audio_embed(local).sum(1)  # [N, J, D] -> [N, D]

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
