"""`python -m tokenizer_pipeline.demo_codec --corpus DIR --out DIR`: the offline demo codec."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from tokenizer_pipeline.demo.demo_codec import ENCODEC_32KHZ_NUM_FILTERS, KMEANS_MAX_ITER, build_demo_codec
from tokenizer_pipeline.errors import exit_code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tokenizer_pipeline.demo_codec", description=__doc__.split("\n")[0])
    p.add_argument("--corpus", type=Path, required=True, help="stand-in corpus directory (make corpus)")
    p.add_argument("--out", type=Path, required=True, help="output model directory")
    p.add_argument(
        "--n-clips", type=int, required=True, help="clips whose latents fit the codebooks (DEMO_CODEC_CLIPS)"
    )
    p.add_argument("--seed", type=int, default=0, help="weight init and k-means seed")
    p.add_argument(
        "--num-filters",
        type=int,
        default=ENCODEC_32KHZ_NUM_FILTERS,
        help=f"conv width (encodec_32khz: {ENCODEC_32KHZ_NUM_FILTERS}; the demo passes DEMO_CODEC_WIDTH)",
    )
    p.add_argument("--max-iter", type=int, default=KMEANS_MAX_ITER, help="k-means iterations per codebook")
    args = p.parse_args(argv)
    return exit_code(lambda: build(args), "tokenizer_pipeline.demo_codec: ")


def build(args: argparse.Namespace) -> None:
    t0 = time.perf_counter()
    s = build_demo_codec(args.corpus, args.out, args.n_clips, args.seed, args.max_iter, args.num_filters)
    print(
        f"demo codec -> {args.out}: num_filters {args.num_filters} ({s['params'] / 1e6:.1f} M parameters), {s['n_clips']} clips, {s['n_frames']} frames; encode + k-means "
        f"{s['fit_s']:.1f} s, total {time.perf_counter() - t0:.1f} s"
    )
    print(f"reloaded with EncodecModel.from_pretrained({args.out}); codes over the fitting clips:")
    for k, (d, h) in enumerate(s["stats"]):
        print(f"  codebook {k}: {d:4d} distinct codes, entropy {h:.3f} nats (max {math.log(2048):.3f})")


if __name__ == "__main__":
    raise SystemExit(main())
