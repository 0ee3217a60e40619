"""Helpers for the tokenizer_pipeline tests: a tiny random-weights EnCodec saved with save_pretrained
(so the from_pretrained path runs) and a few generated clips for real MusicCaps CSV rows."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from tests import REPO
from tokenizer_pipeline.config import CodecConfig, PipelineConfig, ShardConfig

MUSICCAPS_CSV = REPO / "data" / "musiccaps" / "musiccaps-public.csv"


def make_tiny_codec(out: Path, seed: int = 0, codebook_size: int = 64) -> Path:
    """32 kHz, hop 640 (50 Hz), 4 codebooks of `codebook_size` (64) at 1.2 kbps, non-causal like encodec_32khz.

    Random init leaves the RVQ codebooks all zero (every code 0), so they are set to random
    vectors scaled to the encoder's output statistics; codes then vary with the audio.
    """
    from transformers import EncodecConfig, EncodecFeatureExtractor, EncodecModel

    torch.manual_seed(seed)
    kbps = 4 * 50 * math.log2(codebook_size) / 1000  # 4 codebooks at 50 Hz (1.2 kbps for 64 codes, 2.2 for 2048)
    cfg = EncodecConfig(
        sampling_rate=32000, target_bandwidths=[kbps], upsampling_ratios=[8, 5, 4, 4], num_filters=4,
        hidden_size=16, codebook_size=codebook_size, use_causal_conv=False, num_lstm_layers=1, normalize=False,
    )  # fmt: skip
    model = EncodecModel(cfg).eval()
    with torch.no_grad():
        emb = model.encoder(torch.randn(2, 1, 32000) * 0.3)  # [B, D, T]
        mu, sd = emb.mean(dim=(0, 2)), emb.std(dim=(0, 2))  # [D]
        for layer in model.quantizer.layers:
            layer.codebook.embed.copy_(mu + sd * torch.randn_like(layer.codebook.embed))  # [C, D]
            mu, sd = mu * 0, sd * 0.5  # residual stages see smaller vectors
    model.save_pretrained(out)
    EncodecFeatureExtractor(feature_size=1, sampling_rate=32000).save_pretrained(out)
    return out


def make_corpus(
    out: Path, n_train: int = 4, n_eval: int = 3, sr: int = 16000, seconds: float = 1.0
) -> tuple[Path, Path, list[dict[str, str]]]:
    """First `n_train`/`n_eval` rows of the real CSV, each with a generated mono wav `{ytid}.wav`.

    Each row's window is shortened to `[start_s, start_s + seconds]` so that the clips pass the
    duration policy (their lengths differ by a few ms, within `duration_tolerance_s`).

    Returns (csv path, audio dir, the raw CSV rows written, in order).
    """
    with MUSICCAPS_CSV.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        fields = reader.fieldnames
        train, evals = [], []
        for row in reader:
            (evals if row["is_audioset_eval"] == "True" else train).append(row)
            if len(train) >= n_train and len(evals) >= n_eval:
                break
    rows = _merge(train[:n_train], evals[:n_eval])
    for r in rows:  # windows as long as the generated clips (a real download is the window's length)
        r["end_s"] = f"{float(r['start_s']) + seconds:g}"
    audio_dir = out / "audio"
    audio_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out / "subset.csv"
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    rng = np.random.default_rng(0)
    for i, r in enumerate(rows):
        n = int(sr * seconds) - 37 * i  # slightly different lengths, as real downloads have
        t = np.arange(n) / sr
        x = 0.3 * np.sin(2 * np.pi * (220 + 40 * i) * t) + 0.05 * rng.standard_normal(n)  # [N]
        sf.write(audio_dir / f"{r['ytid']}.wav", x.astype(np.float32), sr)
    return csv_path, audio_dir, rows


def _merge(train: list[dict], evals: list[dict]) -> list[dict]:
    # both lists are in CSV order; re-read the CSV to interleave them exactly as the file does
    order = {}
    with MUSICCAPS_CSV.open(newline="", encoding="utf-8") as f:
        for i, row in enumerate(csv.DictReader(f)):
            order.setdefault(row["ytid"], i)
    return sorted(train + evals, key=lambda r: order[r["ytid"]])


def pipeline_config(csv_path: Path, audio_dir: Path, out_dir: Path, codec_dir: Path, **overrides) -> PipelineConfig:
    cfg = PipelineConfig(
        csv=str(csv_path), audio_dir=str(audio_dir), out_dir=str(out_dir), min_seconds=0.5,
        workers=0,  # decode in-process: forking workers costs more than these 1-s clips (test_run covers 1 and 2)
        codec=CodecConfig(name_or_path=str(codec_dir), device="cpu", batch_size=3),
        shard=ShardConfig(max_samples=2),
    )  # fmt: skip
    return replace(cfg, **overrides)
