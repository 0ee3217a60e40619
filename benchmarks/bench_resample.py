"""Resampler choice for audio/read_audio (the figures behind `read_audio.SOXR_QUALITY`): soxr vs torchaudio.

Per method, resampling 10-s mono clips 44.1 -> 32 kHz: level of a 17 kHz tone (which folds to 15 kHz)
relative to a 1 kHz tone, passband gain at 14 kHz, milliseconds per clip; then peak RSS of one
44,101 -> 32,000 Hz clip in a fresh process (address space capped at --cap-gb, so a method that
asks for gigabytes fails instead of swapping the machine).

Usage: python benchmarks/bench_resample.py [--out build/bench/resample.json] [--cap-gb 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SR, TARGET = 44100, 32000
METHODS = ("soxr_vhq", "soxr_hq", "torchaudio_kaiser", "torchaudio_default")


def resampler(method: str, orig_sr: int, target_sr: int):
    """A function [N] float32 -> [N'] float32 for `method`."""
    if method.startswith("soxr"):
        import soxr

        quality = "VHQ" if method == "soxr_vhq" else "HQ"
        return lambda x: soxr.resample(x, orig_sr, target_sr, quality=quality)
    import torch
    import torchaudio.functional as AF

    kw = {}
    if method == "torchaudio_kaiser":  # librosa's "kaiser_best" settings, as torchaudio's docs suggest
        kw = dict(lowpass_filter_width=64, rolloff=0.9475937167399596, resampling_method="sinc_interp_kaiser",
                  beta=14.769656459379492)  # fmt: skip
    return lambda x: AF.resample(torch.from_numpy(x), orig_sr, target_sr, **kw).numpy()


def _tone(freq: float, sr: int = SR, seconds: float = 10.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * freq * np.arange(int(sr * seconds)) / sr)).astype(np.float32)  # [N]


def _peak(y: np.ndarray) -> float:
    return float(np.abs(np.fft.rfft(y * np.blackman(y.shape[0]))).max())


def quality_and_speed(method: str, repeats: int = 5) -> dict[str, float]:
    rs = resampler(method, SR, TARGET)
    ref = _peak(rs(_tone(1000.0)))
    x = _tone(1000.0)
    rs(x)  # warm-up (kernel construction)
    t0 = time.perf_counter()
    for _ in range(repeats):
        rs(x)
    ms = (time.perf_counter() - t0) / repeats * 1e3
    return {
        "alias_17k_db": round(20 * np.log10(_peak(rs(_tone(17000.0))) / ref), 1),
        "gain_14k_db": round(20 * np.log10(_peak(rs(_tone(14000.0))) / ref), 3),
        "ms_per_10s_clip": round(ms, 1),
    }


def odd_rate_child(method: str, cap_gb: float) -> None:
    """In a fresh process: cap the address space, resample one 10-s 44,101 Hz clip, print peak RSS."""
    import resource

    cap = int(cap_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    x = np.random.default_rng(0).standard_normal(441010).astype(np.float32)  # [N]
    rs = resampler(method, 44101, TARGET)
    try:
        y = rs(x)
        out = {"ok": True, "n_out": int(y.shape[0])}
    except (MemoryError, RuntimeError) as e:
        out = {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"}
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/bench/resample.json")
    ap.add_argument("--cap-gb", type=float, default=4.0)
    ap.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        odd_rate_child(args.child, args.cap_gb)
        return
    results = {}
    for method in METHODS:
        r = quality_and_speed(method)
        child = subprocess.run(
            [sys.executable, __file__, "--child", method, "--cap-gb", str(args.cap_gb)], capture_output=True, text=True
        )
        r["odd_rate_44101"] = json.loads(child.stdout.strip().splitlines()[-1]) if child.stdout.strip() else {
            "ok": False, "error": child.stderr.strip().splitlines()[-1][:200] if child.stderr.strip() else f"exit {child.returncode}"
        }  # fmt: skip
        results[method] = r
        print(method, json.dumps(r))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"setting": f"{SR} -> {TARGET} Hz, 10-s clips, one process", **results}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
