"""One optimizer step's forward + backward over an accumulation group (the `trainer.grad_accum` micro-batches of
one step), and the checks on its batches. The loop itself stays in `MoTAdapterRecipe.train`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from adapter_trainer.data.token_layout import IGNORE_INDEX, Batch
from adapter_trainer.training.distributed import RankInfo


def batch_facts(batch: Batch) -> dict[str, dict[str, Any]]:
    """dtype / requires_grad / grad_fn of each batch tensor (the recipe's invariant check; tests read it too)."""
    return {
        name: {
            "dtype": str(t.dtype),
            "requires_grad": bool(t.requires_grad),
            "has_grad_fn": t.grad_fn is not None,
            "is_floating_point": bool(t.is_floating_point()),
        }
        for name in ("tokens", "is_audio", "labels", "attention_mask")
        for t in [getattr(batch, name)]
    }


def check_plain_integer_batch(facts: dict[str, dict[str, Any]]) -> None:
    """Batches are plain integer tensors without autograd history; RuntimeError if not."""
    if any(f["requires_grad"] or f["has_grad_fn"] or f["is_floating_point"] for f in facts.values()):
        raise RuntimeError(f"batch tensors must be plain integer tensors without autograd history: {facts}")


def count_targets(batch: Batch) -> int:
    """Loss targets in a batch (codes + AUDIO_END), counted exactly as `MoTAdapterModel.compute_loss` counts them."""
    return int(((batch.labels != IGNORE_INDEX) & batch.is_audio[..., None]).sum())  # [B, S, J] -> []


def sequences_with_end(batch: Batch, end_id: int) -> int:
    """Sequences of a batch with an AUDIO_END target in their loss mask (call it on the CPU batch: no device sync)."""
    is_end = (batch.labels == end_id) & batch.is_audio[..., None]  # [B, S, J]
    return int(is_end.flatten(1).any(dim=1).sum())  # [B] -> []


def accum_group_targets(n_local: int, dist: RankInfo) -> int:
    """An accumulation group's targets summed over ranks: `backward_accum_group`'s n_targets, so the summed
    gradients are those of one process's big batch."""
    return int(dist.all_reduce_sum(torch.tensor([n_local], dtype=torch.long))[0])  # [1] on the host


@dataclass
class AccumGroupStats:
    """One accumulation group: the micro-batches of one optimizer step, on this rank."""

    loss: float  # summed CE over the group's targets / their number (token-weighted, not a mean of means)
    n_targets: int  # targets the loss was normalised by
    ce_sum_per_codebook: torch.Tensor  # [K] float64, code targets only
    count_per_codebook: torch.Tensor  # [K] long
    n_tokens: int  # non-pad input positions


def backward_accum_group(
    model: torch.nn.Module,
    micro_batches: list[Batch],
    *,
    autocast: Callable[[], contextlib.AbstractContextManager],
    scaler: torch.amp.GradScaler | None = None,
    n_targets: int | None = None,
    step: int = 0,
) -> AccumGroupStats:
    """Forward + backward every micro-batch; the gradients add up to those of ONE batch holding all of them: each
    loss is its summed CE / `n_targets` (default: the group's targets; all ranks' from `accum_group_targets`), so
    every target weighs the same whichever micro-batch it lands in."""
    n_targets = n_targets if n_targets is not None else sum(count_targets(b) for b in micro_batches)
    K = model.vocab.n_codebooks
    loss_sum = 0.0
    ce_k, n_k = torch.zeros(K, dtype=torch.float64), torch.zeros(K, dtype=torch.long)
    n_tok = 0
    for batch in micro_batches:
        with autocast():
            out = model.compute_loss(batch)  # LossOutput; out.loss: [] mean CE over this micro-batch's targets
        n_batch = out.count_per_codebook.sum() + out.end_count  # [] the targets out.loss is the mean over
        loss = out.loss * (n_batch / max(n_targets, 1))  # [] this micro-batch's summed CE / n_targets
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"non-finite loss {loss.item()} at step {step}; lower optimizer.lr, raise "
                f"optimizer.warmup_steps or use trainer.precision=fp32"
            )
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        loss_sum += loss.item()
        ce_k += out.ce_sum_per_codebook.detach().cpu().double()  # cast after the copy: MPS has no float64
        n_k += out.count_per_codebook.detach().cpu()
        n_tok += int(batch.attention_mask.sum())
    return AccumGroupStats(
        loss=loss_sum, n_targets=n_targets, ce_sum_per_codebook=ce_k, count_per_codebook=n_k, n_tokens=n_tok
    )


@dataclass(frozen=True)
class StepFigures:
    """One optimizer step's logged figures, summed over ranks."""

    loss: float
    n_tokens: int  # non-pad input positions
    sequences: int  # training sequences (examples)
    end_sequences: int  # those with an AUDIO_END target
    ce_sum_per_codebook: torch.Tensor  # [K] float64
    count_per_codebook: torch.Tensor  # [K] long


def sum_step_figures(group: AccumGroupStats, sequences: int, end_sequences: int, dist: RankInfo) -> StepFigures:
    """One step's logged figures summed over ranks (one small all-reduce; as they are in one process)."""
    ce_k, n_k = group.ce_sum_per_codebook, group.count_per_codebook  # [K] float64, [K] long
    if not dist.is_distributed:
        return StepFigures(group.loss, group.n_tokens, sequences, end_sequences, ce_k, n_k)
    K = ce_k.numel()
    head = torch.tensor([group.loss, group.n_tokens, sequences, end_sequences], dtype=torch.float64)
    stats = dist.all_reduce_sum(torch.cat([head, ce_k, n_k.double()]))  # [4 + 2K], host tensors
    n_tok, sequences, end_sequences = stats[1:4].long().tolist()
    return StepFigures(float(stats[0]), n_tok, sequences, end_sequences, stats[4 : 4 + K], stats[4 + K :].long())
