"""`python -m adapter_trainer.probe`: does generation follow the caption? An attribute probe on codes.

python -m adapter_trainer.probe --shards build/demo/shards --generated RUN/generated --out RUN/generation_report.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from adapter_trainer.errors import run_command
from adapter_trainer.evaluation.probe import run_probe, summary_lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adapter_trainer.probe", description=__doc__.splitlines()[0])
    ap.add_argument("--shards", required=True, type=Path, help="the training shard set (train + eval splits)")
    ap.add_argument("--generated", required=True, type=Path, help="a set written by adapter_trainer.generate")
    ap.add_argument("--out", required=True, type=Path, help="generation_report.json to write")
    ap.add_argument("--train-split", default="train")
    ap.add_argument("--eval-split", default="eval")
    ap.add_argument("--derangements", type=int, default=8)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    def probe() -> str:
        lines = [f"probe: {line}" for line in summary_lines(run_probe(args))]
        return "\n".join([*lines, f"probe: wrote {args.out}"])

    return run_command("adapter_trainer.probe", probe)


if __name__ == "__main__":
    raise SystemExit(main())
