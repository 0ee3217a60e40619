"""`python -m tokenizer_pipeline.standin_corpus --csv CSV --out DIR`: the offline stand-in corpus."""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from pathlib import Path

from tokenizer_pipeline.demo.build_settings import check_sizes, check_stamp, parse_settings
from tokenizer_pipeline.demo.standin_corpus import DURATION_S, LAYOUT_DURATION_S, LAYOUTS, SAMPLE_RATE, build_corpus
from tokenizer_pipeline.errors import exit_code

PREFIX = "tokenizer_pipeline.standin_corpus: "


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tokenizer_pipeline.standin_corpus", description=__doc__.split("\n")[0])
    p.add_argument("--csv", type=Path, help="MusicCaps CSV (data/musiccaps/musiccaps-public.csv)")
    p.add_argument("--out", type=Path, required=True, help="output directory (wavs, subset CSV, corpus.json)")
    p.add_argument("--n-clips", type=int, required=True, help="rows to render (make corpus: DEMO_CLIPS)")
    p.add_argument(
        "--eval-fraction", type=float, required=True, help="share of rows held out (make corpus: DEMO_EVAL_FRACTION)"
    )
    p.add_argument("--seed", type=int, default=0, help="row selection and per-clip randomness")
    p.add_argument(
        "--duration-s", type=float, default=None, help="clip length; default 10 s (MusicCaps), 30 s for other layouts"
    )
    p.add_argument(
        "--layout", choices=LAYOUTS, default="musiccaps",
        help="musiccaps: {ytid}.wav + subset CSV; audiocraft: data.jsonl + sidecars; audiofolder: train/ test/ + metadata.csv",
    )  # fmt: skip
    p.add_argument("--sample-rate", type=int, default=SAMPLE_RATE, help="tracks' rate (audiocraft/audiofolder)")
    p.add_argument("--channels", type=int, default=None, help="1 or 2; default 1 (musiccaps), 2 for other layouts")
    p.add_argument(
        "--workers", type=int, default=0,
        help="processes rendering musiccaps-layout clips (0: one per CPU core); the clips do not depend on it",
    )  # fmt: skip
    p.add_argument(
        "--check-built", action="store_true",
        help="render nothing: exit 2 if the sizes cannot give a demo or --build-dir was built with other settings",
    )  # fmt: skip
    p.add_argument("--codec-clips", type=int, default=None, help="--check-built: clips the codec is fitted on")
    p.add_argument("--build-dir", type=Path, default=None, help="--check-built: the build directory (make's DEMO)")
    p.add_argument(
        "--setting", action="append", default=[], metavar="NAME=VALUE",
        help="--check-built: one more setting the build depends on (make's variable), recorded and compared",
    )  # fmt: skip
    p.add_argument(
        "--count", action="append", default=[], metavar="NAME=VALUE",
        help="--check-built: a count the build does not depend on (the run's steps): checked, not recorded",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.csv is None and not args.check_built:
        p.error("--csv is required (data/musiccaps/musiccaps-public.csv)")
    if args.check_built and args.layout != "musiccaps":
        p.error("--check-built checks a musiccaps-layout corpus (make demo's); drop --layout")
    workers = args.workers if args.workers > 0 else (os.cpu_count() or 1)
    full = args.layout != "musiccaps"
    duration = args.duration_s if args.duration_s is not None else (LAYOUT_DURATION_S if full else DURATION_S)
    channels = args.channels if args.channels is not None else (2 if full else 1)
    if args.check_built:
        if args.codec_clips is None or args.build_dir is None:
            p.error("--check-built needs --codec-clips N and --build-dir DIR")

        def check() -> None:
            for warning in check_sizes(args.n_clips, args.eval_fraction, duration, args.codec_clips):
                print(f"{PREFIX}warning: {warning}")
            sizes = {"DEMO_CLIPS": args.n_clips, "DEMO_SECONDS": f"{duration:g}", "DEMO_CODEC_CLIPS": args.codec_clips}
            sizes |= {"DEMO_EVAL_FRACTION": f"{args.eval_fraction:g}"}
            parse_settings(args.count)
            check_stamp(args.build_dir, {k: str(v) for k, v in sizes.items()} | parse_settings(args.setting))

        return exit_code(check, PREFIX)

    def build() -> None:
        t0 = time.perf_counter()
        corpus = build_corpus(
            args.csv, args.out, args.n_clips, args.eval_fraction, args.seed, duration, args.layout, args.sample_rate,
            channels, workers,
        )  # fmt: skip
        fams = Counter(c["family"] for c in corpus["clips"])
        print(
            f"stand-in corpus: {corpus['n_clips']} clips ({corpus['n_train']} train, {corpus['n_eval']} eval) "
            f"-> {args.out} in {time.perf_counter() - t0:.1f} s; families {dict(sorted(fams.items()))}"
        )

    return exit_code(build, PREFIX)


if __name__ == "__main__":
    raise SystemExit(main())
