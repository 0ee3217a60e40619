"""The frozen music LM on the learning check's own targets: MusicGen alone (its null condition) and the teacher
(MusicGen reading the caption through its own T5: `encoder_hidden_states` / `encoder_attention_mask`).

Each eval row's audio part becomes what transformers' MusicGen reads there: AUDIO_START -> its BOS id, AUDIO_PAD and
AUDIO_END -> its pad id, code (k, c) in slot k -> c; its logits at audio position i predict position i + 1, so the
scored targets are exactly the adapter's code targets (AUDIO_END, which MusicGen has no id for, is left out). Only
the delay pattern has a MusicGen reading.
"""

from __future__ import annotations

import torch
from transformers import MusicgenForCausalLM

from adapter_trainer.data.token_layout import IGNORE_INDEX, AudioVocab, Batch


def music_lm_view(
    batch: Batch, vocab: AudioVocab, *, bos_id: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A delay-pattern batch -> what MusicGen reads and is scored on, one row per example.

    -> input_ids [B*K, A] MusicGen ids (A: the longest audio part, right-padded), labels [B, A, K] (IGNORE_INDEX
    where the adapter scores no code), where [B, A]: each position's index in the batch's sequence (-1 on padding).
    """
    tokens, labels, is_audio = batch.tokens, batch.labels, batch.is_audio & batch.attention_mask  # [B, S, K] x2, [B, S]
    B, S, K = tokens.shape
    if vocab.n_codebooks != K:
        raise ValueError(f"the music LM baseline reads the delay pattern (J = K = {vocab.n_codebooks}), got J = {K}")
    V, C = vocab.text_vocab_size, vocab.codebook_size
    n_audio = is_audio.sum(1)  # [B]
    A = int(n_audio.max()) if B else 0
    first = torch.where(n_audio > 0, is_audio.long().argmax(1), torch.zeros_like(n_audio))  # [B] AUDIO_START
    pos = first[:, None] + torch.arange(A, device=tokens.device)[None, :]  # [B, A]
    valid = torch.arange(A, device=tokens.device)[None, :] < n_audio[:, None]  # [B, A]
    pos = torch.where(valid, pos, torch.full_like(pos, -1))
    take = pos.clamp(min=0)[..., None].expand(B, A, K)  # [B, A, K]
    tok = tokens.gather(1, take) - V  # [B, A, K] local audio ids
    lab = labels.gather(1, take)  # [B, A, K]
    k_off = (torch.arange(K, device=tokens.device) * C)[None, None, :]  # [1, 1, K] codebook k's first id
    is_code = (tok >= k_off) & (tok < k_off + C)  # [B, A, K] slot k holds a code of codebook k
    start = tok == vocab.n_codes  # AUDIO_START
    ids = torch.where(
        is_code, tok - k_off, torch.where(start, torch.full_like(tok, bos_id), torch.full_like(tok, pad_id))
    )
    ids = torch.where(valid[..., None], ids, torch.full_like(ids, pad_id))  # [B, A, K]
    lab_local = lab - V - k_off  # [B, A, K]
    code_target = (lab != IGNORE_INDEX) & (lab_local >= 0) & (lab_local < C) & valid[..., None]
    out_labels = torch.where(code_target, lab_local, torch.full_like(lab_local, IGNORE_INDEX))  # [B, A, K]
    return ids.transpose(1, 2).reshape(B * K, A), out_labels, pos


@torch.no_grad()
def music_lm_ce_per_target(
    model: MusicgenForCausalLM,
    batch: Batch,
    vocab: AudioVocab,
    *,
    encoder_hidden_states: torch.Tensor | None = None,
    encoder_attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """[B, S, K] MusicGen's CE of each of the batch's code targets (0 where the adapter scores no code).

    encoder_hidden_states [B, T, d] / encoder_attention_mask [B, T]: each row's caption as the teacher conditions it
    (`MusicgenTeacher.condition`); None = MusicGen's null condition (no caption)."""
    cfg = model.config
    input_ids, labels, pos = music_lm_view(batch, vocab, bos_id=cfg.bos_token_id, pad_id=cfg.pad_token_id)
    B, A, K = labels.shape
    out = torch.zeros(batch.labels.shape, dtype=torch.float32, device=batch.labels.device)  # [B, S, K]
    if A == 0:
        return out
    hidden = model.model(
        input_ids=input_ids, encoder_hidden_states=encoder_hidden_states, encoder_attention_mask=encoder_attention_mask
    ).last_hidden_state  # [B, A, d]
    ce = torch.stack(
        [
            torch.nn.functional.cross_entropy(
                head(hidden).float().flatten(0, 1),
                labels[..., k].reshape(-1),
                ignore_index=IGNORE_INDEX,
                reduction="none",
            ).reshape(B, A)
            for k, head in enumerate(model.lm_heads)
        ],
        dim=-1,
    )  # [B, A, K]; 0 where ignored
    rows = torch.arange(B, device=pos.device)[:, None].expand(B, A)  # [B, A]
    keep = pos >= 0
    out[rows[keep], pos[keep]] = ce[keep]
    return out
