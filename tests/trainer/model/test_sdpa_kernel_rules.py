"""torch 2.11's CUDA kernel choice (model/sdpa_kernels.py) for the calls attend makes, and the CPU dress rehearsal:
every sdpa call of a training step, a prefill and a decoding step under bf16 autocast, with the kernel CUDA would run.

The rules restate sdp_utils.cpp (torch's own can_use_* need a CUDA device); the cases below are the ones its source
decides explicitly: cuDNN first on sm90 with cuDNN > 9.15 and fp16/bf16 only, flash without a mask, the
memory-efficient kernel without enable_gqa. `make bench-gpu` checks the prediction against the profiler on a GPU.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from adapter_trainer.data.token_layout import Batch, collate
from adapter_trainer.model.kv_cache import MoTKVCache
from adapter_trainer.model.sdpa_kernels import A100, H100, Call, Device, expected_kernel
from tests.trainer.helpers import example, tiny_mot

REPO = Path(__file__).resolve().parents[3]
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


def padded_batch(vocab, padding: str, long: tuple[int, int], short: tuple[int, int]) -> Batch:
    """Two rows: the same (caption, frames) example twice ("none"), or a `long` and a `short` one, right-padded
    ("right") or rolled to be left-padded ("left")."""
    if padding == "none":
        return collate([example(vocab, *long, seed=1)] * 2, pad_id=0)
    batch = collate([example(vocab, *long, seed=1), example(vocab, *short, seed=2)], pad_id=0)  # right-padded
    if padding == "left":
        shift = [int(batch.attention_mask[r].sum()) for r in range(2)]
        roll = lambda t: torch.stack([t[r].roll(-shift[r], 0) for r in range(2)])
        batch = Batch(
            *(roll(t) for t in (batch.tokens, batch.is_audio, batch.labels, batch.attention_mask)), batch.keys
        )
    return batch


def rehearsal_calls(monkeypatch: pytest.MonkeyPatch, model, batch: Batch) -> dict[str, list[Call]]:
    """Every sdpa call of a bf16-autocast training step (forward + backward) and of a prefill + two decoding steps."""
    n = batch.tokens.shape[1]

    def train() -> None:
        model.train()
        with torch.autocast("cpu", dtype=BF16):
            model.compute_loss(batch).loss.backward()
        model.zero_grad(set_to_none=True)

    def generate() -> None:
        model.eval()
        with torch.no_grad(), torch.autocast("cpu", dtype=BF16):
            _, cache = model.forward_step(
                batch.tokens[:, : n - 2], batch.is_audio[:, : n - 2], batch.attention_mask[:, : n - 2],
                MoTKVCache.allocate(n),
            )  # fmt: skip
            # a decoding step feeds every row one audio id at a real position (as the sampler does): the long row's
            # frame, so a right-padded row's pad is never fed to decode_step (which takes audio ids only)
            B = batch.tokens.shape[0]
            for p in (n - 2, n - 1):
                step = batch.tokens[:1, p : p + 1].expand(B, -1, -1)  # [B, 1, J]
                mask = torch.cat([batch.attention_mask[:, :p], torch.ones(B, 1, dtype=torch.bool)], dim=1)
                model.decode_step(step, mask, cache)  # [B, p + 1] mask: the past as it was, the new position real

    return {"train": recorded_calls(monkeypatch, train), "generate": recorded_calls(monkeypatch, generate)}


def assert_fused_on_cuda(calls: dict[str, list[Call]]) -> None:
    for run_calls in calls.values():
        assert {expected_kernel(c, H100) for c in run_calls} == {"cudnn"}, run_calls
        assert "math" not in {expected_kernel(c, A100) for c in run_calls}, run_calls


@pytest.mark.parametrize("padding", ["none", "right", "left"])
def test_dress_rehearsal_every_call_of_a_bf16_step_and_generation_is_fused_on_cuda(
    monkeypatch: pytest.MonkeyPatch, padding: str
) -> None:
    """The tiny model (4 query / 2 key-value heads, head_dim 16) as cuda_1b runs it: bf16 autocast, a training step
    and a prefill + two decoding steps. On an H100 every call runs cuDNN; on an A100 none runs math."""
    model, vocab = tiny_mot("delay")
    assert_fused_on_cuda(rehearsal_calls(monkeypatch, model, padded_batch(vocab, padding, (5, 6), (3, 4))))


@pytest.fixture(scope="module")
def cuda_1b_realsize():
    """cuda_1b's model at real size: Llama 3.2 1B + MusicGen-small dims, random weights built from configs offline by
    the benchmarks' builder (benchmarks/realsize_model.py), cuda_1b's MoT settings, on CPU. ~6 GB in fp32."""
    spec = importlib.util.spec_from_file_location("realsize_model", REPO / "benchmarks" / "realsize_model.py")
    realsize = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(realsize)  # benchmarks/ is a directory of scripts: no sys.path change
    cfg = realsize.preset_config("cuda_1b", "trainer.device=cpu")
    assert cfg.trainer.precision == "bf16"  # the autocast dtype rehearsal_calls uses
    torch.manual_seed(0)
    model, vocab = realsize.build_model(cfg, "real", "cpu")
    yield model, vocab
    del model


@pytest.mark.slow
@pytest.mark.parametrize("padding", ["none", "right", "left"])
def test_realsize_dress_rehearsal_every_call_of_a_bf16_step_and_generation_is_fused_on_cuda(
    monkeypatch: pytest.MonkeyPatch, cuda_1b_realsize, padding: str
) -> None:
    """The tiny dress rehearsal at cuda_1b's real architecture (32 query / 8 key-value heads, head_dim 64, 16 layers)
    at a short sequence (batch 2, ~25 positions): on an H100 every call runs cuDNN; on an A100 none runs math."""
    model, vocab = cuda_1b_realsize
    batch = padded_batch(vocab, padding, (6, 8), (4, 5))
    calls = rehearsal_calls(monkeypatch, model, batch)
    for run_calls in calls.values():
        for c in run_calls:  # the real head counts: cannot pass on a tiny model
            assert c.q_shape[3] == c.kv_shape[3] == HD, c
            folded = c.q_shape[1:3] == (KV, H // KV)  # a decoding step with pads: q groups folded
            assert c.q_shape[1] == H or folded, c
            assert c.kv_shape[1] in (KV, H), c
    # the cache holds the real 8 key-value heads (grouped, or folded in a decoding step with pads; a masked prefill
    # on CPU expands them to 32, on CUDA sdpa_kernels keeps them grouped where cuDNN runs)
    assert any(c.kv_shape[1] == KV for c in calls["generate"]), calls["generate"]
    assert_fused_on_cuda(calls)
