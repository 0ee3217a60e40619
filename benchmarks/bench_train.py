"""Stage-2 benchmark: MoT training-step throughput on the demo shards (runs in its own process, no codec).

Usage: python benchmarks/bench_train.py --pattern delay --steps 30 --out FILE.json [hydra overrides...]
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from adapter_trainer.config import to_train_config
from adapter_trainer.hydra_cli import find_conf_dir
from adapter_trainer.training.recipe import MoTAdapterRecipe


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pattern", default="delay", choices=["delay", "flatten"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--experiment", default="demo")
    ap.add_argument("--out", required=True)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp, initialize_config_dir(str(find_conf_dir()), version_base="1.3"):
        warmup = 3
        cfg = to_train_config(
            compose(
                "config",
                overrides=[
                    f"+experiment={args.experiment}",
                    f"data.pattern={args.pattern}",
                    f"trainer.max_steps={warmup}",
                    "trainer.eval_every=0",
                    "trainer.ckpt_every=0",
                    "trainer.progress_bar=false",
                    f"trainer.output_dir={tmp}",
                    *args.overrides,
                ],
            )
        )
        recipe = MoTAdapterRecipe(cfg)
        recipe.setup()
        recipe.train()  # warm-up steps, not timed
        recipe.max_steps = warmup + args.steps
        tokens0 = recipe.progress.tokens_seen
        if recipe.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        recipe.train()
        if recipe.device.type == "cuda":
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        tokens = recipe.progress.tokens_seen - tokens0
        row = {
            "stage": "train",
            "experiment": args.experiment,
            "pattern": args.pattern,
            "device": recipe.device.type,
            "precision": cfg.trainer.precision,
            "batch_size": cfg.trainer.batch_size * cfg.trainer.grad_accum_steps,
            "max_seq_len": cfg.data.max_seq_len,
            "steps": args.steps,
            "seconds": secs,
            # positions/s (caption + audio, padding excluded): a delay position carries K codes, flatten 1
            "s_per_step": secs / args.steps,
            "tokens_per_s": tokens / secs,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        Path(args.out).write_text(json.dumps([row], indent=2))


if __name__ == "__main__":
    main()
