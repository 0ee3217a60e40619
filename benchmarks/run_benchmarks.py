"""`make bench`: speed and memory figures for both stages, each measured in its own process.

Writes build/bench/results.json and build/bench/results.md (the README's benchmark table comes from it).
Needs the demo artifacts (`make demo-shards demo-models`; the Makefile's bench target builds them).
Extra flags: --device cuda (when a GPU is present), --train-steps N, --encode-clips N.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
OUT = Path("build/bench")


def run(script: str, out: Path, *args: str) -> list[dict]:
    """Run one benchmark script in a fresh interpreter; its rows come back through a JSON file."""
    subprocess.run([sys.executable, str(HERE / script), "--out", str(out), *args], check=True)
    return json.loads(out.read_text())


def table(rows: list[dict]) -> str:
    lines = ["| stage | setting | device | throughput | peak RSS |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["stage"] == "encode":
            setting = f"{r['dtype']}, batch {r['batch_size']}, {r['clips']} × 10-s clips"
            if "code_agreement_vs_fp32" in r:
                setting += f" (codes equal to fp32: {100 * r['code_agreement_vs_fp32']:.1f}%)"
            thr = f"{r['clips_per_s']:.2f} clips/s = {r['x_realtime']:.1f}× real time"
        else:
            setting = f"{r['experiment']}, {r['pattern']}, batch {r['batch_size']}, seq ≤ {r['max_seq_len']}, {r['precision']}"
            thr = f"{r['tokens_per_s']:.0f} positions/s ({r['s_per_step']:.2f} s/step)"
        lines.append(f"| {r['stage']} | {setting} | {r['device']} | {thr} | {r['peak_rss_mb']:.0f} MB |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--train-steps", type=int, default=20)
    ap.add_argument("--encode-clips", type=int, default=8)
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows = run("bench_encode.py", OUT / "encode.json", "--device", args.device, "--n-clips", str(args.encode_clips))
    for pattern in ("delay", "flatten"):
        rows += run("bench_train.py", OUT / f"train_{pattern}.json", "--pattern", pattern,
                    "--steps", str(args.train_steps), f"trainer.device={args.device}")
    # headline figures, one key per benchmark (each benchmark adds its own keys)
    summary: dict = {}
    data = run("bench_data.py", OUT / "data.json", f"trainer.device={args.device}")
    summary.update({k: data[k] for k in ("trainer_data_wait_fraction", "trainer_rss_100x_vs_1x")})
    ddp = run("bench_ddp.py", OUT / "ddp.json")  # CPU gloo ranks: the order/reduction check, not a speed figure
    summary["trainer_ddp_vs_one_eval_ce_rel"] = ddp["trainer_ddp_vs_one_eval_ce_rel"]
    machine = f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"
    md = f"Machine: {machine}\n\n{table(rows)}\n\n" + "\n".join(f"- `{k}`: {v:.4g}" for k, v in summary.items()) + "\n"
    (OUT / "results.json").write_text(json.dumps({"machine": machine, "rows": rows, "summary": summary,
                                                  "details": {"data": data, "ddp": ddp}}, indent=2))
    (OUT / "results.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
