"""bench_memory.py: the least-squares fit, the what-fits table, merging cases, the summary, and one tiny case."""

from __future__ import annotations

import importlib.util
import types
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


def case(recompute: bool, batch: int = 2, seq: int = 1024, **measured: float) -> dict:
    """A real-size fp32 case row as measure() writes it, with the `measured` figures (GiB)."""
    key = {"dims": "real", "mode": "fp32", "batch": batch, "seq": seq, "recompute": recompute}
    return {"stage": "realsize_memory", **key, "positions": batch * seq, **measured}


def test_merge_replaces_the_cases_run_again_and_keeps_the_others() -> None:
    old = [case(r, b, s, peak_rss_gb=1.0) for r in (False, True) for b in (1, 2) for s in (512, 1024)]
    old.append({"stage": "realsize_memory_fit", "mode": "fp32", "recompute": False})  # recomputed, not kept
    new = [case(r, peak_rss_gb=2.0, activation_peak_gb=0.5) for r in (False, True)]
    rows = bench_memory.merge_rows(old, new)
    assert len(rows) == 8 and all(r["stage"] == "realsize_memory" for r in rows)
    assert [r["peak_rss_gb"] for r in rows if (r["batch"], r["seq"]) == (2, 1024)] == [2.0, 2.0]


def test_ratio_is_of_activation_peaks_and_fits_need_every_case_measured() -> None:
    rows = [case(False, b, s, peak_rss_gb=7.0 + b * s / 1000) for b in (1, 2) for s in (512, 1024)]
    rows[-1] |= {"activation_peak_gb": 4.0}  # b2 s1024 off, measured again with the activation counter
    rows.append(case(True, peak_rss_gb=10.0, activation_peak_gb=1.0))
    fits, act_fits = bench_memory.fits_of(rows, "peak_rss_gb"), bench_memory.fits_of(rows, "activation_peak_gb")
    assert set(fits) == {("fp32", False)}  # checkpointing on: one batch x seq, no line
    assert act_fits == {}  # three off cases lack the activation peak
    summary = bench_memory.summarize(rows, fits, act_fits)
    assert summary["realsize_ckpt_memory_ratio"] == pytest.approx(0.25, rel=1e-12)
    assert summary["realsize_fixed_gb"] == pytest.approx(7.0, rel=1e-9)
    assert "realsize_activation_bytes_per_position" not in summary


def test_tiny_case_checkpointing_lowers_the_activation_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(bench_memory.__file__).parent))  # the child's imports: realsize_model, ...
    off, on = (
        bench_memory.run_case({"dims": "tiny", "mode": "fp32", "batch": 2, "seq": 256, "recompute": r})
        for r in (False, True)
    )
    assert 0 < on["activation_peak_gb"] < off["activation_peak_gb"]
    assert off["grad_gb"] == on["grad_gb"] > 0  # the same trainable parameters get gradients either way


@pytest.mark.parametrize(("platform", "factor"), [("darwin", 1), ("linux", 1024)])
def test_peak_rss_units_follow_the_platform(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, platform: str, factor: int
) -> None:
    """ru_maxrss is bytes on macOS and KiB on Linux; without /proc (macOS) the RSS after the build falls back to it."""
    monkeypatch.setattr(bench_memory.sys, "platform", platform)
    assert bench_memory.maxrss_bytes(3 * 2**20) == 3 * 2**20 * factor
    monkeypatch.setattr(bench_memory, "STATM", tmp_path / "no-proc" / "statm")
    fake = types.SimpleNamespace(ru_maxrss=5 * 2**20)
    monkeypatch.setattr(bench_memory.resource, "getrusage", lambda who: fake)
    assert bench_memory.rss_now_bytes() == (5 * 2**20 * factor, "ru_maxrss")


def test_rss_now_reads_statm_where_there_is_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    statm = tmp_path / "statm"
    statm.write_text("1000 250 30 1 0 200 0\n")  # size resident shared text lib data dt, in pages
    monkeypatch.setattr(bench_memory, "STATM", statm)
    monkeypatch.setattr(bench_memory.os, "sysconf", lambda name: 4096)
    assert bench_memory.rss_now_bytes() == (250 * 4096, "statm")


def test_mps_memory_is_read_in_gib(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    figures = {
        "current_allocated_memory": 1 * GIB,
        "driver_allocated_memory": 3 * GIB,
        "recommended_max_memory": 48 * GIB,
    }
    for name, value in figures.items():
        monkeypatch.setattr(torch.mps, name, lambda value=value: value)
    monkeypatch.setattr(torch.mps, "synchronize", lambda: None)
    assert bench_memory.mps_memory_gb() == {
        "mps_current_allocated_gb": 1.0,
        "mps_driver_allocated_gb": 3.0,
        "mps_recommended_max_gb": 48.0,
    }
