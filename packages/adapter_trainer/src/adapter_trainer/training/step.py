"""One optimizer step's forward + backward over an accumulation window, and the checks on its batches.

`backward_window` is the inner loop of `MoTAdapterRecipe.train`: the loop itself (fetch, all-reduce, clip, step,
log) stays in the recipe so it reads top to bottom; this is the part tests drive directly.
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
        for name, t in (
            ("tokens", batch.tokens),
            ("is_audio", batch.is_audio),
            ("labels", batch.labels),
            ("attention_mask", batch.attention_mask),
        )
    }


def check_plain_integer_batch(facts: dict[str, dict[str, Any]]) -> None:
    """Batches are plain integer tensors without autograd history: the design that cured "Trying to backward
    through the graph a second time" (codes used to come out of a live codec graph). Raises RuntimeError if not."""
    if any(f["requires_grad"] or f["has_grad_fn"] or f["is_floating_point"] for f in facts.values()):
        raise RuntimeError(f"batch tensors must be plain integer tensors without autograd history: {facts}")


def count_targets(batch: Batch) -> int:
    """Loss targets in a batch (codes + AUDIO_END), counted exactly as `MoTAdapterModel.compute_loss` counts them."""
    return int(((batch.labels != IGNORE_INDEX) & batch.is_audio[..., None]).sum())  # [B, S, J] -> []


def windows_with_end(batch: Batch, end_id: int) -> int:
    """Windows (examples) of a batch with an AUDIO_END target in their loss mask, as compute_loss masks targets.
    Call it on the loader's CPU batch: the count then costs no device sync."""
    is_end = (batch.labels == end_id) & batch.is_audio[..., None]  # [B, S, J]
    return int(is_end.flatten(1).any(dim=1).sum())  # [B] -> []


def window_targets(n_local: int, dist: RankInfo) -> int:
    """The targets of an accumulation window summed over ranks: the loss's normaliser (`backward_window`'s n_window),
    so the summed gradients are exactly those of one process's big batch. `n_local`: this rank's targets, counted
    with `count_targets` on the loader's CPU batches (no device sync)."""
    return int(dist.all_reduce_sum(torch.tensor([n_local], dtype=torch.long))[0])  # [1] on the host


@dataclass
class WindowStats:
    """One accumulation window (all micro-batches of one optimizer step)."""

    loss: float  # summed CE over the window's targets / their number (token-weighted, not a mean of means)
    n_targets: int  # targets the loss was normalised by
    ce_sum_per_codebook: torch.Tensor  # [K] float64, code targets only
    count_per_codebook: torch.Tensor  # [K] long
    n_tokens: int  # non-pad input positions


def backward_window(
    model: torch.nn.Module,
    batches: list[Batch],
    *,
    autocast: Callable[[], contextlib.AbstractContextManager],
    scaler: torch.amp.GradScaler | None = None,
    n_window: int | None = None,
    step: int = 0,
) -> WindowStats:
    """Forward + backward every micro-batch; the gradients add up to those of ONE batch holding all of them.

    Each micro-batch's loss is its summed CE / `n_window` (default: the targets in `batches`), so a target weighs
    the same whether its clip is short or long and whichever micro-batch it lands in (a mean of micro-batch means
    would weigh the targets of short clips more). Pass `n_window` to normalise by a larger count (e.g. all ranks').
    """
    n_window = n_window if n_window is not None else sum(count_targets(b) for b in batches)
    K = model.vocab.n_codebooks
    loss_sum = 0.0
    ce_k, n_k = torch.zeros(K, dtype=torch.float64), torch.zeros(K, dtype=torch.long)
    n_tok = 0
    for batch in batches:
        with autocast():
            out = model.compute_loss(batch)  # LossOutput; out.loss: [] mean CE over this micro-batch's targets
        n_batch = out.count_per_codebook.sum() + out.end_count  # [] the targets out.loss is the mean over
        loss = out.loss * (n_batch / max(n_window, 1))  # [] this micro-batch's summed CE / n_window
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
    return WindowStats(
        loss=loss_sum, n_targets=n_window, ce_sum_per_codebook=ce_k, count_per_codebook=n_k, n_tokens=n_tok
    )


def sum_step_figures(
    window: WindowStats, windows: int, end_windows: int, dist: RankInfo
) -> tuple[float, int, int, int, torch.Tensor, torch.Tensor]:
    """One step's logged figures summed over ranks (one small all-reduce; as they are in one process).

    Returns (loss, input tokens, windows, windows with an AUDIO_END target, CE sums [K] float64, counts [K] long).
    """
    ce_k, n_k = window.ce_sum_per_codebook, window.count_per_codebook  # [K] float64, [K] long
    if not dist.is_distributed:
        return window.loss, window.n_tokens, windows, end_windows, ce_k, n_k
    K = ce_k.numel()
    head = torch.tensor([window.loss, window.n_tokens, windows, end_windows], dtype=torch.float64)
    stats = dist.all_reduce_sum(torch.cat([head, ce_k, n_k.double()]))  # [4 + 2K], host tensors
    n_tok, windows, end_windows = stats[1:4].long().tolist()
    return float(stats[0]), n_tok, windows, end_windows, stats[4 : 4 + K], stats[4 + K :].long()
