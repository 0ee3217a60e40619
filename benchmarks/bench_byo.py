"""Your own audio vs MusicCaps: stage 1 on full-length tracks (source=audiocraft) against the same audio cut into 10-s
files (the MusicCaps source), same codec, batch size, threads and decode workers, in one run.

  byo_pipeline_vs_musiccaps   audio-s/s of `source=audiocraft` on `--track-seconds` stereo 44.1 kHz tracks, cut
                              into 10-s segments by the pipeline (a seek per segment, the track hashed once per
                              worker) / audio-s/s of the MusicCaps source on the same samples already cut into
                              10-s stereo 44.1 kHz files, one CSV row each. Target >= 0.95.

The cases alternate (byo, musiccaps, byo, musiccaps, ...), each in a fresh interpreter with a fresh out_dir; wall clock
includes loading the codec, as a user's run does. Each figure is total audio over total seconds of its repeats.

Usage: python benchmarks/bench_byo.py --out build/bench/byo.json [--tracks 6 --track-seconds 30 --repeats 2]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
MUSICCAPS_CSV = REPO / "data/musiccaps/musiccaps-public.csv"
SEGMENT_S = 10.0


def build_inputs(work: Path, tracks: int, track_seconds: float) -> tuple[Path, Path, Path]:
    """The stand-in corpus as an audiocraft manifest, and the same audio cut into 10-s files + a MusicCaps CSV."""
    import soundfile as sf

    from tokenizer_pipeline.demo.standin_corpus import build_corpus

    build_corpus(MUSICCAPS_CSV, work / "byo", tracks, 0.25, 0, track_seconds, "audiocraft", 44100, 2)
    manifest = work / "byo/data.jsonl"
    with MUSICCAPS_CSV.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields, real = reader.fieldnames, list(reader)
    cut_dir = work / "cut"
    cut_dir.mkdir()
    rows = []
    for line in manifest.read_text().splitlines():
        path = work / "byo" / json.loads(line)["path"]
        data, sr = sf.read(path, dtype="int16")  # [N, 2]
        n = int(SEGMENT_S * sr)
        for i in range(len(data) // n):  # the full segments the pipeline makes (no tail: track_seconds is a multiple)
            key = f"{path.stem}x{i}"
            sf.write(cut_dir / f"{key}.wav", data[i * n : (i + 1) * n], sr, subtype="PCM_16")
            rows.append(dict(real[len(rows)]) | {"ytid": key, "start_s": "0", "end_s": f"{SEGMENT_S:g}"})
    csv_path = work / "cut.csv"
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return manifest, csv_path, cut_dir


def case(args: argparse.Namespace) -> dict:
    """One run of the pipeline in this interpreter: --case byo or musiccaps."""
    from tokenizer_pipeline.config import CodecConfig, PipelineConfig, ShardConfig, SourceConfig, SplitConfig
    from tokenizer_pipeline.run.pipeline import run_pipeline

    work = Path(args.work)
    common = dict(
        out_dir=str(Path(args.scratch) / "out"), threads=args.threads, workers=args.workers,
        codec=CodecConfig(name_or_path=args.codec, device=args.device, batch_size=args.batch_size),
        shard=ShardConfig(max_samples=256),
    )  # fmt: skip
    if args.case == "byo":
        cfg = PipelineConfig(audio_dir=None, source=SourceConfig(kind="audiocraft", manifest=str(work / "byo/data.jsonl")),
                             split=SplitConfig(eval_fraction=0.0), **common)  # fmt: skip
    else:
        cfg = PipelineConfig(csv=str(work / "cut.csv"), audio_dir=str(work / "cut"), **common)
    t0 = time.perf_counter()
    res = run_pipeline(cfg, progress=False)
    secs = time.perf_counter() - t0
    assert res.exit_code == 0 and res.manifest.totals["failed"] == 0, res.message
    audio_s = res.manifest.totals["audio_seconds"]
    return {"case": args.case, "samples": res.manifest.totals["encoded"], "audio_s": audio_s, "seconds": secs,
            "audio_s_per_s": audio_s / secs}  # fmt: skip


def run_case(name: str, args: argparse.Namespace, work: Path, repeat: int) -> dict:
    result = work / f"{name}_{repeat}.json"
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        cmd = [sys.executable, str(HERE), "--case", name, "--work", str(work), "--scratch", scratch, "--result",
               str(result)]  # fmt: skip
        for k in ("codec", "batch_size", "threads", "device", "workers"):
            cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
        subprocess.run(cmd, check=True)
    row = json.loads(result.read_text()) | {"repeat": repeat}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--codec", default="build/demo/codec")
    ap.add_argument("--tracks", type=int, default=6)  # x 3 segments of 10 s; full-size codec ~1.7 s per segment
    ap.add_argument("--track-seconds", type=float, default=30.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch-size", default="auto")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--case", choices=["byo", "musiccaps"])
    ap.add_argument("--work")
    ap.add_argument("--scratch")
    ap.add_argument("--result")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.case:  # child process: one run
        Path(args.result).write_text(json.dumps(case(args) | {"threads": args.threads, "workers": args.workers}))
        return
    if args.track_seconds % SEGMENT_S:
        ap.error(f"--track-seconds must be a multiple of {SEGMENT_S:g} (both sides encode the same full segments)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_inputs(work, args.tracks, args.track_seconds)
        # ABBA order (byo first on even repeats, MusicCaps first on odd ones): the first run of an invocation pays for
        # cold file caches, and a drift in machine load would otherwise always favour one side
        order = lambda r: ("byo", "musiccaps") if r % 2 == 0 else ("musiccaps", "byo")
        rows = [run_case(name, args, work, r) for r in range(args.repeats) for name in order(r)]
    total = {
        n: [sum(r[k] for r in rows if r["case"] == n) for k in ("audio_s", "seconds")] for n in ("byo", "musiccaps")
    }
    rate = {n: a / s for n, (a, s) in total.items()}
    summary = {
        "byo_pipeline_vs_musiccaps": rate["byo"] / rate["musiccaps"],
        "byo_audio_s_per_s": rate["byo"],
        "byo_musiccaps_audio_s_per_s": rate["musiccaps"],
    }
    for r in rows:
        r["stage"] = "byo"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
