"""The training loss of the MoT adapter: cross-entropy on audio targets only (codes and AUDIO_END).

`compute_loss(model, batch)` runs the trunk, then the audio heads only where there is a target, and returns the
mean CE with detached per-codebook, per-example and per-cell sums (the learning check's figures). Both towers are a
`LossModel`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from adapter_trainer.data.token_layout import IGNORE_INDEX, AudioVocab, Batch


class LossModel(Protocol):
    """What `compute_loss` needs of a model: its token layout, its trunk and its audio heads."""

    vocab: AudioVocab
    pattern: str  # token_layout's codebook pattern: "delay" (K heads) or "flatten" (one head)
    head_size: int  # logits per head

    def hidden_states(
        self, tokens: torch.Tensor, is_audio: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor: ...  # [B, S, J], [B, S], [B, S] -> final-normed h [B, S, D]

    def audio_logits(self, h: torch.Tensor) -> torch.Tensor: ...  # [N, D] -> [N, H, head_size]


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


def local_targets(labels: torch.Tensor, vocab: AudioVocab, pattern: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Global label ids [..., J] -> (head-local targets [..., J] with IGNORE_INDEX kept, codebook [..., J]).

    codebook is k for code targets, -1 for AUDIO_END and ignored targets.
    """
    V, C, K = vocab.text_vocab_size, vocab.codebook_size, vocab.n_codebooks
    rel = labels - V  # [..., J]
    is_end = labels == vocab.audio_end
    is_code = (rel >= 0) & (rel < K * C)
    ignored = labels == IGNORE_INDEX
    if bool((~(is_end | is_code | ignored)).any()):
        raise ValueError("labels must be code ids, AUDIO_END or IGNORE_INDEX (text/START/PAD never are targets)")
    book = torch.where(is_code, rel // C, torch.full_like(rel, -1))  # [..., J]
    if pattern == "delay":
        slot = torch.arange(K, device=labels.device)
        if bool((is_code & (book != slot)).any()):
            raise ValueError("delay labels: slot k must hold codes of codebook k (see token_layout.DelayPattern)")
        local = torch.where(is_code, rel - book * C, torch.full_like(rel, C))  # [..., K]; END -> C
    else:
        local = torch.where(is_code, rel, torch.full_like(rel, K * C))  # [..., 1]; END -> K*C
    local = torch.where(ignored, torch.full_like(local, IGNORE_INDEX), local)
    return local, book


def compute_loss(model: LossModel, batch: Batch) -> LossOutput:
    """CE over code and AUDIO_END targets of a token_layout.Batch (tokens/labels [B, S, J], is_audio [B, S]).

    Heads run only on positions that have a target, so text positions never produce logits.
    """
    tokens, is_audio, labels = batch.tokens, batch.is_audio, batch.labels
    B, S, J = labels.shape
    K = model.vocab.n_codebooks
    # The loss mask is the audio positions: a label at a text position (token_layout never writes one) is ignored.
    labels = torch.where(is_audio[..., None], labels, torch.full_like(labels, IGNORE_INDEX))  # [B, S, J]
    has_label = (labels != IGNORE_INDEX).any(-1)  # [B, S]
    h = model.hidden_states(tokens, is_audio, batch.attention_mask)  # [B, S, D]
    idx = has_label.reshape(-1).nonzero().squeeze(1)  # [N]
    logits = model.audio_logits(h.reshape(B * S, -1).index_select(0, idx)).float()  # [N, H, size]
    rows = labels.reshape(B * S, J).index_select(0, idx)  # [N, J] the labels of those positions
    local, book = local_targets(rows, model.vocab, model.pattern)  # [N, J], [N, J]
    ce = F.cross_entropy(
        logits.reshape(-1, model.head_size), local.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
    ).reshape(local.shape)  # [N*J] -> [N, J]
    valid = local != IGNORE_INDEX  # [N, J]
    is_code = book >= 0  # [N, J]
    is_end = valid & ~is_code
    n_valid = valid.sum()
    loss = (ce * valid).sum() / n_valid.clamp(min=1)  # [] mean CE over the targets (0 with a graph when none)

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
