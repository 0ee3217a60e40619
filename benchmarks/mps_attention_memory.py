"""What one MoT attention call keeps for backward on MPS vs on CPU, counted on the CPU (no Mac needed).

With gradients on, torch 2.11's MPS backend runs scaled_dot_product_attention's generic math path (its MPS kernel,
`_scaled_dot_product_attention_math_for_mps`, is taken only when no input requires grad: attention.cpp), and
`model.attention.attend` expands k/v to the 32 query heads there (flash-style grouped calls are for CPU and sm80+
CUDA). The math path keeps the [B, H, S, S] attention probabilities for backward; CPU's fused flash kernel keeps
its output and the log-sum-exp. This script runs both forms on the CPU under `live_memory.LiveTensorBytes` and
prints the bytes each keeps after the forward and its peak (the memory model of docs/real-data.md, "Apple MPS").

    python benchmarks/mps_attention_memory.py                 # mps_small: batch 1, 32/8 heads, seq 1024, fp32
    python benchmarks/mps_attention_memory.py --seq 256 --json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from live_memory import LiveTensorBytes
from torch.nn.attention import SDPBackend, sdpa_kernel


def attention_bytes(math: bool, batch: int, heads: int, kv_heads: int, seq: int, head_dim: int) -> dict[str, int]:
    """Bytes one causal fp32 attention call keeps after its forward ("kept") and its peak, as MPS (math kernel,
    expanded k/v) or CPU (fused flash kernel, grouped k/v) runs it."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, seq, head_dim, generator=g, requires_grad=True)  # [B, H, S, hd]
    k = torch.randn(batch, kv_heads, seq, head_dim, generator=g, requires_grad=True)  # [B, KV, S, hd]
    v = torch.randn(batch, kv_heads, seq, head_dim, generator=g, requires_grad=True)  # [B, KV, S, hd]
    rep, scale = heads // kv_heads, head_dim**-0.5  # attend passes the scale explicitly, as here
    with LiveTensorBytes() as mem:
        if math:
            with sdpa_kernel(SDPBackend.MATH):
                out = F.scaled_dot_product_attention(
                    q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), is_causal=True, scale=scale
                )  # [B, H, S, hd]
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True)  # [B, H, S, hd]
        kept, peak = mem.live_bytes, mem.peak_bytes
    del out
    return {"kept_bytes": kept, "peak_bytes": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)  # Llama-3.2-1B: 32 query heads
    ap.add_argument("--kv-heads", type=int, default=8)  # and 8 key/value heads
    ap.add_argument("--seq", type=int, default=1024)  # mps_small's data.max_seq_len
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args()
    shape = (args.batch, args.heads, args.kv_heads, args.seq, args.head_dim)
    res = {"mps_math": attention_bytes(True, *shape), "cpu_flash": attention_bytes(False, *shape)}
    if args.json:
        print(json.dumps({"shape": dict(zip(("batch", "heads", "kv_heads", "seq", "head_dim"), shape)), **res}))
        return
    print(f"one attention call, fp32, batch {args.batch}, {args.heads}/{args.kv_heads} heads, seq {args.seq}:")
    for name, r in res.items():
        print(
            f"  {name:10s} kept for backward {r['kept_bytes'] / 2**20:8.1f} MiB   peak {r['peak_bytes'] / 2**20:8.1f} MiB"
        )


if __name__ == "__main__":
    main()
