"""torch.distributed for the recipe: init/teardown under torchrun, rank helpers, and the few collectives it uses.

Without torchrun's environment everything is a no-op for one process, so the recipe has one code path. Only the
trainable gradients are reduced, by one flattened all-reduce per optimizer step, not with DDP: DDP would wrap the
whole model (broadcasting the frozen towers) and needs `no_sync()` for gradient accumulation.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from adapter_trainer.config import ConfigError


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the torchrun job, with the collectives the recipe uses (identity for one process)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0  # device index on this node
    local_world_size: int = 1  # ranks on this node (they share its CPU cores)

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes logs, checkpoints, plots and prints the report."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    def run_on_main(self, fn: Callable[[], None]) -> None:
        """Run `fn` on rank 0 alone; an exception it raises is raised on every rank."""
        error: Exception | None = None
        if self.is_main:
            try:
                fn()
            except Exception as e:  # re-raised just below, on every rank
                error = e
        error = self.broadcast_object(error)
        if error is not None:
            raise error

    def barrier(self) -> None:
        if self.is_distributed:
            dist.barrier()

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum of the HOST tensor `t` over ranks, as a host tensor (float64 exists there on every backend)."""
        if not self.is_distributed:
            return t
        if dist.get_backend() == "nccl":
            on_gpu = t.to(torch.device("cuda", torch.cuda.current_device()))
            dist.all_reduce(on_gpu, op=dist.ReduceOp.SUM)
            return on_gpu.cpu()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def all_gather_object(self, obj: Any) -> list[Any]:
        """[obj of rank 0, obj of rank 1, ...] on every rank (pickled; for small eval summaries)."""
        if not self.is_distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (e.g. the output dir, which Hydra's ${now:...} may resolve per rank)."""
        if not self.is_distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast_params(self, params: list[torch.Tensor]) -> None:
        """Copy rank 0's values of `params` (the trainable ones) to every rank."""
        if not self.is_distributed or not params:
            return
        flat = torch.cat([p.detach().reshape(-1) for p in params])  # [P]
        dist.broadcast(flat, src=0)
        _unflatten_into(flat, params)

    def all_reduce_grads(self, params: list[torch.Tensor]) -> None:
        """SUM the gradients of `params` over ranks in one flattened all-reduce (None grads count as zero): each
        rank's loss is already divided by the global target count, so the sum is the one-process gradient."""
        if not self.is_distributed or not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])  # [P]
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        for p, g in zip(params, grads):
            if p.grad is None:
                p.grad = g
        _unflatten_into(flat, [p.grad for p in params])


def _unflatten_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy consecutive slices of flat [P] back into `tensors` (their shapes, in order)."""
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n


def device_for_rank(device: torch.device, info: RankInfo) -> torch.device:
    """Under torchrun on CUDA every rank takes cuda:LOCAL_RANK (an explicit cuda:N is only for one process)."""
    if info.is_distributed and device.type == "cuda":
        n = torch.cuda.device_count()
        if info.local_rank >= n:
            raise RuntimeError(
                f"LOCAL_RANK={info.local_rank} but this node has {n} CUDA device(s); launch torchrun "
                f"with --nproc_per_node={n} or fewer"
            )
        torch.cuda.set_device(info.local_rank)
        return torch.device("cuda", info.local_rank)
    return device


def local_world_size(world: int) -> int:
    """Ranks on this node: LOCAL_WORLD_SIZE, else all of them (workers are sized by it: this errs towards fewer)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world))


def init_distributed(device: torch.device, timeout_s: float = 1800.0) -> RankInfo:
    """Join the torchrun job (NCCL on CUDA, gloo otherwise) when WORLD_SIZE > 1; else a one-process RankInfo."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return RankInfo()
    if device.type == "mps":
        raise ConfigError(
            f"torchrun with trainer.device=mps (WORLD_SIZE={world}): a Mac has one GPU, and gloo cannot reduce MPS "
            f"tensors; run one process (python -m adapter_trainer ...), or trainer.device=cpu under torchrun"
        )
    info = RankInfo(
        rank=int(os.environ.get("RANK", "0")),
        world_size=world,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        local_world_size=local_world_size(world),
    )
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    return info


def teardown_distributed() -> None:
    """Destroy the process group if this process created one (safe to call always)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
