"""live_memory.LiveTensorBytes: the bytes of tensors a region allocates, their peak, and what checkpointing saves."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

# benchmarks/ is a directory of scripts, not a package: load the one script without touching sys.path
_spec = importlib.util.spec_from_file_location(
    "live_memory", Path(__file__).resolve().parents[2] / "benchmarks" / "live_memory.py"
)
live_memory = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(live_memory)
LiveTensorBytes = live_memory.LiveTensorBytes


def test_counts_new_storages_until_freed_and_not_views_or_in_place_results() -> None:
    before = torch.zeros(1000)  # made outside: never counted, nor are its views
    with LiveTensorBytes() as m:
        a = torch.empty(1000, dtype=torch.float32)  # 4000 bytes
        a.add_(1.0)  # in place: no new memory
        views = a.view(10, 100), before.view(10, 100), before[:10]  # views share their base's storage
        assert m.live_bytes == 4000
        c = torch.empty(500, dtype=torch.float64)  # +4000 -> 8000 (the peak)
        del c  # freed -> 4000
        d = torch.ones(250, dtype=torch.int8)  # +250
        assert m.live_bytes == 4250
    assert m.peak_bytes == 8000
    del a, d, views
    assert m.live_bytes == 0  # frees after the region are still seen


def test_gradients_of_the_given_parameters_are_counted_apart() -> None:
    w = nn.Parameter(torch.randn(256, 256))  # 256 KiB of fp32
    x = torch.randn(64, 256)
    with LiveTensorBytes(grads_of=[w]) as m:
        loss = (x @ w).relu().sum()  # x @ w [64, 256] freed once relu ran; relu's output (64 KiB) kept for backward
        assert m.live_bytes == 64 * 256 * 4 + 4  # + the fp32 loss
        loss.backward()
        del loss
    assert m.grad_bytes == w.grad.nbytes == 256 * 256 * 4
    assert m.live_bytes == 0  # the activations went with the graph; w.grad is counted in grad_bytes only


class Stack(nn.Module):
    """n blocks of Linear -> GELU -> Linear on [B, D]; `recompute` checkpoints each block."""

    def __init__(self, n: int, d: int, recompute: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(n)
        )
        self.recompute = recompute

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [B, D] -> [B, D]
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=False) if self.recompute else block(h)
        return h


def activation_peak(recompute: bool, n: int = 8, batch: int = 256, d: int = 64) -> int:
    torch.manual_seed(0)
    model = Stack(n, d, recompute)
    x = torch.randn(batch, d)
    with LiveTensorBytes(grads_of=model.parameters()) as m:
        model(x).square().mean().backward()
    return m.peak_bytes


def test_checkpointing_keeps_one_block_input_per_block_instead_of_its_activations() -> None:
    # Without: each block keeps [B, 4D] twice (Linear out, GELU out) for backward, 8 x [B, D] per block.
    # With: each block keeps its input [B, D] and recomputes one block at a time in backward.
    off, on = activation_peak(False), activation_peak(True)
    block_in = 256 * 64 * 4  # [B, D] fp32
    assert off >= 8 * (2 * 4 * block_in)  # the 8 blocks' [B, 4D] pairs are all alive at the end of forward
    assert on < off / 2
    assert on < 8 * block_in + 2 * (2 * 4 * block_in) + 8 * block_in  # inputs + ~one block recomputed + grads
