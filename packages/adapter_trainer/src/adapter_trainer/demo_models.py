"""`python -m adapter_trainer.demo_models`: write the tiny demo models, laid out like the real checkpoints.

    python -m adapter_trainer.demo_models --out build/demo/models [--seed 0] \
        [--captions-csv data/musiccaps/musiccaps-public.csv --exclude-csv build/demo/corpus/musiccaps-subset.csv] \
        [--shards build/demo/shards] [--pretrain-steps N] [--t5-pretrain-steps N] [--music-pretrain-steps N]

With captions the LLM and MusicGen's T5 encoder pretrain on them (--t5-pretrain-steps 0 keeps the T5 random).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from adapter_trainer.demo.models import write_demo_models
from adapter_trainer.demo.music_pretrain import MusicPretrainConfig
from adapter_trainer.demo.pretrain import PretrainConfig
from adapter_trainer.demo.t5_pretrain import T5PretrainConfig
from adapter_trainer.hydra_cli import quiet_loading_bars


def main(argv: list[str] | None = None) -> None:
    quiet_loading_bars()  # off a terminal: no "Loading weights" bar in make demo's log
    parser = argparse.ArgumentParser(prog="python -m adapter_trainer.demo_models", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="output directory, e.g. build/demo/models")
    parser.add_argument("--seed", type=int, default=0, help="init seed (same seed -> same weights)")
    parser.add_argument(
        "--captions-csv",
        type=Path,
        default=None,
        help="MusicCaps CSV: pretrain the LLM and MusicGen's T5 encoder on its captions (omit: both random init)",
    )
    parser.add_argument(
        "--exclude-csv",
        type=Path,
        default=None,
        help="CSV with a ytid column whose rows are left out (the demo corpus's musiccaps-subset.csv)",
    )
    parser.add_argument("--pretrain-steps", type=int, default=PretrainConfig.steps, help="pretraining optimizer steps")
    parser.add_argument(
        "--t5-pretrain-steps",
        type=int,
        default=T5PretrainConfig.steps,
        help="steps of MusicGen's T5 encoder pretraining on the captions (0: random init)",
    )
    parser.add_argument(
        "--shards",
        type=Path,
        default=None,
        help="shard set: pretrain MusicGen on its train split's codes (omit for a random-init MusicGen)",
    )
    parser.add_argument(
        "--music-pretrain-steps", type=int, default=MusicPretrainConfig.steps, help="MusicGen pretraining steps"
    )
    parser.add_argument(
        "--music-pretrain-threads", type=int, default=MusicPretrainConfig.threads, help="its torch threads"
    )
    parser.add_argument(
        "--part",
        choices=("all", "text", "music"),
        default="all",
        help="text: the LLM and MusicGen's T5 (they need no shards: make demo runs them beside stage 1); music: the "
        "rest beside them",
    )
    args = parser.parse_args(argv)
    for path in (args.captions_csv, args.exclude_csv):
        if path is not None and not path.is_file():
            parser.error(f"{path} does not exist; build the demo corpus first (make corpus) or fix the path")
    if args.shards is not None and not (args.shards / "manifest.json").is_file():
        parser.error(f"{args.shards}/manifest.json does not exist; build the demo shards first (make demo-shards)")
    pretrain = PretrainConfig(steps=args.pretrain_steps, seed=args.seed)
    try:
        t5_pretrain = T5PretrainConfig(steps=args.t5_pretrain_steps, seed=args.seed)
        music_pretrain = MusicPretrainConfig(
            steps=args.music_pretrain_steps, seed=args.seed, threads=args.music_pretrain_threads
        )
    except ValueError as e:
        parser.error(str(e))
    paths = write_demo_models(
        args.out,
        seed=args.seed,
        captions_csv=args.captions_csv,
        exclude_csv=args.exclude_csv,
        pretrain=pretrain,
        shards=args.shards,
        music_pretrain=music_pretrain,
        t5_pretrain=t5_pretrain,
        parts=("text", "music") if args.part == "all" else (args.part,),
    )
    if args.part == "text":
        print(f"wrote the demo LLM and MusicGen's T5: {paths['llm']} (then --part music writes the rest)")
        return
    kinds = [
        k for k, on in (("LLM pretrained on captions", args.captions_csv), ("MusicGen on codes", args.shards)) if on
    ]
    print(f"wrote demo models ({', '.join(kinds) or 'random init'}): llm={paths['llm']} musicgen={paths['musicgen']}")


if __name__ == "__main__":
    main()
