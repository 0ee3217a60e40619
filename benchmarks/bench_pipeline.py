"""Stage-1 pipeline benchmark: the run end to end against its ceilings and against the first version's design.

Every case runs in its own interpreter (peak RSS per case); the driver writes `{"rows": [...], "summary": {...}}`:
  pipeline_vs_encoder_bound   pipeline audio-s/s (run_pipeline, wall clock incl. codec load) / bare
                              `encode_batch` on the same clips already in memory (same batch, dtype, threads)
  pipeline_vs_first_version   / per-file encoding through MusicgenForConditionalGeneration.audio_encoder with
                              the processor's feature extractor and one np.save per clip (random weights,
                              the demo codec's real encodec_32khz size, built here)
  pipeline_rss_1000_vs_100    main-process peak RSS, 1,000 vs 100 clips, small random EncodecModel, one thread
  decode_workers_speedup_2v1  clips/s with a zero-cost encoder, 2 decode workers vs 1

`pipeline_vs_first_version` is one run of each on the same clips with the same `--threads`; the pipeline
runs with its defaults (`codec.batch_size=auto`, decode workers), its wall clock includes loading the codec,
the first version's excludes building its model.

Usage: python benchmarks/bench_pipeline.py --out build/bench/pipeline.json [--clips 24 --batch-size auto --threads 2]
       [--rss-clips 100 1000] [--zero-cost-clips 300]
(`--rss-clips` other than 100 1000 still writes the key pipeline_rss_1000_vs_100: larger / smaller, e.g. a smoke run)
"""

from __future__ import annotations

import argparse
import csv
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def subset_csv(corpus: Path, out: Path, n: int, seconds: float | None = None) -> tuple[Path, Path]:
    """A CSV of `n` rows and an audio dir of `n` links to the corpus's wavs (reused round-robin), each row's window
    as long as the clips (make demo's are 2.5 s, corpus.json says); with a shorter `seconds`, links to the first
    `seconds` of each wav instead, and windows of that length."""
    with (corpus / "musiccaps-subset.csv").open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields, base = reader.fieldnames, list(reader)
    with (Path(__file__).resolve().parents[1] / "data/musiccaps/musiccaps-public.csv").open(
        newline="", encoding="utf-8"
    ) as f:
        real = list(csv.DictReader(f))
    clip_s = float(json.loads((corpus / "corpus.json").read_text())["duration_s"])
    audio, src_dir = out / "audio", corpus
    audio.mkdir(parents=True, exist_ok=True)
    if seconds is not None and seconds < clip_s:
        import soundfile as sf

        src_dir = out / "cropped"
        src_dir.mkdir()
        for b in base:
            x, sr = sf.read(corpus / f"{b['ytid']}.wav", frames=int(seconds * 44100), dtype="int16")
            sf.write(src_dir / f"{b['ytid']}.wav", x, sr)
    window_s = min(seconds, clip_s) if seconds is not None else clip_s
    rows = []
    for i in range(n):  # real rows for real ids; every clip links to a corpus wav
        row = dict(real[i]) if n > len(base) else dict(base[i])
        # the CSV window must match the file (duration policy: else duration_mismatch)
        row["end_s"] = f"{float(row['start_s']) + window_s:g}"
        (audio / f"{row['ytid']}.wav").symlink_to((src_dir / f"{base[i % len(base)]['ytid']}.wav").resolve())
        rows.append(row)
    path = out / "rows.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return path, audio


def small_codec(out: Path) -> Path:
    """A small random-weight EncodecModel at 32 kHz / 50 Hz (4 codebooks x 64), like the tests' tiny codec."""
    from transformers import EncodecConfig, EncodecModel

    torch.manual_seed(0)
    cfg = EncodecConfig(sampling_rate=32000, target_bandwidths=[1.2], upsampling_ratios=[8, 5, 4, 4], num_filters=4,
                        hidden_size=16, codebook_size=64, use_causal_conv=False, num_lstm_layers=1, normalize=False)  # fmt: skip
    model = EncodecModel(cfg).eval()
    with torch.no_grad():
        for layer in model.quantizer.layers:
            layer.codebook.embed.normal_()  # [C, D]; random init leaves them all zero
    model.save_pretrained(out)
    return out


def batch_size(args: argparse.Namespace) -> int:
    """`--batch-size` as the pipeline resolves it (`auto` -> the table entry for `--device`)."""
    from tokenizer_pipeline.codec.encode import resolve_batch_size

    return resolve_batch_size(args.batch_size, torch.device(args.device).type)


def _pipeline_cfg(csv_path: Path, audio: Path, out: Path, codec: str, args: argparse.Namespace, **kw):
    from tokenizer_pipeline.config import CodecConfig, PipelineConfig, ShardConfig

    return PipelineConfig(
        csv=str(csv_path), audio_dir=str(audio), out_dir=str(out), threads=args.threads,
        codec=CodecConfig(name_or_path=codec, device=args.device, batch_size=args.batch_size),  # auto or an int
        shard=ShardConfig(max_samples=256), **kw,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------- cases


def case_encoder_bound(args: argparse.Namespace, work: Path) -> dict:
    from tokenizer_pipeline.audio.read_audio import load_audio
    from tokenizer_pipeline.codec.encode import CodecEncoder

    torch.set_num_threads(args.threads)
    csv_path, audio = subset_csv(Path(args.corpus), work, args.clips)
    enc = CodecEncoder(args.codec, device=args.device, dtype="float32")
    bs = batch_size(args)  # the pipeline's own number for this device (auto: encode.AUTO_BATCH_SIZE)
    wavs = [load_audio(p, enc.sampling_rate) for p in sorted(audio.iterdir())]  # each [N] float32, in memory
    enc.encode_batch(wavs[:bs])  # warm-up
    t0 = time.perf_counter()
    for i in range(0, len(wavs), bs):
        enc.encode_batch(wavs[i : i + bs])
    secs = time.perf_counter() - t0
    audio_s = sum(w.numel() for w in wavs) / enc.sampling_rate
    return {"case": "encoder_bound", "clips": len(wavs), "clip_seconds": audio_s / len(wavs), "seconds": secs,
            "audio_s_per_s": audio_s / secs}  # fmt: skip


def case_pipeline(args: argparse.Namespace, work: Path) -> dict:
    from tokenizer_pipeline.run.pipeline import run_pipeline

    csv_path, audio = subset_csv(Path(args.corpus), work, args.clips)
    t0 = time.perf_counter()
    res = run_pipeline(_pipeline_cfg(csv_path, audio, work / "out", args.codec, args), progress=False)
    secs = time.perf_counter() - t0
    assert res.manifest.totals["encoded"] == args.clips, res.message
    audio_s = res.manifest.totals["audio_seconds"]
    return {
        "case": "pipeline",
        "clips": args.clips,
        "clip_seconds": audio_s / args.clips,
        "seconds": secs,
        "audio_s_per_s": audio_s / secs,
        "workers": "default (CPU count)",
    }


def case_first_version(args: argparse.Namespace, work: Path) -> dict:
    """Per file: read, resample, processor, `audio_encoder.encode`, one np.save (the first version's loop)."""
    import soundfile as sf
    import torchaudio
    from transformers import EncodecConfig, EncodecFeatureExtractor, MusicgenConfig, MusicgenForConditionalGeneration

    torch.set_num_threads(args.threads)
    csv_path, audio = subset_csv(Path(args.corpus), work, args.clips)
    audio_cfg = EncodecConfig.from_pretrained(args.codec)  # real encodec_32khz size
    # text encoder and decoder are tiny: only audio_encoder runs here, and their size does not change its speed
    cfg = MusicgenConfig(
        text_encoder={"model_type": "t5", "vocab_size": 32, "d_model": 16, "d_ff": 32, "num_layers": 1, "num_heads": 2, "d_kv": 8},
        audio_encoder=audio_cfg.to_dict(),
        decoder={"model_type": "musicgen_decoder", "vocab_size": 2048, "hidden_size": 32, "num_hidden_layers": 1,
                 "num_attention_heads": 2, "ffn_dim": 64, "num_codebooks": 4},
    )  # fmt: skip
    torch.manual_seed(0)
    model = MusicgenForConditionalGeneration(cfg).eval()
    # MusicgenProcessor's audio half
    processor = EncodecFeatureExtractor(feature_size=1, sampling_rate=audio_cfg.sampling_rate)
    # the pipeline's default bandwidth, the codec's smallest: 2.2 kbps = 4 codebooks for encodec_32khz and the demo codec
    bandwidth = min(float(b) for b in audio_cfg.target_bandwidths)
    npy = work / "npy"
    npy.mkdir()
    files = sorted(audio.iterdir())
    t0 = time.perf_counter()
    audio_s = 0.0
    with torch.inference_mode():
        for p in files:
            x, sr = sf.read(p, dtype="float32")  # [N]
            x = torchaudio.functional.resample(torch.from_numpy(x), sr, audio_cfg.sampling_rate)  # [N'] at 32 kHz
            audio_s += x.numel() / audio_cfg.sampling_rate
            inputs = processor(raw_audio=x.numpy(), sampling_rate=audio_cfg.sampling_rate, return_tensors="pt")
            enc = model.audio_encoder.encode(inputs["input_values"], inputs["padding_mask"], bandwidth=bandwidth)
            np.save(npy / f"{p.stem}.npy", enc.audio_codes[0, 0].numpy().astype(np.int16))  # [K, T]
    secs = time.perf_counter() - t0
    return {"case": "first_version", "clips": len(files), "clip_seconds": audio_s / len(files), "seconds": secs,
            "audio_s_per_s": audio_s / secs}  # fmt: skip


def case_rss(args: argparse.Namespace, work: Path) -> dict:
    from tokenizer_pipeline.run.pipeline import run_pipeline

    codec = small_codec(work / "codec")
    # 1-s clips: what grows with the number of clips is per-clip bookkeeping, not audio (bounded per batch)
    csv_path, audio = subset_csv(Path(args.corpus), work, args.clips, seconds=1.0)
    t0 = time.perf_counter()
    res = run_pipeline(_pipeline_cfg(csv_path, audio, work / "out", str(codec), args, min_seconds=0.5), progress=False)
    secs = time.perf_counter() - t0
    assert res.manifest.totals["encoded"] == args.clips, res.message
    return {
        "case": f"rss_{args.clips}",
        "clip_seconds": 1.0,
        "clips": args.clips,
        "seconds": secs,
        "clips_per_s": args.clips / secs,
        "workers_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def case_zero_cost(args: argparse.Namespace, work: Path) -> dict:
    """The decode ceiling: the encoder returns zeros instantly; everything else (find, hash, decode,
    resample, batching, tar writing, manifest) is the real pipeline."""
    import tokenizer_pipeline.run.pipeline as run
    from tokenizer_pipeline.codec.encode import CodecEncoder

    class ZeroCostEncoder(CodecEncoder):
        def encode_batch(self, wavs):  # each [N] -> zeros [T, K]
            return [np.zeros((self.n_frames(int(w.shape[-1])), self.n_codebooks), np.int16) for w in wavs]

    codec = small_codec(work / "codec")
    run.load_encoder = lambda cfg: ZeroCostEncoder(cfg.codec.name_or_path, device="cpu")
    csv_path, audio = subset_csv(Path(args.corpus), work, args.clips)
    cfg = _pipeline_cfg(csv_path, audio, work / "out", str(codec), args, workers=args.workers, min_seconds=1.0)
    t0 = time.perf_counter()
    res = run.run_pipeline(cfg, progress=False)
    secs = time.perf_counter() - t0
    assert res.manifest.totals["encoded"] == args.clips, res.message
    return {
        "case": f"zero_cost_{args.workers}_workers",
        "clips": args.clips,
        "clip_seconds": res.manifest.totals["audio_seconds"] / args.clips,
        "seconds": secs,
        "clips_per_s": args.clips / secs,
    }


CASES = {"encoder_bound": case_encoder_bound, "pipeline": case_pipeline, "first_version": case_first_version,
         "rss": case_rss, "zero_cost": case_zero_cost}  # fmt: skip


def run_case(name: str, args: argparse.Namespace, **overrides: object) -> dict:
    """One case in a fresh interpreter; its dict comes back through a JSON file (also kept next to --out)."""
    opts = vars(args) | overrides
    out = Path(args.out).with_suffix("") / f"{name}_{opts['clips']}_{opts['workers']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(HERE), "--case", name, "--result", str(out)]
    for k in ("codec", "corpus", "clips", "batch_size", "threads", "device", "workers"):
        cmd += [f"--{k.replace('_', '-')}", str(opts[k])]
    subprocess.run(cmd, check=True)
    print(out.read_text(), flush=True)
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--codec", default="build/demo/codec")
    ap.add_argument("--corpus", default="build/demo/corpus")
    ap.add_argument("--clips", type=int, default=24)  # full-size codec cases: ~1.7 s per 10-s clip on 2 CPU cores
    # auto (the pipeline's default): the device's number from encode.AUTO_BATCH_SIZE, in the pipeline and the
    # encoder-bound case alike; the first version always encodes one clip per forward (its design)
    ap.add_argument("--batch-size", default="auto")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--zero-cost-clips", type=int, default=300)
    ap.add_argument("--rss-clips", type=int, nargs=2, default=[100, 1000], metavar=("SMALL", "LARGE"))
    ap.add_argument("--case", choices=sorted(CASES))
    ap.add_argument("--result")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.case:  # child process: one case
        with tempfile.TemporaryDirectory() as tmp:
            r = CASES[args.case](args, Path(tmp))
        r |= {
            "peak_rss_mb": peak_rss_mb(),
            "device": args.device,
            "threads": args.threads,
            "batch_size": 1 if args.case == "first_version" else batch_size(args),
        }
        Path(args.result).write_text(json.dumps(r))
        return

    rows = [run_case("encoder_bound", args), run_case("pipeline", args), run_case("first_version", args)]
    # a memory figure of a small codec: one intra-op thread. With two on 2 cores, its tiny ops wait at OpenMP barriers
    # whenever another process holds a core (300 clips beside one busy process: 3.6 clips/s with two threads, 96 with one)
    small, large = args.rss_clips
    rows += [run_case("rss", args, clips=small, threads=1), run_case("rss", args, clips=large, threads=1)]
    rows += [run_case("zero_cost", args, clips=args.zero_cost_clips, workers=w) for w in (1, 2)]
    by = {r["case"]: r for r in rows}
    summary = {
        "pipeline_vs_encoder_bound": by["pipeline"]["audio_s_per_s"] / by["encoder_bound"]["audio_s_per_s"],
        "pipeline_vs_first_version": by["pipeline"]["audio_s_per_s"] / by["first_version"]["audio_s_per_s"],
        "pipeline_peak_rss_mb": by["pipeline"]["peak_rss_mb"],
        "first_version_peak_rss_mb": by["first_version"]["peak_rss_mb"],
        "pipeline_rss_1000_vs_100": by[f"rss_{large}"]["peak_rss_mb"] / by[f"rss_{small}"]["peak_rss_mb"],
        "decode_workers_speedup_2v1": by["zero_cost_2_workers"]["clips_per_s"]
        / by["zero_cost_1_workers"]["clips_per_s"],
        "zero_cost_clips_per_s_per_worker": {
            "1": by["zero_cost_1_workers"]["clips_per_s"],
            "2": by["zero_cost_2_workers"]["clips_per_s"] / 2,
        },
    }
    for r in rows:
        r["stage"] = "pipeline"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "summary": summary}, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
