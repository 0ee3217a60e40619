"""The frozen music LM on the learning check's own targets: "how much does the adapter add to MusicGen?"

Two readings: MusicGen alone (its null condition: no encoder states, which equals zero cross-attention input with
mask 0) and MusicGen as it ships, reading the caption through its own T5 encoder and projection (the teacher,
model/teacher.py: pass `encoder_hidden_states` / `encoder_attention_mask`). Each eval row's audio part (AUDIO_START onwards)
is what transformers' MusicGen reads at those positions: AUDIO_START -> its decoder-start (BOS) id (position 0, every codebook;
the same id, 2048, as its pad id in every MusicGen config, which build_delay_pattern_mask writes there),
AUDIO_PAD -> its pad id (the delay pattern's triangles), code (k, c) in slot k -> c, and AUDIO_END -> its pad id (it
has no end token; a sequence it stops is pad from there on). Its logits at audio position i predict position i + 1,
as the adapter's labels do, so the scored targets are exactly the adapter's code targets; AUDIO_END targets, which
MusicGen has no id for, are left out of both (the report's CE counts code targets only). MusicGen's positions start at
0 on AUDIO_START: the caption before it does not exist for it.

Only the delay pattern has a MusicGen reading (flatten interleaves codebooks MusicGen never saw in that order).
"""

from __future__ import annotations

import torch
from transformers import MusicgenForCausalLM

from adapter_trainer.data.token_layout import IGNORE_INDEX, AudioVocab, Batch


def music_lm_view(
    batch: Batch, vocab: AudioVocab, *, bos_id: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A delay-pattern batch -> what MusicGen reads and is scored on, one row per example.

    Returns:
        input_ids [B*K, A] MusicGen ids (A = the longest audio part; shorter rows right-padded with pad_id),
        labels [B, A, K] raw code targets, IGNORE_INDEX where the adapter scores no code,
        where [B, A] long: each audio position's index in the batch's sequence (-1 on padding), to put per-target
        values back in the batch's [B, S, K] layout.
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
