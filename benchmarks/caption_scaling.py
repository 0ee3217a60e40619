"""How caption following grows with the number of training captions (docs/results.md, "Caption scaling").

One controlled experiment: every point shares the same 80 held-out captions, the same demo codec and the same
tiny LLM (pretrained on the MusicCaps captions that no point uses), and changes only how many training captions
the adapter sees. The train sets are nested (the stand-in corpus picks rows by a seeded hash, so 240 ⊂ 960 ⊂ 3840).
Clips get shorter as captions grow so that the audio-seconds (and the encode time) stay near `--train-seconds`,
down to `--min-duration-s` (the learning check's window is 75 frames = 1.5 s).

For each point, seed and schedule (`fixed`: the demo's 600 steps; `scaled`: 600 × captions / 240, capped at
`--max-steps`) it trains `+experiment=demo`, generates a clip for every held-out caption, runs the attribute probe,
and collects: first-10-frames caption gain, whole-window caption gain, held-out CE (% under unigram) and the probe's
fraction of ceiling, each with its 95% interval. Then it fits each figure against log2(captions) and states what the
fit predicts for MusicCaps' own caption counts. Every stage is a subprocess with its log under `<out>/logs/`; a
stage whose output exists is skipped, so a stopped run resumes. Each (point, seed, steps) trains once (the 240
point's scaled run is its fixed run); `--parallel` stages run side by side, one intra-op thread each, and a point's
runs start as soon as its shards exist.

    python benchmarks/caption_scaling.py --out build/scaling                       # the curve (hours on 2 cores)
    python benchmarks/caption_scaling.py --out /tmp/s --captions 16 32 --seeds 1 \\
        --eval-captions 8 --steps 20 --schedules fixed --generate-n 8              # a smoke run (minutes)

Writes `<out>/curve.json`, `<out>/curve.md` (the table for docs/results.md) and `<out>/curve.png`.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "data" / "musiccaps" / "musiccaps-public.csv"
BASE_CAPTIONS = 240  # the demo's training captions: the `scaled` schedule's unit
FIGURES = (  # (name in curve.json, what the table calls it)
    ("gain_first10", "first-10-frames gain"),
    ("gain_window", "whole-window gain"),
    ("ce_rel_pct", "held-out CE, % under unigram"),
    ("probe_fraction", "probe fraction of ceiling"),
)
MUSICCAPS_CAPTIONS = {"MusicCaps train split (2,663)": 2663, "all of MusicCaps (5,521)": 5521}


class StageFailed(RuntimeError):
    """A stage exited non-zero; the message names its log."""


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child nobody has waited for yet)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    status = Path(f"/proc/{pid}/status")
    return not (status.is_file() and "\nState:\tZ" in status.read_text())


def wait_for_lock(lock: Path, poll_s: float = 10.0) -> None:
    """Wait while `lock` names a live process: a stage another invocation (or one stopped mid-stage) still runs
    writes the same output, so this invocation takes it over only once it has ended."""
    while lock.is_file():
        try:
            pid = int(lock.read_text().split()[0])
        except (ValueError, IndexError):
            return
        if not _alive(pid):
            return
        time.sleep(poll_s)


def run(cmd: list[str], log: Path, threads: int | None = None) -> float:
    """One stage in its own process (`threads`: its OMP/MKL threads); output to `log`. Returns its wall seconds.
    While it runs, `<log>.lock` holds its pid (`wait_for_lock`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if threads is not None:
        env |= {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    t0 = time.time()
    print(f"[{time.strftime('%H:%M:%S')}] {' '.join(cmd[2:] if cmd[1] == '-m' else cmd[1:])[:160]}", flush=True)
    lock = log.with_name(log.name + ".lock")
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        lock.write_text(f"{proc.pid}\n")
        rc = proc.wait()
    lock.unlink(missing_ok=True)
    if rc != 0:
        raise StageFailed(f"caption_scaling: stage failed (exit {rc}); see {log}")
    print(f"    done in {time.time() - t0:.0f} s: {log.name}", flush=True)
    return time.time() - t0


class PriorityPool:
    """`workers` threads running submitted jobs lowest `priority` first, FIFO among equals (concurrent.futures'
    pool is FIFO only: a point whose shards finish late must still get its fixed-steps runs before the long
    scaled runs queued earlier)."""

    def __init__(self, workers: int) -> None:
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._seq = itertools.count()
        self._threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]
        for t in self._threads:
            t.start()

    def submit(self, priority: tuple, fn, *args) -> Future:
        fut: Future = Future()
        self._queue.put((priority, next(self._seq), fut, fn, args))
        return fut

    def _work(self) -> None:
        while True:
            _, _, fut, fn, args = self._queue.get()
            if fut is None:  # shutdown
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # handed to whoever waits on the future
                fut.set_exception(e)

    def shutdown(self) -> None:
        for _ in self._threads:
            self._queue.put(((math.inf,), next(self._seq), None, None, None))
        for t in self._threads:
            t.join()


def write_rows_csv(out: Path, n_eval: int, seed: int) -> Path:
    """MusicCaps rows with `is_audioset_eval` re-drawn: `n_eval` rows (the held-out captions every point shares)
    are True, all others False, so the train pool is every other row (MusicCaps' own split has only 2,663 train
    rows, fewer than the largest point needs)."""
    import hashlib

    with CSV.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
    order = sorted(
        range(len(rows)), key=lambda i: hashlib.sha256(f"eval:{seed}:{rows[i]['ytid']}".encode()).hexdigest()
    )
    held_out = set(order[:n_eval])
    for i, r in enumerate(rows):
        r["is_audioset_eval"] = "True" if i in held_out else "False"
    path = out / "rows.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return path


def duration_for(n_captions: int, args: argparse.Namespace) -> float:
    return max(args.min_duration_s, min(10.0, args.train_seconds / n_captions))


def build_corpus(py: str, out: Path, rows_csv: Path, n: int, args: argparse.Namespace) -> None:
    """One point's stand-in corpus: all held-out rows + the first n train rows, clips of `duration_for(n)`."""
    point = out / f"c{n}"
    n_clips = n + args.eval_captions
    if not (point / "corpus" / "corpus.json").is_file():
        run([py, "-m", "tokenizer_pipeline.standin_corpus", "--csv", str(rows_csv), "--out", str(point / "corpus"),
             "--n-clips", str(n_clips), "--eval-fraction", repr(args.eval_captions / n_clips),
             "--duration-s", repr(duration_for(n, args))], out / "logs" / f"c{n}-corpus.log")  # fmt: skip


def build_codec(py: str, out: Path, n: int, args: argparse.Namespace) -> None:
    """One codec for every point, fitted on point n's first clips by name (as `make codec`)."""
    codec = out / "codec"
    if not (codec / "config.json").is_file():
        n_fit = max(1, min(n + args.eval_captions, round(args.codec_seconds / duration_for(n, args))))
        run([py, "-m", "tokenizer_pipeline.demo_codec", "--corpus", str(out / f"c{n}" / "corpus"), "--out", str(codec),
             "--n-clips", str(n_fit)], out / "logs" / "codec.log")  # fmt: skip


def nested_in(n: int, sizes: list[int], args: argparse.Namespace) -> int | None:
    """The largest smaller point with the same clip length: its clips are byte-identical to some of point n's
    (same rows, ytid-seeded rendering, same duration), so point n encodes only the rows it adds."""
    same = [m for m in sizes if m < n and duration_for(m, args) == duration_for(n, args)]
    return max(same) if same else None


def _write_added_rows(out: Path, n: int, m: int) -> Path:
    """Point n's corpus rows that point m does not have (train rows only: every point holds all held-out rows)."""

    def read(point: int) -> tuple[list[str], list[dict]]:
        with (out / f"c{point}" / "corpus" / "musiccaps-subset.csv").open(newline="", encoding="utf-8") as f:
            r = csv.DictReader(f)
            return list(r.fieldnames or []), list(r)

    fields, rows = read(n)
    have = {r["ytid"] for r in read(m)[1]}
    added = [r for r in rows if r["ytid"] not in have]
    if any(r["is_audioset_eval"] == "True" for r in added):
        raise StageFailed(f"c{n} has held-out rows that c{m} lacks: the points do not share their held-out captions")
    path = out / f"c{n}" / f"added-to-c{m}.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        w.writeheader()
        w.writerows(added)
    return path


def build_shards(py: str, out: Path, n: int, sizes: list[int], shards: dict, args: argparse.Namespace) -> list[Path]:
    """Point n's shard sets, encoded with the shared codec. A point nested in a smaller one of the same clip length
    (`nested_in`) trains on that point's set plus a set of the rows it adds (the trainer concatenates plain
    paths); `shards[m]` must then be done. Returns the shard dirs, the one with the held-out clips first."""
    point, dur = out / f"c{n}", duration_for(n, args)
    m = nested_in(n, sizes, args)
    csv_path, out_dir = point / "corpus" / "musiccaps-subset.csv", point / "shards"
    wait_for_lock(out / "logs" / f"c{n}-shards.log.lock")
    if m is not None:
        out_dir = point / f"shards-added-to-c{m}"
        if not (out_dir / "manifest.json").is_file():
            csv_path = _write_added_rows(out, n, m)
    if not (out_dir / "manifest.json").is_file():
        run([py, "-m", "tokenizer_pipeline", "+preset=demo", f"csv={csv_path}", f"audio_dir={point / 'corpus'}",
             f"out_dir={out_dir}", f"codec.name_or_path={out / 'codec'}",
             f"duration_tolerance_s={10.0 - dur + 0.5:.3f}"], out / "logs" / f"c{n}-shards.log",
            1 if args.parallel > 1 else None)  # fmt: skip
    return [out_dir] if m is None else [*shards[m].result(), out_dir]


def steps_for(n: int, schedule: str, args: argparse.Namespace) -> int:
    if schedule == "fixed":
        return args.steps
    return min(args.max_steps, round(args.steps * n / BASE_CAPTIONS))


def plan_runs(sizes: list[int], args: argparse.Namespace) -> list[tuple[int, int, int]]:
    """(captions, seed, steps) of every training run, each once: a `scaled` run with the `fixed` steps (the 240
    point) is the fixed run. Ordered by point, so a point's runs can start once its shards exist."""
    runs = {(n, seed, steps_for(n, sched, args)) for sched in args.schedules for n in sizes for seed in args.seeds}
    return sorted(runs, key=lambda r: (r[0], r[2], args.seeds.index(r[1])))


def run_dir_for(out: Path, n: int, seed: int, steps: int) -> Path:
    """One run per (point, seed, steps): a `scaled` run with the `fixed` steps (the 240 point) is the fixed run."""
    return out / f"c{n}" / "runs" / f"steps{steps}-s{seed}"


def train_and_probe(py: str, out: Path, shards: list[Path], n: int, seed: int, steps: int, args) -> dict[str, float]:
    """Train one adapter, generate a clip per held-out caption, probe it. Returns each stage's wall seconds
    (0 for a stage found done)."""
    run_dir = run_dir_for(out, n, seed, steps)
    models = out / "models"
    threads = 1 if args.parallel > 1 else None  # runs side by side get one intra-op thread each
    common = [f"data.shards=[{','.join(map(str, shards))}]", f"model.llm={models / 'llm'}", f"model.audio_lm={models / 'musicgen'}",
              f"trainer.seed={seed}", f"trainer.output_dir={run_dir}", f"trainer.max_steps={steps}",
              f"trainer.eval_every={steps}", f"trainer.ckpt_every={steps}",
              # the curve is measured with random crops (the demo preset's start crops were chosen from it);
              # an override such as data.start_crop_prob=1.0 comes later and wins
              "data.start_crop_prob=0.0",
              # ...and with random audio tables on a random-init MusicGen (its models are built without --shards),
              # the demo preset before it took the real recipe's musicgen tables
              "model.mot.audio_embed_init=random", "model.mot.audio_head_init=random", *args.overrides]  # fmt: skip
    log = out / "logs" / f"c{n}-steps{steps}-s{seed}"
    seconds = {"train": 0.0, "generate": 0.0, "probe": 0.0}
    for stage in ("train", "generate", "probe"):
        wait_for_lock(log.with_suffix(f".{stage}.log.lock"))
    if not (run_dir / "final_metrics.json").is_file():
        seconds["train"] = run([py, "-m", "adapter_trainer", "+experiment=demo", *common],
                               log.with_suffix(".train.log"), threads)  # fmt: skip
    report = run_dir / "generation_report.json"
    if args.generate_n >= 0 and not report.is_file():
        seconds["generate"] = run(
            [py, "-m", "adapter_trainer.generate", "+experiment=demo", *common, "generate.checkpoint=latest",
             "generate.captions=eval", f"generate.n={args.generate_n}", f"generate.seconds={args.generate_seconds}",
             "generate.overwrite=true"], log.with_suffix(".generate.log"), threads)  # fmt: skip
        seconds["probe"] = run(  # the probe is fitted on the set holding the held-out clips
            [py, "-m", "adapter_trainer.probe", "--shards", str(shards[0]), "--generated", str(run_dir / "generated"),
             "--out", str(report)], log.with_suffix(".probe.log"), threads)  # fmt: skip
    return seconds


def figures(out: Path, n: int, seed: int, schedule: str, args) -> dict:
    """One (point, seed, schedule)'s figures from its run's final_metrics.json and generation report."""
    steps = steps_for(n, schedule, args)
    run_dir = run_dir_for(out, n, seed, steps)
    lc = json.loads((run_dir / "final_metrics.json").read_text())["learning_check"]
    first = lc["caption_gain_by_position"]["frames_0_10"]
    fig = {
        "captions": n, "seed": seed, "schedule": schedule, "steps": steps, "clip_seconds": duration_for(n, args),
        "run": str(run_dir.relative_to(out)),
        "gain_first10": first["gain"], "gain_first10_ci95": first["ci95"],
        "gain_window": lc["caption_gain"], "gain_window_ci95": lc["caption_gain_ci95"],
        "ce_rel_pct": lc["rel_to_unigram_pct"], "ce_rel_pct_ci95": None, "eval_ce": lc["eval_ce"],
    }  # fmt: skip
    for key in ("n_train_clips", "n_train_captions", "train_sequences", "train_end_targets"):
        if key in lc:
            fig[key] = lc[key]
    report = run_dir / "generation_report.json"
    if report.is_file():
        probe = json.loads(report.read_text())
        fig["probe_fraction"] = probe.get("fraction_of_ceiling")
        fig["probe_fraction_ci95"] = probe.get("fraction_of_ceiling_ci95")
        fig["probe_n_clips"] = probe.get("n_clips")
    return fig


def fit_log2(points: list[dict], key: str) -> dict | None:
    """Least squares `figure = a + b * log2(captions)` over every (point, seed); None with < 2 caption counts."""
    xy = [(math.log2(p["captions"]), p[key]) for p in points if p.get(key) is not None and math.isfinite(p[key])]
    if len({x for x, _ in xy}) < 2:
        return None
    x, y = np.array([v[0] for v in xy]), np.array([v[1] for v in xy])
    b, a = np.polyfit(x, y, 1)
    resid = y - (a + b * x)
    return {
        "intercept": float(a), "per_doubling": float(b), "rmse": float(np.sqrt(np.mean(resid**2))),
        "predicted": {name: float(a + b * math.log2(n)) for name, n in MUSICCAPS_CAPTIONS.items()},
    }  # fmt: skip


def summarise(points: list[dict], schedules: list[str]) -> dict:
    out: dict = {"points": points, "fits": {}}
    for sched in schedules:
        pts = [p for p in points if p["schedule"] == sched]
        out["fits"][sched] = {key: fit_log2(pts, key) for key, _ in FIGURES}
    return out


def _cell(p: dict, key: str) -> str:
    v, ci = p.get(key), p.get(f"{key}_ci95")
    if v is None:
        return "n/a"
    return f"{v:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else f"{v:.1f}"


def meets_targets(p: dict) -> bool:
    """The caption-conditioning bar for one seed (docs/results.md): first-10-frames gain >= +0.10 with its interval
    above 0, probe fraction >= 0.5, held-out CE >= 20% under unigram."""
    lo = (p.get("gain_first10_ci95") or [float("nan")])[0]
    probe = p.get("probe_fraction")
    return p["gain_first10"] >= 0.10 and lo > 0 and probe is not None and probe >= 0.5 and p["ce_rel_pct"] >= 20.0


def means_md(summary: dict) -> list[str]:
    """Per schedule and point: each figure's mean over seeds (min..max), and how many seeds meet the bar."""
    lines = ["| schedule | captions | steps | seeds | " + " | ".join(t for _, t in FIGURES) + " | seeds meeting the bar |",
             "|" + " --- |" * (5 + len(FIGURES))]  # fmt: skip
    groups: dict[tuple, list[dict]] = {}
    for p in summary["points"]:
        groups.setdefault((p["schedule"], p["captions"], p["steps"]), []).append(p)
    for (sched, n, steps), pts in groups.items():
        cells = [sched, str(n), str(steps), str(len(pts))]
        for key, _ in FIGURES:
            v = [p[key] for p in pts if p.get(key) is not None]
            fmt = "{:.1f}" if key == "ce_rel_pct" else "{:+.3f}"
            span = f"{fmt.format(np.mean(v))} ({fmt.format(min(v))}..{fmt.format(max(v))})" if v else "n/a"
            cells.append(span)
        cells.append(f"{sum(meets_targets(p) for p in pts)} of {len(pts)}")
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def table_md(summary: dict) -> str:
    head = "| captions | clip s | schedule | steps | seed | " + " | ".join(t for _, t in FIGURES) + " |"
    lines = [*means_md(summary), head, "|" + " --- |" * (5 + len(FIGURES))]
    for p in summary["points"]:
        cells = [str(p["captions"]), f"{p['clip_seconds']:g}", p["schedule"], str(p["steps"]), str(p["seed"])]
        lines.append("| " + " | ".join(cells + [_cell(p, k) for k, _ in FIGURES]) + " |")
    lines.append("")
    for sched, fits in summary["fits"].items():
        for key, title in FIGURES:
            f = fits.get(key)
            if f:
                pred = ", ".join(f"{v:+.3f} at {k}" for k, v in f["predicted"].items())
                lines.append(
                    f"- {sched}, {title}: {f['per_doubling']:+.4f} per doubling (rmse {f['rmse']:.3f}); {pred}"
                )
    lines += [f"- not run: {m}" for m in summary.get("missing", [])]
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(FIGURES), figsize=(4.2 * len(FIGURES), 3.6))
    for ax, (key, title) in zip(axes, FIGURES):
        for sched, marker, color, shift in (("fixed", "o", "tab:blue", 1.0), ("scaled", "s", "tab:green", 1.08)):
            pts = [p for p in summary["points"] if p["schedule"] == sched and p.get(key) is not None]
            if not pts:
                continue
            x = [p["captions"] * shift for p in pts]  # scaled markers a little right: the 240 point is both
            y = [p[key] for p in pts]
            ci = [p.get(f"{key}_ci95") or [v, v] for p, v in zip(pts, y)]  # CE has no interval: a bare point
            err = [[max(0.0, v - c[0]) for v, c in zip(y, ci)], [max(0.0, c[1] - v) for v, c in zip(y, ci)]]
            ax.errorbar(x, y, yerr=err, fmt=marker, color=color, label=f"{sched} steps", alpha=0.7, capsize=2)
            f = summary["fits"][sched].get(key)
            if f:
                xs = np.geomspace(min(p["captions"] for p in pts), max(MUSICCAPS_CAPTIONS.values()), 50)
                ax.plot(xs, f["intercept"] + f["per_doubling"] * np.log2(xs), color=color, ls="--", alpha=0.6)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("training captions")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].axhline(0.10, color="k", ls=":", lw=0.8)
    axes[-1].axhline(0.5, color="k", ls=":", lw=0.8)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def collect(out: Path, sizes: list[int], args: argparse.Namespace) -> list[dict]:
    """The figures of every planned (schedule, point, seed) whose run has finished; the others are listed as
    missing (printed, and in curve.json's `missing`), never filled in."""
    points, missing = [], []
    for sched in args.schedules:
        for n in sizes:
            for seed in args.seeds:
                run_dir = run_dir_for(out, n, seed, steps_for(n, sched, args))
                if (run_dir / "final_metrics.json").is_file():
                    points.append(figures(out, n, seed, sched, args))
                else:
                    missing.append(f"{sched} c{n} seed {seed} ({run_dir.relative_to(out)})")
    args.missing = missing
    for m in missing:
        print(f"caption_scaling: not run yet: {m}", file=sys.stderr)
    return points


def build_and_run(py: str, out: Path, rows_csv: Path, sizes: list[int], args) -> tuple[list[dict], dict]:
    """Corpora, the shared LLM and codec, then every point's shards and runs, `parallel` stages at a time (a point's
    runs start as soon as its shards exist). Returns the figures of every (schedule, point, seed) and the runs'
    stage seconds."""
    for n in sizes:  # rendering is cheap (~0.3 s per 10-s clip on 2 cores)
        build_corpus(py, out, rows_csv, n, args)
    build_codec(py, out, sizes[0], args)
    if not (out / "models" / "config_done").is_file():
        # the LLM sees no caption of any point: every corpus row of the largest point, which holds every smaller one
        exclude = out / f"c{sizes[-1]}" / "corpus" / "musiccaps-subset.csv"
        cmd = [py, "-m", "adapter_trainer.demo_models", "--out", str(out / "models"), "--captions-csv", str(CSV),
               "--exclude-csv", str(exclude)]  # fmt: skip
        if args.pretrain_steps is not None:
            cmd += ["--pretrain-steps", str(args.pretrain_steps)]
        run(cmd, out / "logs" / "models.log")
        (out / "models" / "config_done").write_text("demo_models finished\n")
    runs = plan_runs(sizes, args)
    stage_seconds: dict[str, dict[str, float]] = {}
    pool = PriorityPool(args.parallel)  # shards first, then runs by steps: fixed runs before scaled
    shard_futures: dict = {}
    run_futures: dict = {}
    try:
        for n in sizes:  # a nested point waits for the smaller point's set inside its own stage, so it comes later
            shard_futures[n] = pool.submit((0, n), build_shards, py, out, n, sizes, shard_futures, args)
        for n in sizes:
            shards = shard_futures[n].result()
            for r in (r for r in runs if r[0] == n):
                # among equal steps the largest point first: no smaller point tells what it will show
                run_futures[r] = pool.submit((1, r[2], -n), train_and_probe, py, out, shards, *r, args)
        for (n, seed, steps), fut in run_futures.items():
            stage_seconds[f"c{n}-steps{steps}-s{seed}"] = fut.result()
    except StageFailed:
        for f in [*shard_futures.values(), *run_futures.values()]:
            f.cancel()
        raise
    finally:
        pool.shutdown()
    points = [figures(out, n, seed, sched, args) for sched in args.schedules for n in sizes for seed in args.seeds]
    return points, stage_seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "scaling")
    ap.add_argument("--captions", type=int, nargs="+", default=[240, 960, 3840], help="training captions per point")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1234, 1, 2])
    ap.add_argument("--schedules", nargs="+", default=["fixed", "scaled"], choices=["fixed", "scaled"])
    ap.add_argument("--eval-captions", type=int, default=80, help="held-out captions every point shares")
    ap.add_argument("--train-seconds", type=float, default=2400.0, help="audio-seconds per point (the demo's)")
    ap.add_argument("--min-duration-s", type=float, default=2.5, help="shortest clip (the eval window is 1.5 s)")
    ap.add_argument("--codec-seconds", type=float, default=400.0, help="audio the shared demo codec is fitted on")
    ap.add_argument("--steps", type=int, default=600, help="the fixed schedule (the demo's max_steps)")
    ap.add_argument("--max-steps", type=int, default=9600, help="cap of the scaled schedule")
    ap.add_argument("--pretrain-steps", type=int, default=None, help="demo LLM pretraining steps (its default)")
    ap.add_argument("--generate-n", type=int, default=0, help="clips for the probe (0 = every held-out; -1 = none)")
    ap.add_argument("--generate-seconds", type=float, default=5.0)
    ap.add_argument("--parallel", type=int, default=2, help="runs at a time (each with one thread when > 1)")
    ap.add_argument("--collect", action="store_true", help="only collect the runs that finished (no stage runs)")
    ap.add_argument("--split-seed", type=int, default=0, help="which rows are the held-out captions")
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every training run")
    args = ap.parse_args(argv)
    if args.eval_captions < 1 or any(n < 1 for n in args.captions):
        ap.error("--captions and --eval-captions must be >= 1")

    py, out = sys.executable, args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows_csv = write_rows_csv(out, args.eval_captions, args.split_seed)
    sizes = sorted(set(args.captions))
    if args.collect:  # the figures of the runs that finished; no stage runs
        points, stage_seconds = collect(out, sizes, args), {}
    else:
        try:
            points, stage_seconds = build_and_run(py, out, rows_csv, sizes, args)
        except StageFailed as e:
            sys.exit(str(e))
    summary = summarise(points, args.schedules)
    summary["missing"] = getattr(args, "missing", [])
    summary["settings"] = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k not in ("missing", "collect")
    }
    summary["stage_seconds"] = stage_seconds  # this invocation's wall seconds per run stage (0: found done)
    (out / "curve.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "curve.md").write_text(table_md(summary))
    plot(summary, out / "curve.png")
    print(table_md(summary))
    print(f"wrote {out / 'curve.json'}, {out / 'curve.md'}, {out / 'curve.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
