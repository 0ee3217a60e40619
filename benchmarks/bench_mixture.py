"""Weighted mixture shares: does a 3:1 mixture of two shard sets draw them 3:1?

  mixture_weight_error   max over the two sets of |observed share - expected share| over N drawn examples
                         (default 10,000) of a 3:1 mixture. Target <= 0.01.

The draws go through the trainer's own order code: `TrainBatches.position` over a `MixtureOrder`, the objects the
recipe builds for data.shards=[{path: a, weight: 3}, {path: b, weight: 1}]. No clip is read: the split index is a
header-free stand-in of the two sets' sizes (no files, no model), so the script runs in about a second.

Usage: python benchmarks/bench_mixture.py --out FILE.json [--draws 10000] [--sizes 320 40] [--seed 1234]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from adapter_trainer.data.mixture import MixtureOrder
from adapter_trainer.data.split_index import SplitIndex
from adapter_trainer.data.streaming import TrainBatches

WEIGHTS = (3.0, 1.0)


def stand_in_index(n: int) -> SplitIndex:
    """An index of n clips that is never read (TrainBatches opens a tar only when a clip is read)."""
    zeros = np.zeros(n, dtype=np.int64)
    keys = np.array([f"k{i}".encode() for i in range(n)], dtype=np.bytes_)
    digests = zeros.astype(np.uint64)
    return SplitIndex(
        ("unused.tar",), zeros.astype(np.int32), zeros, zeros.astype(np.int32), zeros, zeros.astype(np.int32), keys,
        np.ones(n), digests, digests, 4, 2048,
    )  # fmt: skip


def observed_shares(sizes: list[int], draws: int, seed: int) -> list[float]:
    """Share of each set among the first `draws` global positions of the mixture."""
    spans = [(int(sum(sizes[:i])), int(sum(sizes[: i + 1]))) for i in range(len(sizes))]
    order = MixtureOrder(seed, spans, WEIGHTS)
    batches = TrainBatches(stand_in_index(sum(sizes)), None, None, seed=seed, batch_size=8, order=order)  # type: ignore[arg-type]
    rows = np.array([batches.position(n)[2] for n in range(draws)])  # [draws] clip rows
    return [float(((rows >= a) & (rows < b)).mean()) for a, b in spans]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--draws", type=int, default=10_000)
    ap.add_argument("--sizes", type=int, nargs=2, default=[320, 40], help="train clips of the two sets")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    shares = observed_shares(args.sizes, args.draws, args.seed)
    expected = [w / sum(WEIGHTS) for w in WEIGHTS]
    error = max(abs(s - e) for s, e in zip(shares, expected))
    res = {
        "rows": [
            {"set": i, "weight": w, "train_clips": n, "expected_share": e, "observed_share": s}
            for i, (w, n, e, s) in enumerate(zip(WEIGHTS, args.sizes, expected, shares))
        ],
        "summary": {"mixture_weight_error": error, "mixture_draws": args.draws},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2, allow_nan=False))
    print(f"mixture_weight_error={error:.4f} over {args.draws} draws (target <= 0.01); shares {shares}")


if __name__ == "__main__":
    main()
