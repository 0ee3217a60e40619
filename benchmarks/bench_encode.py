"""Stage-1 benchmark: EnCodec encode throughput and bf16-vs-fp32 code agreement (runs in its own process).

Usage: python benchmarks/bench_encode.py --codec build/demo/codec --corpus build/demo/corpus --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np
import torch

from tokenizer_pipeline.audio.read_audio import load_audio
from tokenizer_pipeline.codec.encode import CodecEncoder


def time_encode(enc: CodecEncoder, wavs: list[torch.Tensor], batch_size: int) -> tuple[float, list[np.ndarray]]:
    """Seconds to encode all `wavs` (after one warm-up batch) and the codes ([T, K] int16 each)."""
    enc.encode_batch(wavs[:batch_size])  # warm-up: first-call allocations / kernel selection
    if enc.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    codes: list[np.ndarray] = []
    for i in range(0, len(wavs), batch_size):
        codes += enc.encode_batch(wavs[i : i + batch_size])
    if enc.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, codes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--codec", default="build/demo/codec")
    ap.add_argument("--corpus", default="build/demo/corpus")
    ap.add_argument("--n-clips", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch-sizes", default="1,4")
    # bf16 convolutions are ~30x slower than fp32 on CPU: its code agreement is measured on a few clips only
    ap.add_argument("--bf16-clips", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    files = sorted(Path(args.corpus).glob("*.wav"))[: args.n_clips]
    if not files:
        raise SystemExit(f"no wav files in {args.corpus}: run `make corpus` first")
    enc = CodecEncoder(args.codec, device=args.device, dtype="float32")
    wavs = [load_audio(f, enc.sampling_rate) for f in files]  # each [N] float32 at the codec rate
    audio_s = sum(w.numel() for w in wavs) / enc.sampling_rate
    rows = []
    ref: list[np.ndarray] | None = None
    for bs in [int(b) for b in args.batch_sizes.split(",")]:
        secs, codes = time_encode(enc, wavs, bs)
        ref = ref or codes
        rows.append(
            {
                "stage": "encode",
                "device": enc.device.type,
                "dtype": "float32",
                "batch_size": bs,
                "clips": len(wavs),
                "clip_seconds": audio_s / len(wavs),
                "seconds": secs,
                "clips_per_s": len(wavs) / secs,
                "x_realtime": audio_s / secs,
            }
        )
    bf16 = CodecEncoder(args.codec, device=args.device, dtype="bfloat16")
    few = wavs[: args.bf16_clips]
    secs, codes16 = time_encode(bf16, few, 1)
    agree = float(np.mean(np.concatenate([(a == b).ravel() for a, b in zip(ref, codes16)])))
    few_s = sum(w.numel() for w in few) / enc.sampling_rate
    rows.append(
        {
            "stage": "encode",
            "device": bf16.device.type,
            "dtype": "bfloat16",
            "batch_size": 1,
            "clips": len(few),
            "clip_seconds": few_s / len(few),
            "seconds": secs,
            "clips_per_s": len(few) / secs,
            "x_realtime": few_s / secs,
            "code_agreement_vs_fp32": agree,
        }
    )
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for r in rows:
        r["peak_rss_mb"] = peak_mb
    Path(args.out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
