"""Sweep of the MoT attention variants on the demo: held-out CE, caption gain, trainable params, step time.

    python benchmarks/attention_sweep.py --out build/sweep [--seeds 1 2 3] [--parallel 2] [--only shared ...]
        [--set trainer.max_steps=300 ...]

Each run is `python -m adapter_trainer +experiment=demo` (the default `make demo` settings, 600 steps) with one
variant's overrides, `trainer.seed` and the `--set` overrides, one intra-op thread (OMP_NUM_THREADS=1), at most
`--parallel` at a time. Results go to <out>/results.json (after every run; a rerun skips the rows it has) and a
Markdown table <out>/table.md (every seed's row). Needs `make demo-shards demo-models`; the "random-init LLM" row
also needs build/demo/models_random (`python -m adapter_trainer.demo_models --out build/demo/models_random`).
The published sweep ran when `make demo-models` wrote a random-init MusicGen; since it pretrains one on the demo's
train codes, pass model.audio_lm=build/demo/models_random/musicgen (extra overrides) to measure what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

VARIANTS: dict[str, list[str]] = {
    "random-init LLM, shared": [
        "model.llm=build/demo/models_random/llm",
        "model.mot.audio_attention=shared",
        "model.mot.lora_rank=0",
    ],
    "shared": ["model.mot.audio_attention=shared", "model.mot.lora_rank=0"],
    "lora r16": ["model.mot.audio_attention=lora", "model.mot.lora_rank=16"],
    "separate": ["model.mot.audio_attention=separate", "model.mot.lora_rank=0"],
    "separate, copies at lr x0.1": [
        "model.mot.audio_attention=separate",
        "model.mot.lora_rank=0",
        "optimizer.pretrained_copy_lr_scale=0.1",
    ],
}


def run_one(name: str, overrides: list[str], seed: int, out: Path, extra: list[str]) -> dict:
    run_dir = out / f"{re.sub(r'[^a-z0-9]+', '-', name.lower()).strip('-')}-s{seed}"
    cmd = [
        sys.executable,
        "-m",
        "adapter_trainer",
        "+experiment=demo",
        "data.start_crop_prob=0.0",  # the sweep was measured with random crops, before the demo preset's start crops
        "model.mot.audio_embed_init=random",  # ...and random audio tables, before it took the musicgen tables
        "model.mot.audio_head_init=random",
        *overrides,
        *extra,
        f"trainer.seed={seed}",
        f"trainer.output_dir={run_dir}",
        "trainer.progress_bar=false",
        "trainer.tensorboard=false",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    (run_dir).mkdir(parents=True, exist_ok=True)
    (run_dir / "stdout.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} seed {seed} failed (rc {proc.returncode}); see {run_dir / 'stdout.log'}")
    final = json.loads((run_dir / "final_metrics.json").read_text())
    lc = final["learning_check"]
    m = re.search(r"trainable params=([\d,]+)", proc.stdout + proc.stderr)
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in recs if "train/tokens_per_s" in r]
    # s/step from the logged throughput: tokens in a log interval / tokens_per_s / steps in the interval
    steps_s = [
        (b["train/tokens_seen"] - a["train/tokens_seen"]) / b["train/tokens_per_s"] / (b["step"] - a["step"])
        for a, b in zip(train, train[1:])
    ]
    return {
        "variant": name,
        "seed": seed,
        "eval_ce": lc["eval_ce"],
        "unigram_ce": lc["unigram_ce"],
        "rel_to_unigram_pct": lc["rel_to_unigram_pct"],
        "caption_gain": lc["caption_gain"],
        "caption_gain_ci95": lc["caption_gain_ci95"],
        "trainable_params": int(m.group(1).replace(",", "")) if m else None,
        "s_per_step_median": statistics.median(steps_s) if steps_s else None,
        "wall_s": time.perf_counter() - t0,
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| variant | seed | held-out CE (% under unigram) | caption gain, nats/code [95% CI] | trainable params | s/step |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lo, hi = r["caption_gain_ci95"]
        lines.append(
            f"| {r['variant']} | {r['seed']} | {r['eval_ce']:.3f} ({r['rel_to_unigram_pct']:.1f}%) | "
            f"{r['caption_gain']:+.3f} [{lo:+.3f}, {hi:+.3f}] | {r['trainable_params']:,} | "
            f"{r['s_per_step_median']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def summary(rows: list[dict]) -> str:
    """Per variant: means over seeds and how many seeds meet the caption-conditioning targets (>= 20% under unigram; gain >= +0.04
    with the interval above 0)."""
    lines = [
        "| variant | seeds | held-out CE, mean (% under unigram) | caption gain, mean [lowest CI low] | "
        "seeds with CE >= 20% under | seeds with gain >= +0.04, CI > 0 | trainable params |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in VARIANTS:
        rs = [r for r in rows if r["variant"] == name]
        if not rs:
            continue
        ce, rel = statistics.mean(r["eval_ce"] for r in rs), statistics.mean(r["rel_to_unigram_pct"] for r in rs)
        gain, lo = statistics.mean(r["caption_gain"] for r in rs), min(r["caption_gain_ci95"][0] for r in rs)
        ce_ok = sum(r["rel_to_unigram_pct"] >= 20.0 for r in rs)
        gain_ok = sum(r["caption_gain"] >= 0.04 and r["caption_gain_ci95"][0] > 0 for r in rs)
        lines.append(
            f"| {name} | {len(rs)} | {ce:.3f} ({rel:.1f}%) | {gain:+.3f} [{lo:+.3f}] | {ce_ok}/{len(rs)} | "
            f"{gain_ok}/{len(rs)} | {rs[0]['trainable_params']:,} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("build/sweep"))
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--parallel", type=int, default=2, help="runs at a time (each uses one thread)")
    p.add_argument("--only", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--set", nargs="*", default=[], help="extra Hydra overrides for every run, e.g. data.shards=[...]")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    jobs = [(name, VARIANTS[name], seed) for seed in args.seeds for name in args.only]  # every variant at seed 1 first
    results_path = args.out / "results.json"
    rows = json.loads(results_path.read_text()) if results_path.exists() else []
    done = {(r["variant"], r["seed"]) for r in rows}
    jobs = [j for j in jobs if (j[0], j[2]) not in done]
    failed: list[str] = []
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        futures = [pool.submit(run_one, name, overrides, seed, args.out, args.set) for name, overrides, seed in jobs]
        for fut in as_completed(futures):
            try:
                row = fut.result()
            except Exception as e:  # one run's failure is recorded (and fails the sweep at the end); the others go on
                failed.append(str(e))
                print(f"FAILED: {e}", file=sys.stderr, flush=True)
                continue
            rows.append(row)
            results_path.write_text(json.dumps(rows, indent=2) + "\n")  # after every run: nothing is lost
            print(table([row]).splitlines()[-1], flush=True)
    ordered = sorted(rows, key=lambda r: (list(VARIANTS).index(r["variant"]), r["seed"]))
    (args.out / "table.md").write_text(summary(ordered) + "\n" + table(ordered))
    print((args.out / "table.md").read_text())
    if failed:
        sys.exit(f"{len(failed)} run(s) failed:\n" + "\n".join(failed))


if __name__ == "__main__":
    main()
