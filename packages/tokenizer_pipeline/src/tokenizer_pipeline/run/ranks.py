"""Where this process sits in a torchrun job, and how the ranks agree to stop together on a user error."""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

from ..errors import PipelineError
from ..shards.write_shards import ShardPlan

# A rank that finished its shards waits at the final barrier for the slowest rank (and rank 0 for the
# others while it hashes a large set): long enough for a full MusicCaps pass on one slow GPU.
DIST_TIMEOUT = timedelta(hours=12)


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in a torchrun job (a single process is rank 0 of 1)."""

    rank: int
    world_size: int
    local_rank: int  # GPU index on this node
    local_world_size: int  # ranks on this node (they share its CPU cores)

    @property
    def is_main(self) -> bool:
        return self.rank == 0  # rank 0 alone writes the manifest and prints the summary

    def owned(self, plans: list[ShardPlan]) -> list[ShardPlan]:
        """A contiguous, deterministic range of the plan: rank r gets plans[n*r//W : n*(r+1)//W]."""
        n = len(plans)
        return plans[n * self.rank // self.world_size : n * (self.rank + 1) // self.world_size]


def join_ranks(codec_device: str) -> RankInfo:
    """Read torchrun's environment; with WORLD_SIZE > 1 join the process group (nccl on GPUs, else gloo)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return RankInfo(0, 1, 0, 1)
    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])
    on_gpu = codec_device in ("auto", "cuda") and torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(local_rank)  # codec.device "cuda"/"auto" then means cuda:LOCAL_RANK
    if not dist.is_initialized():
        dist.init_process_group("nccl" if on_gpu else "gloo", timeout=DIST_TIMEOUT)
    return RankInfo(dist.get_rank(), dist.get_world_size(), local_rank, local_world_size(world))


def local_world_size(world: int) -> int:
    """Ranks on this node: torchrun's LOCAL_WORLD_SIZE, else every rank (workers per rank err towards fewer)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world))


def agree(ranks: RankInfo, error: str | None) -> None:
    """Every rank raises PipelineError if any rank had `error` (so none waits forever at a barrier); the ranks then
    leave the process group together, so each exits 2 with the one `error:` line rather than aborting."""
    if ranks.world_size > 1:
        import torch.distributed as dist

        errors: list[str | None] = [None] * ranks.world_size
        dist.all_gather_object(errors, error)
        error = next((e for e in errors if e), None)
        if error:
            dist.barrier()
            dist.destroy_process_group()
    if error:
        raise PipelineError(error)


def check_shared_out_dir(ranks: RankInfo, directory: Path, *, what: str, where: Path) -> None:
    """Every rank must see the file rank 0 writes into `directory` (before any encoding): every rank writes its shards
    and progress records under `where`, and rank 0 assembles the manifest from them. A node that sees another
    directory at that path (no shared filesystem) stops every rank with one line naming the fix."""
    if ranks.world_size == 1:
        return
    import torch.distributed as dist

    box: list[str | None] = [None]
    probe, error = None, None
    if ranks.is_main:
        token = secrets.token_hex(8)
        probe = directory / f".shared-{token}"
        try:
            probe.write_text(token)
            box = [token]
        except OSError as e:  # still broadcast: the other ranks wait for it
            error, box = f"cannot write into {directory}: {e}; check that {what}={where} is writable", [""]
    dist.broadcast_object_list(box, src=0)
    if box[0] and error is None:
        seen = directory / f".shared-{box[0]}"
        try:
            ok = seen.read_text() == box[0]
        except OSError:
            ok = False
        if not ok:
            error = (
                f"{what}={where} is not shared: rank {ranks.rank} on {socket.gethostname()} does not see the file "
                f"rank 0 wrote there ({seen.name}), and every rank writes its shards into it. Put {what} on a "
                f"filesystem every node mounts (NFS, Lustre, a shared volume), or encode on one node (torchrun "
                f"--nnodes=1) and copy the set out with python -m tokenizer_pipeline.push"
            )
    try:
        agree(ranks, error)
    finally:
        if probe is not None:
            probe.unlink(missing_ok=True)
