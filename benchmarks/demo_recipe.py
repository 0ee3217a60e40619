"""The towers on the demo, against MusicGen as it ships (docs/results.md, "MusicGen as it ships: the teacher, and the
towers").

Variants (each `+experiment=demo` on `make demo`'s shards and models, 600 steps, trainer.seed in --seeds):
    musicgen_tower  the schema's default: audio rows run the frozen demo MusicGen's own layers and read the caption
              through its cross-attention (docs/architecture.md)
    llm_tower       model.mot.audio_tower=llm: audio rows ride the frozen Llama's layers (shared attention) with
              MusicGen's FFN blocks as experts, audio tables and heads from MusicGen's
    llm_separate    the llm tower with per-modality attention (model.mot.audio_attention=separate: audio rows get
              their own norm + q/k/v/o, copies of the Llama's, at optimizer.pretrained_copy_lr_scale=0.1)
For each run: train, generate a clip for every held-out caption (5 s), run the attribute probe; then one table of
held-out CE vs unigram, vs the music LM alone (its null condition) and vs the teacher (MusicGen reading the caption
through its own text encoder), caption gains, first-10-frames caption gain, probe fraction of its ceiling, trainable
params, training tokens/s and generation time. The null and teacher rows come from each seed's learning check (they
do not train: every variant of a seed reports the same figures).
Each stage is a subprocess with its log under `<out>/logs/`; a stage whose output exists is skipped (resumable).

    python benchmarks/demo_recipe.py --out build/tower_table                  # 2 towers x 3 seeds, with the probe
    python benchmarks/demo_recipe.py --out /tmp/r --variants musicgen_tower --seeds 1 --steps 20 --generate-n 8

Writes `<out>/results.json` and `<out>/results.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "musicgen_tower": [],
    "llm_tower": ["model.mot.audio_tower=llm"],
    "llm_separate": [
        "model.mot.audio_tower=llm",
        "model.mot.audio_attention=separate",
        "optimizer.pretrained_copy_lr_scale=0.1",
    ],
}


def overrides(variant: str, args) -> list[str]:
    models = args.models
    return [f"data.shards=[{args.shards}]", f"model.llm={models / 'llm'}", f"model.audio_lm={models / 'musicgen'}",
            *VARIANTS[variant]]  # fmt: skip


def run(cmd: list[str], log: Path, threads: int) -> float:
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    if rc != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {rc}; see {log}")
    return time.perf_counter() - t0


def one_run(variant: str, seed: int, args, out: Path, threads: int) -> dict:
    run_dir = out / "runs" / f"{variant}_s{seed}"
    common = [*overrides(variant, args), f"trainer.seed={seed}", f"trainer.output_dir={run_dir}",
              f"trainer.max_steps={args.steps}", "trainer.progress_bar=false", *args.overrides]  # fmt: skip
    py, logs, secs = sys.executable, out / "logs" / f"{variant}_s{seed}", {}
    if not (run_dir / "final_metrics.json").is_file():
        secs["train"] = run([py, "-m", "adapter_trainer", "+experiment=demo", "trainer.overwrite=true", *common],
                            logs.with_suffix(".train.log"), threads)  # fmt: skip
    report = run_dir / "generation_report.json"
    if args.generate_n >= 0 and not report.is_file():
        secs["generate"] = run(
            [py, "-m", "adapter_trainer.generate", "+experiment=demo", *common, "generate.checkpoint=latest",
             "generate.captions=eval", f"generate.n={args.generate_n}", "generate.seconds=5", "generate.overwrite=true"],
            logs.with_suffix(".generate.log"), threads)  # fmt: skip
        secs["probe"] = run([py, "-m", "adapter_trainer.probe", "--shards", str(args.shards), "--generated",
                             str(run_dir / "generated"), "--out", str(report)], logs.with_suffix(".probe.log"), threads)  # fmt: skip
    final = json.loads((run_dir / "final_metrics.json").read_text())
    lc = final["learning_check"]
    fig = {
        "variant": variant, "seed": seed, "eval_ce": lc["eval_ce"], "unigram_ce": lc["unigram_ce"],
        "ce_rel_pct": lc["rel_to_unigram_pct"], "music_lm_ce": lc["music_lm_ce"],
        "gain_over_music_lm": lc["gain_over_music_lm"], "gain_over_music_lm_ci95": lc["gain_over_music_lm_ci95"],
        "music_lm_text_ce": lc.get("music_lm_text_ce"), "music_lm_text_ce_shuffled": lc.get("music_lm_text_ce_shuffled"),
        "teacher_caption_gain": lc.get("teacher_caption_gain"), "teacher_caption_gain_ci95": lc.get("teacher_caption_gain_ci95"),
        "gain_over_teacher": lc.get("gain_over_teacher"), "gain_over_teacher_ci95": lc.get("gain_over_teacher_ci95"),
        "gain_first10": lc["caption_gain_by_position"]["frames_0_10"]["gain"],
        "gain_first10_ci95": lc["caption_gain_by_position"]["frames_0_10"]["ci95"],
        "gain_window": lc["caption_gain"], "gain_window_ci95": lc["caption_gain_ci95"],
        "train_wall_s": final["wall_time_s"], "seconds": secs,
        "trainable_params": _trainable_params(logs.with_suffix(".train.log")),
        "tokens_per_s": _mean_tokens_per_s(run_dir / "metrics.jsonl"),
    }  # fmt: skip
    stats = run_dir / "generated" / "generation_stats.json"
    if stats.is_file():
        fig["generation_s"] = json.loads(stats.read_text())["seconds"]  # sampling alone, all eval captions
    if report.is_file():
        probe = json.loads(report.read_text())
        fig["probe_fraction"] = probe.get("fraction_of_ceiling")
        fig["probe_fraction_ci95"] = probe.get("fraction_of_ceiling_ci95")
    return fig


def _mean_tokens_per_s(metrics: Path) -> float | None:
    """Mean of the run's logged train/tokens_per_s after its first log (the first includes warm-up)."""
    rates = [
        r["train/tokens_per_s"]
        for r in map(json.loads, metrics.read_text().splitlines() if metrics.is_file() else [])
        if "train/tokens_per_s" in r
    ][1:]
    return sum(rates) / len(rates) if rates else None


def _trainable_params(train_log: Path) -> int | None:
    """The count the run printed at setup ("trainable params=1,132,288"), or None (a log from elsewhere)."""
    m = re.search(r"trainable params=([\d,]+)", train_log.read_text()) if train_log.is_file() else None
    return int(m.group(1).replace(",", "")) if m else None


def _ci(g: float | None, ci: list[float] | None) -> str:
    return "-" if g is None else f"{g:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}]"


def table(figs: list[dict]) -> str:
    """Per seed: the null and the teacher (from that seed's learning check), then each variant."""
    rows = [
        "| row | seed | held-out CE | % under unigram | caption gain, true vs shuffled [95% CI] | "
        "gain over the teacher [95% CI] | first-10-frames gain [95% CI] | probe fraction of ceiling | "
        "trainable params | train tokens/s | generation s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for seed in sorted({f["seed"] for f in figs}, key=[f["seed"] for f in figs].index):
        of_seed = [f for f in figs if f["seed"] == seed]
        ref = of_seed[0]
        uni = ref["unigram_ce"]
        rows.append(f"| null (MusicGen, no caption) | {seed} | {ref['music_lm_ce']:.4f} | "
                    f"{100 * (uni - ref['music_lm_ce']) / uni:.1f} | 0 by definition | - | - | - | - | - | - |")  # fmt: skip
        if ref.get("music_lm_text_ce") is not None:
            t = ref["music_lm_text_ce"]
            rows.append(f"| teacher (MusicGen + its T5) | {seed} | {t:.4f} | {100 * (uni - t) / uni:.1f} | "
                        f"{_ci(ref['teacher_caption_gain'], ref['teacher_caption_gain_ci95'])} | 0 by definition | "
                        "- | - | - | - | - |")  # fmt: skip
        for f in of_seed:
            probe = f.get("probe_fraction")
            rows.append(
                f"| {f['variant']} | {seed} | {f['eval_ce']:.4f} | {f['ce_rel_pct']:.1f} | "
                f"{_ci(f['gain_window'], f.get('gain_window_ci95'))} | "
                f"{_ci(f.get('gain_over_teacher'), f.get('gain_over_teacher_ci95'))} | "
                f"{_ci(f['gain_first10'], f['gain_first10_ci95'])} | "
                + (f"{probe:.2f} [{f['probe_fraction_ci95'][0]:.2f}, {f['probe_fraction_ci95'][1]:.2f}] | "
                   if probe is not None else "- | ")
                + f"{f['trainable_params'] or 0:,} | {f.get('tokens_per_s') or 0:,.0f} | "
                + (f"{f['generation_s']:.1f} |" if f.get("generation_s") is not None else "- |")
            )  # fmt: skip
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "demo_recipe")
    ap.add_argument("--shards", type=Path, default=ROOT / "build" / "demo" / "shards")
    ap.add_argument("--models", type=Path, default=ROOT / "build" / "demo" / "models")
    ap.add_argument("--variants", nargs="+", default=["musicgen_tower", "llm_tower"], choices=sorted(VARIANTS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[1234, 1, 2])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--generate-n", type=int, default=0, help="clips for the probe (0 = every held-out; -1 = none)")
    ap.add_argument("--parallel", type=int, default=2, help="runs at a time (one intra-op thread each when > 1)")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args(argv)
    for need in (args.shards / "manifest.json", args.models / "musicgen" / "config.json"):
        if not need.is_file():
            ap.error(f"{need} does not exist: build the demo first (make demo-shards demo-models)")
    threads = 1 if args.parallel > 1 else (os.cpu_count() or 1)
    jobs = [(v, s) for s in args.seeds for v in args.variants]
    with ThreadPoolExecutor(args.parallel) as pool:
        figs = list(pool.map(lambda vs: one_run(vs[0], vs[1], args, args.out, threads), jobs))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(figs, indent=2) + "\n")
    (args.out / "results.md").write_text(table(figs))
    print(table(figs))


if __name__ == "__main__":
    main()
