"""`make bench`: speed and memory figures for both stages, each measured in its own process.

Writes build/bench/results.json and build/bench/results.md (the README's benchmark table comes from it).
Needs the demo artifacts (`make demo-shards demo-models`; the Makefile's bench target builds them).
Extra flags: --device cuda (when a GPU is present), --train-steps N, --encode-clips N, --only core|onthefly|realsize
(a subset, merged into an existing results.json). `summary` holds one number per key (e.g.
shards_vs_onthefly_step_speedup, realsize_cpu_peak_rss_gb, realsize_cpu_s_per_step); scripts that write
{"summary": ..., "rows": ...} add their keys through `run_summary`.
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
EXTRA_STAGES = ("shards_vs_onthefly", "realsize")  # rows that only feed `summary` keys


def run(script: str, out: Path, *args: str) -> list[dict]:
    """Run one benchmark script in a fresh interpreter; its rows come back through a JSON file."""
    subprocess.run([sys.executable, str(HERE / script), "--out", str(out), *args], check=True)
    return json.loads(out.read_text())


def run_summary(script: str, out: Path, *args: str) -> tuple[list[dict], dict]:
    """Like `run`, for scripts that write {"summary": {key: value}, "rows": [...]}: the summary keys go to results.json."""
    subprocess.run([sys.executable, str(HERE / script), "--out", str(out), *args], check=True)
    got = json.loads(out.read_text())
    return got["rows"], got["summary"]


def merge_results(path: Path, machine: str, rows: list[dict], summary: dict) -> dict:
    """Merge into an existing results.json: rows of the stages just measured replace the old ones, summary keys update."""
    old = json.loads(path.read_text()) if path.exists() else {}
    stages = {r["stage"] for r in rows}
    merged_rows = [r for r in old.get("rows", []) if r["stage"] not in stages] + rows
    return {"machine": machine, "rows": merged_rows, "summary": {**old.get("summary", {}), **summary}}


def table(rows: list[dict]) -> str:
    lines = ["| stage | setting | device | throughput | peak RSS |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        if r["stage"] in EXTRA_STAGES:
            continue  # their figures are in the summary table
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
    ap.add_argument("--only", choices=["all", "core", "onthefly", "realsize"], default="all",
                    help="run a subset and merge it into an existing results.json (realsize: ~10-15 GB RAM, minutes)")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    summary: dict = {}
    if args.only in ("all", "core"):
        rows += run("bench_encode.py", OUT / "encode.json", "--device", args.device, "--n-clips", str(args.encode_clips))
        for pattern in ("delay", "flatten"):
            rows += run("bench_train.py", OUT / f"train_{pattern}.json", "--pattern", pattern,
                        "--steps", str(args.train_steps), f"trainer.device={args.device}")
    if args.only in ("all", "onthefly"):
        r, s = run_summary("bench_onthefly.py", OUT / "onthefly.json", f"trainer.device={args.device}")
        rows, summary = rows + r, {**summary, **s}
    if args.only in ("all", "realsize"):
        r, s = run_summary("bench_realsize.py", OUT / "realsize.json")  # CPU by design (the closest to mps_small)
        rows, summary = rows + r, {**summary, **s}
    machine = f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"
    results = merge_results(OUT / "results.json", machine, rows, summary)
    summary_md = "\n".join(["| summary key | value |", "| --- | --- |",
                            *(f"| `{k}` | {v:.3g} |" for k, v in sorted(results["summary"].items()))])
    md = f"Machine: {machine}\n\n{table(results['rows'])}\n\n{summary_md}\n"
    (OUT / "results.json").write_text(json.dumps(results, indent=2))
    (OUT / "results.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
