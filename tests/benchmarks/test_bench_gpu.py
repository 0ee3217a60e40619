"""`make bench-gpu` without CUDA: one line saying nothing was measured, exit 0, nothing written; with CUDA, a build/demo
of other DEMO_* settings stops it. And what the GPU run counts, checked on CPU: FLOPs of the CUDA-side attention ops
on meta tensors at cuda_1b shapes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parents[2]
NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # hides any GPU of the machine running the tests

# benchmarks/ is a directory of scripts, not a package: load the one script without touching sys.path
_spec = importlib.util.spec_from_file_location("bench_gpu", REPO / "benchmarks" / "bench_gpu.py")
bench_gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_gpu)

# cuda_1b's attention: batch 16, Llama 3.2 1B's 32 query / 8 key-value heads, seq 1024, head_dim 64
B, H, KV, S, HD = 16, 32, 8, 1024, 64


def fused_attention(kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The op F.scaled_dot_product_attention dispatches to on CUDA for each kernel, called as it calls it (causal)."""
    aten = torch.ops.aten
    if kernel == "cudnn":
        return aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True, False)[0]
    return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False)[0]


def meta(heads: int) -> torch.Tensor:
    return torch.empty(B, heads, S, HD, device="meta", dtype=torch.bfloat16, requires_grad=True)  # [B, h, S, hd]


@pytest.mark.parametrize("kernel", ["cudnn", "flash"])
def test_grouped_attention_flops_count_as_the_expanded_heads(kernel: str) -> None:
    """Un-expanded k/v (enable_gqa) as attend passes them at cuda_1b: torch's own counter asserts on the unequal heads
    (no MFU row ever got written); the bench's counter gives what torch counts for the same call on expanded k/v."""
    with pytest.raises(AssertionError, match="incompatible"), FlopCounterMode(display=False):
        fused_attention(kernel, meta(H), meta(KV), meta(KV))
    with bench_gpu.flop_counter() as grouped:
        fused_attention(kernel, meta(H), meta(KV), meta(KV)).sum().backward()
    with FlopCounterMode(display=False) as expanded:  # the reference: torch's formulas on H-head k/v
        fused_attention(kernel, meta(H), meta(H), meta(H)).sum().backward()
    assert grouped.get_total_flops() == expanded.get_total_flops()
    counts = {str(op): n for op, n in grouped.get_flop_counts()["Global"].items()}
    forward = counts[f"aten._scaled_dot_product_{kernel}_attention"]
    assert forward == 4 * B * H * S * S * HD  # QK^T and PV, 2 FLOPs per multiply-add, full S x S
    assert counts[f"aten._scaled_dot_product_{kernel}_attention_backward"] == 10 * B * H * S * S * HD


@pytest.mark.parametrize(
    "argv",
    [
        [sys.executable, str(REPO / "benchmarks/run_benchmarks.py"), "--device", "cuda"],
        [sys.executable, str(REPO / "benchmarks/run_benchmarks.py"), "--only", "gpu"],
        [sys.executable, str(REPO / "benchmarks/bench_gpu.py"), "--out", "gpu.json"],
    ],
    ids=["run_benchmarks --device cuda", "run_benchmarks --only gpu", "bench_gpu.py"],
)
def test_without_cuda_one_line_and_exit_0(argv: list[str], tmp_path: Path) -> None:
    r = subprocess.run(argv, cwd=tmp_path, env=NO_GPU, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and "nothing was measured" in lines[0], r.stdout
    assert list(tmp_path.iterdir()) == []  # no results file, no build/bench


def test_make_bench_gpu_without_cuda() -> None:
    r = subprocess.run(
        ["make", "-s", "bench-gpu", f"PY={sys.executable}"],
        cwd=REPO,
        env=NO_GPU,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 1 and "nothing was measured" in lines[0], r.stdout


def test_make_bench_gpu_stops_on_a_demo_build_of_other_settings(tmp_path: Path) -> None:
    """With CUDA, a build/demo of other DEMO_* settings (make demo-settings exits 2) stops bench-gpu before anything is
    measured on its old corpus; only a codec that fails to build is recorded and passed over. The interpreter is a
    stand-in that logs its arguments: CUDA "available", the settings check refusing."""
    calls = tmp_path / "calls.txt"
    fake_py = tmp_path / "python"
    fake_py.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{calls}"\n'
        'case "$*" in *--check-built*) echo "built with other settings" >&2; exit 2;; esac\n'
        "exit 0\n"
    )
    fake_py.chmod(0o755)
    r = subprocess.run(
        ["make", "-s", "bench-gpu", f"PY={fake_py}", f"DEMO={tmp_path / 'demo'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0, r.stdout
    assert "built with other settings" in r.stderr
    logged = calls.read_text()
    assert "--check-built" in logged
    assert "run_benchmarks.py" not in logged and "demo_codec" not in logged  # nothing measured, no codec built


def test_a_failed_flop_count_or_a_mispredicted_kernel_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    ok_kernels = {"train_unpadded": {"ran": ["cudnn"], "expected": ["cudnn"]}}
    good = {"flops": {"flops_per_position": 1.0}, "peak_bf16_flops": 989e12, "device": "H100",
            "train": [{"batch_size": 1, "mfu": 0.4}], "kernels": ok_kernels}  # fmt: skip
    monkeypatch.setattr(bench_gpu, "DEV", torch.device("cuda"))  # the checks a GPU run makes (nothing runs on it)
    assert bench_gpu.run_failures(good) == []
    failed = {**good, "flops": {"error": "AssertionError: sdpa_flop_count"}, "train": [{"batch_size": 1}]}
    assert "FLOP count failed" in bench_gpu.run_failures(failed)[0]
    no_mfu = {**good, "train": [{"batch_size": 1}]}
    assert "without MFU" in bench_gpu.run_failures(no_mfu)[0]
    wrong = {**good, "kernels": {"decode_left_padded_cache": {"ran": ["mem_efficient"], "expected": ["cudnn"]}}}
    assert "predict" in bench_gpu.run_failures(wrong)[0]
