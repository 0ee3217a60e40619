"""`make bench-gpu` without CUDA: one line saying nothing was measured, exit 0, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # hides any GPU of the machine running the tests


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
