"""`make bench`: speed and memory figures for both stages, each measured in its own process.

Writes build/bench/results.json and build/bench/results.md (docs/benchmarks.md's tables come from them).
A bench script writes a list of rows, or `{"rows": [...], "summary": {...}}`, or a flat dict of figures;
each script owns its summary keys, and all of them are merged into results.json's top-level `summary`.
`--only GROUP` measures one group and merges it into an existing results.json (the other groups' rows and
keys are kept), so a slow group can be re-measured alone. Every group can run again at once: each run writes to
fresh or overwritten files and output directories, never resuming an earlier one. The wall time of each group is
printed and kept in results.json's `group_seconds` (docs/benchmarks.md gives the 2-core machine's).

Groups:
  core      encode + train throughput (bench_encode.py, bench_train.py)
  pipeline  pipeline_vs_encoder_bound, pipeline_vs_first_version, pipeline_rss_1000_vs_100,
            decode_workers_speedup_2v1 (bench_pipeline.py)
  data      trainer_data_wait_fraction, trainer_rss_100x_vs_1x (bench_data.py),
            trainer_ddp_vs_one_eval_ce_rel (bench_ddp.py: 1 process x 8 vs 2 gloo ranks x 4)
  onthefly  shards_vs_onthefly_step_speedup (bench_onthefly.py; the codec exists only inside the benchmark)
  realsize  realsize_cpu_peak_rss_gb, realsize_cpu_s_per_step, realsize_musicgen_vs_llm_s_per_step / _peak_rss
            (bench_realsize.py --compare-towers: both audio towers, each its own process; ~10-15 GB RAM, minutes)
  memory    opt-in (`make bench-memory`, about an hour on 2 cores): realsize_bytes_per_position, realsize_fixed_gb,
            realsize_activation_bytes_per_position, realsize_ckpt_memory_ratio and what fits in 24/48/80 GB per
            preset (bench_memory.py: 24 real-size cases, each its own process, up to ~12 GB)
  gpu       CUDA only, nothing built first: real-size cuda_1b training step (positions/s, MFU, peak memory per batch,
            checkpointing off/on), the attention kernel that ran, generation, encoder audio-s/s fp32/bf16 + bf16
            agreement (encodec_32khz architecture, random weights), within --gpu-budget-s (bench_gpu.py; it also
            writes build/bench/gpu.md)
  download  downloader clips/s per worker against a local server, download_bytes_per_clip_vs_whole (bytes
            fetched per 10-s clip of a 4-min source, sections vs whole streams) (bench_download.py)
  resample  soxr vs torchaudio quality/speed/memory behind read_audio's choice (bench_resample.py)
  generate  generate_speedup_vs_concat_cache (bench_generate.py: the sampler vs the one it replaced, demo models)
  mixture   mixture_weight_error (bench_mixture.py: shares of a 3:1 mixture of two sets over 10,000 draws; ~1 s)
  byo       byo_pipeline_vs_musiccaps (bench_byo.py: source=audiocraft on 30-s stereo tracks vs the MusicCaps source
            on the same audio cut into 10-s files, same codec/batch/threads, interleaved in one run)
  remote    remote_data_wait_fraction_order/_lru, local_data_wait_fraction, remote_peak_cache_over_bound_*,
            remote_downloads_per_epoch_*, remote_redownload_ratio_lru_vs_order (bench_remote.py: one demo epoch from
            s3:// on a loopback moto server through a cache bounded at a quarter of the set, policy order vs lru,
            vs the local directory; local, order, lru twice in one run; needs make setup's moto; ~3 min on 2 cores,
            ~6 min under load)
  startup   startup_s_100x_vs_1x, startup_download_sets_quarter, startup_demo_download_sets_all (bench_startup.py:
            `python -m adapter_trainer +experiment=demo trainer.max_steps=1` from launch to step 1 on the demo set
            replicated 1x/10x/100x (format 5), local and from a loopback HTTP server, no bound and a quarter-set cache
            bound, cold and warm; tar bytes the server sent before step 1; ~10-15 min on 2 cores)
Needs the demo artifacts (`make demo-shards demo-models`; the Makefile's bench target builds them), except gpu and
memory. A plain run measures every group but the opt-in ones (resample, gpu, memory).
`--device cuda` (`make bench-gpu`) measures the gpu group (other groups with --only); without CUDA it prints one
line saying nothing was measured and exits 0. Extra flags: --train-steps N, --encode-clips N, --pipeline-clips N,
--byo-tracks N, --byo-repeats N, --gpu-budget-s SECONDS (bench_gpu.py's --budget-s; its default when not given).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
OUT = Path("build/bench")
GROUPS = (
    "core",
    "pipeline",
    "data",
    "onthefly",
    "realsize",
    "memory",
    "download",
    "resample",
    "gpu",
    "generate",
    "mixture",
    "byo",
    "remote",
    "startup",
)
OPT_IN = ("resample", "gpu", "memory")  # not in a plain `make bench` (memory: `make bench-memory`, ~1 h)
NO_CUDA = "no CUDA device: nothing was measured (--device cuda / make bench-gpu need a GPU; CPU figures: make bench)"
SUMMARY_ONLY_STAGES = (
    "shards_vs_onthefly",
    "realsize",
    "realsize_memory",
    "realsize_memory_fit",
    "gpu",
)  # rows whose figures live in the summary table


# the scripts that encode audio: they measure --codec, the encodec_32khz-width codec `make bench` builds (its figures are
# the ones real users get), never the narrower demo codec that `make demo` encodes with
CODEC_SCRIPTS = ("bench_encode.py", "bench_pipeline.py", "bench_onthefly.py", "bench_byo.py")


def codec_label(codec: Path) -> str:
    """What a codec directory is, for the report: its path and width (`num_filters`; encodec_32khz's is 64)."""
    cfg = json.loads((codec / "config.json").read_text())
    return f"{codec} (EncodecModel, num_filters {cfg['num_filters']})"


def run(script: str, out: Path, *args: str) -> tuple[list[dict], dict]:
    """Run one benchmark script in a fresh interpreter; returns (rows, summary keys) from its JSON file."""
    subprocess.run([sys.executable, str(HERE / script), "--out", str(out), *args], check=True)
    got = json.loads(out.read_text())
    if isinstance(got, list):
        return [{"stage": Path(script).stem, **r} for r in got], {}
    if "rows" in got or "summary" in got:
        return [{"stage": Path(script).stem, **r} for r in got.get("rows", [])], _numbers(got.get("summary", {}))
    return [], _numbers(got)


def _numbers(d: dict) -> dict[str, float]:
    """The summary keys: numbers only; a nested dict {"1": x, "2": y} under key k becomes k_1, k_2."""
    out: dict[str, float] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_numbers({f"{k}_{kk}": vv for kk, vv in v.items()}))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = v
    return out


def merge_results(
    path: Path, machine: str, rows: list[dict], summary: dict, group_seconds: dict[str, float] | None = None
) -> dict:
    """Rows of the stages just measured replace the old ones; summary keys and group wall times update."""
    old = json.loads(path.read_text()) if path.exists() else {}
    stages = {r["stage"] for r in rows}
    merged_rows = [r for r in old.get("rows", []) if r["stage"] not in stages] + rows
    return {
        "machine": machine,
        "rows": merged_rows,
        "summary": {**old.get("summary", {}), **summary},
        "group_seconds": {**old.get("group_seconds", {}), **(group_seconds or {})},
    }


def selected_groups(only: str, cuda: bool) -> list[str]:
    """The groups a run measures, in GROUPS order: `--only`'s, else gpu alone under --device cuda, else all but
    OPT_IN."""
    if only != "all":
        return [only]
    return ["gpu"] if cuda else [g for g in GROUPS if g not in OPT_IN]


def plan(args: argparse.Namespace) -> dict[str, list[tuple[str, str, list[str]]]]:
    """Per group, the scripts it runs in order: (script, its JSON file under build/bench, its flags)."""
    dev = args.device
    train = [
        (
            "bench_train.py",
            f"train_{p}.json",
            ["--pattern", p, "--steps", str(args.train_steps), f"trainer.device={dev}"],
        )
        for p in ("delay", "flatten")
    ]
    return {
        "core": [("bench_encode.py", "encode.json", ["--device", dev, "--n-clips", str(args.encode_clips)]), *train],
        "pipeline": [("bench_pipeline.py", "pipeline.json", ["--device", dev, "--clips", str(args.pipeline_clips)])],
        "data": [
            ("bench_data.py", "data.json", [f"trainer.device={dev}"]),
            ("bench_ddp.py", "ddp.json", []),  # CPU gloo ranks: the order/reduction check, not a speed figure
        ],
        "onthefly": [("bench_onthefly.py", "onthefly.json", [f"trainer.device={dev}"])],
        # CPU by design (the closest this machine gets to mps_small)
        "realsize": [("bench_realsize.py", "realsize.json", ["--compare-towers"])],  # both towers, one after the other
        "memory": [("bench_memory.py", "realsize_memory.json", [])],  # CPU by design; each case in its own process
        "download": [("bench_download.py", "download.json", [])],
        "resample": [("bench_resample.py", "resample.json", [])],
        "gpu": [("bench_gpu.py", "gpu.json", ["--budget-s", args.gpu_budget_s] if args.gpu_budget_s else [])],
        "generate": [("bench_generate.py", "generate.json", [f"trainer.device={dev}"])],
        "mixture": [("bench_mixture.py", "mixture.json", [])],
        "byo": [
            (
                "bench_byo.py",
                "byo.json",
                ["--device", dev, "--tracks", str(args.byo_tracks), "--repeats", str(args.byo_repeats)],
            ),
        ],
        "remote": [("bench_remote.py", "remote.json", [f"trainer.device={dev}"])],
        "startup": [("bench_startup.py", "startup.json", [f"trainer.device={dev}"])],
    }


def clips_text(r: dict) -> str:
    """The "8 × 2.5-s clips" of a row: its clip count and mean clip length ("8 clips" for rows that did not record it)."""
    return f"{r['clips']} × {r['clip_seconds']:.3g}-s clips" if "clip_seconds" in r else f"{r['clips']} clips"


def table(rows: list[dict]) -> str:
    lines = ["| stage | setting | device | throughput | peak RSS |", "| --- | --- | --- | --- | --- |"]
    for r in rows:
        if r.get("stage") in SUMMARY_ONLY_STAGES or "peak_rss_mb" not in r:
            continue
        if r["stage"] == "pipeline":
            setting = f"{r['case']}, batch {r['batch_size']}, {r['threads']} threads, {clips_text(r)}"
            thr = f"{r['audio_s_per_s']:.2f} audio-s/s" if "audio_s_per_s" in r else f"{r['clips_per_s']:.1f} clips/s"
        elif r["stage"] == "encode":
            setting = f"{r['dtype']}, batch {r['batch_size']}, {clips_text(r)}"
            if "code_agreement_vs_fp32" in r:
                setting += f" (codes equal to fp32: {100 * r['code_agreement_vs_fp32']:.1f}%)"
            thr = f"{r['clips_per_s']:.2f} clips/s = {r['x_realtime']:.1f}× real time"
        elif r["stage"] == "train":
            setting = f"{r['experiment']}, {r['pattern']}, batch {r['batch_size']}, seq ≤ {r['max_seq_len']}, {r['precision']}"
            thr = f"{r['tokens_per_s']:.0f} positions/s ({r['s_per_step']:.2f} s/step)"
        else:
            continue
        if r.get("codec"):
            setting += f"; codec {r['codec']}"
        lines.append(f"| {r['stage']} | {setting} | {r['device']} | {thr} | {r['peak_rss_mb']:.0f} MB |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--train-steps", type=int, default=20)
    ap.add_argument("--encode-clips", type=int, default=8)
    # full-size codec: ~1.7 s per clip on 2 idle cores; fewer clips let the pipeline's fixed start-up dominate
    # 128 x 2.5-s demo clips = 320 audio-seconds; at 32 (80 s) codec load and worker start decide the ratios
    ap.add_argument("--pipeline-clips", type=int, default=128)
    ap.add_argument("--byo-tracks", type=int, default=6)  # 30-s tracks: 3 segments each
    ap.add_argument("--byo-repeats", type=int, default=2)  # byo/musiccaps pairs, interleaved
    ap.add_argument(
        "--codec",
        type=Path,
        default=Path("build/bench/codec"),
        help="the codec the encoding scripts measure (make bench: encodec_32khz's width, built by make bench-codec)",
    )
    ap.add_argument("--gpu-budget-s", default=None, help="bench_gpu.py --budget-s (default: bench_gpu.py's)")
    ap.add_argument(
        "--only",
        choices=["all", *GROUPS],
        default="all",
        help="measure one group and merge it into an existing results.json",
    )
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    want = selected_groups(args.only, cuda)
    if (cuda or "gpu" in want) and not torch.cuda.is_available():
        print(NO_CUDA)
        return
    OUT.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    summary: dict = {}

    def add(script: str, name: str, *script_args: str) -> None:
        if script in CODEC_SCRIPTS:
            script_args = (*script_args, "--codec", str(args.codec))
        r, s = run(script, OUT / name, *script_args)
        if script in CODEC_SCRIPTS:
            r = [{**row, "codec": codec_label(args.codec)} for row in r]
        clash = set(summary) & set(s)
        assert not clash, f"{script} repeats summary keys {sorted(clash)}"
        rows.extend(r)
        summary.update(s)

    scripts = plan(args)
    group_seconds: dict[str, float] = {}
    for group in want:
        t0 = time.perf_counter()
        for script, name, script_args in scripts[group]:
            add(script, name, *script_args)
        group_seconds[group] = time.perf_counter() - t0
        print(f"run_benchmarks: group {group} took {group_seconds[group]:.0f} s", flush=True)

    machine = f"{platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}"
    results = merge_results(OUT / "results.json", machine, rows, summary, group_seconds)
    summary_md = "\n".join(
        [
            "| summary key | value |",
            "| --- | --- |",
            *(f"| `{k}` | {v:.3g} |" for k, v in sorted(results["summary"].items())),
        ]
    )
    codec = f"Encoding figures (encode, pipeline, onthefly, byo): codec {codec_label(args.codec)}.\n\n"
    md = f"Machine: {machine}\n\n{codec}{table(results['rows'])}\n\n{summary_md}\n"
    (OUT / "results.json").write_text(json.dumps(results, indent=2))
    (OUT / "results.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
