"""DDP check on the demo: 1 process x batch 8 vs `torchrun --nproc_per_node=2` x batch 4 (gloo, CPU), same steps.

  trainer_ddp_vs_one_eval_ce_rel   |final held-out CE (2 ranks) - (1 process)| / (1 process). Target < 0.005.

Each run trains into its own output directory next to --out (ddp_one, ddp_two), emptied first, so a second
invocation measures again (never a resume).

Usage: python benchmarks/bench_ddp.py --out FILE.json [--steps 300] [hydra overrides...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    common = [
        "+experiment=demo",
        f"trainer.max_steps={args.steps}",
        "trainer.eval_every=0",
        "trainer.ckpt_every=0",
        "trainer.progress_bar=false",
        "trainer.tensorboard=false",
        *args.overrides,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // 2))}
    runs = {
        "one": [sys.executable, "-m", "adapter_trainer", "trainer.batch_size=8"],
        "two": [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "adapter_trainer",
            "trainer.batch_size=4",
        ],
    }
    final = {}
    for name, cmd in runs.items():
        out = Path(args.out).resolve().parent / f"ddp_{name}"
        shutil.rmtree(out, ignore_errors=True)
        # a hung rank fails the benchmark instead of blocking it
        subprocess.run([*cmd, *common, f"trainer.output_dir={out}"], check=True, env=env, timeout=3600)
        final[name] = json.loads((out / "final_metrics.json").read_text())["eval"]
    one, two = final["one"]["ce"], final["two"]["ce"]
    res = {
        "trainer_ddp_vs_one_eval_ce_rel": abs(two - one) / one,
        "eval_ce_one_process": one,
        "eval_ce_two_ranks": two,
        "caption_gain_one_process": final["one"]["caption_gain"],
        "caption_gain_two_ranks": final["two"]["caption_gain"],
        "ddp_setting": f"+experiment=demo, {args.steps} steps, 1 x batch 8 vs 2 gloo ranks x batch 4",
    }
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
