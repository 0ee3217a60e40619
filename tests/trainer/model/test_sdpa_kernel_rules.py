"""torch 2.11's CUDA kernel choice (model/sdpa_kernels.py) for the calls attend makes, and the CPU dress rehearsal:
every sdpa call of a training step, a prefill and a decoding step under bf16 autocast, with the kernel CUDA would run.

The rules restate sdp_utils.cpp (torch's own can_use_* need a CUDA device); the cases below are the ones its source
decides explicitly: cuDNN first on sm90 with cuDNN > 9.15 and fp16/bf16 only, flash without a mask, the
memory-efficient kernel without enable_gqa. `make bench-gpu` checks the prediction against the profiler on a GPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from adapter_trainer.data.token_layout import Batch, collate
from adapter_trainer.model.mot import MoTKVCache
from adapter_trainer.model.sdpa_kernels import A100, H100, Call, Device, expected_kernel
from tests.trainer.helpers import example, tiny_mot

BF16, FP32 = torch.bfloat16, torch.float32
B, H, KV, S, HD = 16, 32, 8, 1024, 64  # cuda_1b: batch 16, Llama 3.2 1B heads, seq 1024
TRAIN = Call((B, H, S, HD), (B, KV, S, HD), BF16, None, is_causal=True, enable_gqa=True)  # unpadded / right-padded
LEFT_EXPANDED = Call((B, H, S, HD), (B, H, S, HD), BF16, (B, 1, S, S))  # left padding, k/v x4
LEFT_GROUPED = Call((B, H, S, HD), (B, KV, S, HD), BF16, (B, 1, S, S), enable_gqa=True)
STEP = Call((B, H, 1, HD), (B, KV, S, HD), BF16, None, enable_gqa=True)  # one query, no pad in the cache
STEP_FOLDED = Call((B, KV, H // KV, HD), (B, KV, S, HD), BF16, (B, 1, 1, S))  # one query, pads: groups folded


@pytest.mark.parametrize(
    "call,h100,a100",
    [
        (TRAIN, "cudnn", "flash"),
        (LEFT_EXPANDED, "cudnn", "mem_efficient"),
        (LEFT_GROUPED, "cudnn", "math"),  # why attend expands k/v off cuDNN: mem-efficient rejects enable_gqa
        (STEP, "cudnn", "flash"),
        (STEP_FOLDED, "cudnn", "mem_efficient"),
    ],
    ids=["train", "left-expanded", "left-grouped", "step", "step-folded"],
)
def test_cuda_1b_calls_run_cudnn_on_h100_and_flash_or_mem_efficient_on_a100(call, h100, a100) -> None:
    assert expected_kernel(call, H100) == h100
    assert expected_kernel(call, A100) == a100


def test_what_cudnn_rejects() -> None:
    fp32 = Call(TRAIN.q_shape, TRAIN.kv_shape, FP32, None, True, enable_gqa=True)
    assert expected_kernel(fp32, H100) == "math"  # fp32 + grouped k/v: no fused kernel takes it
    assert expected_kernel(Call((B, H, S, HD), (B, H, S, HD), FP32, (B, 1, S, S)), H100) == "mem_efficient"
    old_cudnn = Device((9, 0), 91400)  # cuDNN <= 9.15: not preferred, the default order
    assert expected_kernel(TRAIN, old_cudnn) == "flash"
    assert expected_kernel(Call((B, H, 1, HD), (B, KV, 1, HD), BF16, None, enable_gqa=True), H100) == "flash"  # S_k 1
    assert expected_kernel(TRAIN, Device((9, 0), 91900, cudnn_deprioritized=True)) == "flash"


def recorded_calls(monkeypatch: pytest.MonkeyPatch, run) -> list[Call]:
    real, calls = F.scaled_dot_product_attention, []

    def spy(*args, **kwargs):
        calls.append(Call.of(*args, **kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    run()
    monkeypatch.undo()
    assert calls
    return calls


@pytest.mark.parametrize("padding", ["none", "right", "left"])
def test_dress_rehearsal_every_call_of_a_bf16_step_and_generation_is_fused_on_cuda(
    monkeypatch: pytest.MonkeyPatch, padding: str
) -> None:
    """The tiny model (4 query / 2 key-value heads, head_dim 16) as cuda_1b runs it: bf16 autocast, a training step
    and a prefill + two decoding steps. On an H100 every call runs cuDNN; on an A100 none runs math."""
    model, vocab = tiny_mot("delay")
    if padding == "none":
        batch = collate([example(vocab, 5, 6, seed=1)] * 2, pad_id=0)
    else:
        batch = collate([example(vocab, 5, 6, seed=1), example(vocab, 3, 4, seed=2)], pad_id=0)  # right-padded
    if padding == "left":
        shift = [int(batch.attention_mask[r].sum()) for r in range(2)]
        roll = lambda t: torch.stack([t[r].roll(-shift[r], 0) for r in range(2)])
        batch = Batch(
            *(roll(t) for t in (batch.tokens, batch.is_audio, batch.labels, batch.attention_mask)), batch.keys
        )
    n = batch.tokens.shape[1]

    def train() -> None:
        model.train()
        with torch.autocast("cpu", dtype=BF16):
            model.compute_loss(batch).loss.backward()

    def generate() -> None:
        model.eval()
        with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
            _, cache = model.forward_step(
                batch.tokens[:, : n - 2], batch.is_audio[:, : n - 2], batch.attention_mask[:, : n - 2],
                MoTKVCache.allocate(n),
            )  # fmt: skip
            for p in (n - 2, n - 1):
                model.decode_step(batch.tokens[:, p : p + 1], batch.attention_mask[:, : p + 1], cache)

    for run in (train, generate):
        calls = recorded_calls(monkeypatch, run)
        assert {expected_kernel(c, H100) for c in calls} == {"cudnn"}, calls
        assert "math" not in {expected_kernel(c, A100) for c in calls}, calls
