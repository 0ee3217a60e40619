"""bench_memory.py's memory model: the least-squares fit and the what-fits table (no model is built here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

# benchmarks/ is a directory of scripts, not a package: load the one script without touching sys.path
_spec = importlib.util.spec_from_file_location(
    "bench_memory", Path(__file__).resolve().parents[2] / "benchmarks" / "bench_memory.py"
)
bench_memory = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_memory)

GIB = 2**30


def rows(fixed_gb: float, bpp: float) -> list[dict]:
    return [
        {"positions": b * s, "peak_rss_gb": (fixed_gb * GIB + bpp * b * s) / GIB} for b in (1, 2) for s in (512, 1024)
    ]


def test_fit_recovers_fixed_part_and_bytes_per_position() -> None:
    f = bench_memory.fit(rows(7.0, 1.5e6))
    assert f["fixed_gb"] == pytest.approx(7.0, rel=1e-9)
    assert f["bytes_per_position"] == pytest.approx(1.5e6, rel=1e-9)
    assert f["max_residual_gb"] < 1e-9
    with pytest.raises(ValueError, match="two different"):
        bench_memory.fit(rows(7.0, 1.5e6)[:1])


def test_fits_table_gives_the_largest_batch_that_fits() -> None:
    # 24 GiB - 8 GiB fixed = 16 GiB; at 2 MiB/position and seq 1024 that is 8 sequences, at seq 512 16
    fits = {("fp32", False): {"fixed_gb": 8.0, "bytes_per_position": 2 * 2**20}}
    table = bench_memory.fits_table(fits, {"mps_small": "fp32"}, [512, 1024])
    row = next(line for line in table.splitlines() if line.startswith("| mps_small"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "off" and cells[2:4] == ["16", "8"]  # 24 GiB: seq 512, seq 1024
