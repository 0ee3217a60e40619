"""The inputs of `python -m adapter_trainer.audio_metrics`, checked: audio files, captions, frame embeddings.

Every bad input is an `AudioMetricsError` naming the file (and line) and the fix. Audio is read with soundfile, averaged
to mono, optionally loudness-normalised (audiocraft's `normalize_loudness`) and resampled with soxr (VHQ).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from adapter_trainer.errors import UserError

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")  # what soundfile reads; matched case-insensitively
MIN_SECONDS = 0.025  # shorter clips are refused: one 25-ms analysis window of the classifier's filterbank
LOUDNESS_BLOCK_S = 0.4  # BS.1770's gating block: loudness is undefined for shorter audio
TARGET_LUFS = -14.0  # audiocraft's MusicGen evaluation: generate.audio.strategy=loudness, loudness_headroom_db=14
ENERGY_FLOOR = 2e-3  # audiocraft's normalize_loudness: quieter audio (RMS) is left as it is
GENERATED_KEY = re.compile(r"^gen-\d{4}-(.+)$")  # adapter_trainer.generate's keys: gen-NNNN-<source key>


class AudioMetricsError(UserError, ValueError):
    """Missing or inconsistent wavs / captions / embeddings; the message names the file and the fix."""


@dataclass
class Clip:
    """A generated clip: its audio file, the caption it was generated from, and its KL partner."""

    key: str
    wav: Path
    caption: str = ""
    reference_key: str = ""  # the reference clip it is paired with for the KL ("" = none)


@dataclass(frozen=True)
class Audio:
    """One mono clip at its file's rate, after the optional loudness normalisation."""

    wave: np.ndarray  # [N] float32
    sample_rate: int
    loudness_lufs: float | None  # measured before normalisation (None: shorter than one block, or all gated)
    gain_db: float | None  # applied gain (None: not normalised)


def list_audio(directory: Path, what: str, suffixes: tuple[str, ...] = (".wav",)) -> dict[str, Path]:
    """`<key>.<suffix>` files of a directory (suffix in any case), sorted by key; two files of one key refused."""
    if not directory.is_dir():
        raise AudioMetricsError(
            f"{what} {directory} is not a directory; decode the clips first (python -m tokenizer_pipeline.decode "
            f"<shard set> out_dir={directory})"
        )
    found: dict[str, Path] = {}
    for p in sorted(directory.iterdir()):
        if p.is_file() and p.suffix.lower() in suffixes:
            if p.stem in found:
                raise AudioMetricsError(f"{what} {directory}: {found[p.stem].name} and {p.name} are one key; keep one")
            found[p.stem] = p
    if len(found) < 2:
        raise AudioMetricsError(
            f"{what} {directory} holds {len(found)} audio file(s) ({'/'.join(suffixes)}); the metrics need at least 2"
        )
    return dict(sorted(found.items()))


def read_captions(path: Path) -> dict[str, dict[str, str]]:
    """JSONL lines {"key", "caption"[, "source_key"]} -> {key: line}."""
    if not path.is_file():
        raise AudioMetricsError(
            f"--captions {path} does not exist; adapter_trainer.generate writes captions.jsonl in its out_dir "
            f"(one JSON line per clip: key, caption, source_key)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise AudioMetricsError(f"--captions {path} line {line}: not UTF-8 ({e.reason}); save the file as UTF-8") from e
    out: dict[str, dict[str, str]] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise AudioMetricsError(
                f'{path} line {n}: not JSON ({e.msg}); expected {{"key": ..., "caption": ...}}'
            ) from e
        if not isinstance(row, dict) or not isinstance(row.get("key"), str) or not isinstance(row.get("caption"), str):
            raise AudioMetricsError(f'{path} line {n}: needs string fields "key" and "caption", got {line[:120]!r}')
        if row["key"] in out:
            raise AudioMetricsError(f"{path} line {n}: key {row['key']!r} appears twice")
        out[row["key"]] = row
    return out


def source_key_of(key: str, row: dict[str, Any]) -> str:
    """The reference key a generated clip pairs with: its caption row's source_key, else the key's tail."""
    if row.get("source_key"):
        return str(row["source_key"])
    m = GENERATED_KEY.match(key)
    return m.group(1) if m else ""


def pair_clips(
    generated: dict[str, Path], reference: dict[str, Path], captions: dict[str, dict], captions_path: Path
) -> list[Clip]:
    """Generated wavs with their captions and KL partners: one caption line per wav and one wav per line."""
    missing = [k for k in generated if k not in captions]
    if missing:
        raise AudioMetricsError(
            f"{len(missing)} generated clip(s) have no caption line (first: {missing[:3]}); --captions must hold "
            f"one line per generated wav (the captions.jsonl of the generated set they were decoded from)"
        )
    orphans = [k for k in captions if k not in generated]
    if orphans:
        raise AudioMetricsError(
            f"{captions_path}: {len(orphans)} caption line(s) have no generated wav (first: {orphans[:3]}); decode "
            f"every clip of the generated set, or pass a captions file with only the decoded clips' lines"
        )
    clips = []
    for key, wav in generated.items():
        ref = source_key_of(key, captions[key])
        clips.append(
            Clip(key=key, wav=wav, caption=captions[key]["caption"], reference_key=ref if ref in reference else "")
        )
    return clips


def read_audio(path: Path, window: tuple[float, float] | None = None) -> tuple[np.ndarray, int]:
    """An audio file (or its [start_s, end_s) window) -> mono float32 [N] at its rate; readable, long enough, finite."""
    import soundfile as sf

    try:
        with sf.SoundFile(path) as f:
            sr = f.samplerate
            if window is not None:
                f.seek(min(int(round(window[0] * sr)), f.frames))
                frames = int(round((window[1] - window[0]) * sr))
            else:
                frames = -1
            data = f.read(frames=frames, dtype="float32", always_2d=True)  # [N, C]
    except (sf.LibsndfileError, RuntimeError, OSError, ValueError) as e:
        raise AudioMetricsError(
            f"{path}: not a readable audio file ({str(e).splitlines()[0]}); decode or convert it again"
        ) from e
    mono = data.mean(axis=1)  # [N]
    if len(mono) < MIN_SECONDS * sr:
        where = "" if window is None else f" (window {window[0]:g}-{window[1]:g} s)"
        raise AudioMetricsError(
            f"{path}{where}: {len(mono)} samples ({len(mono) / sr * 1000:.1f} ms), under the {MIN_SECONDS * 1000:.0f} "
            f"ms a clip needs; leave it out or decode it again"
        )
    if not np.isfinite(mono).all():
        bad = int((~np.isfinite(mono)).sum())
        raise AudioMetricsError(
            f"{path}: {bad} NaN/Inf samples (first at {np.argmax(~np.isfinite(mono))}); decode it again"
        )
    return np.ascontiguousarray(mono, dtype=np.float32), int(sr)


def normalise_loudness(wave: np.ndarray, sample_rate: int, path: Path) -> Audio:
    """audiocraft's normalize_loudness on a mono clip [N]: gain to TARGET_LUFS (BS.1770), unless its RMS is under
    ENERGY_FLOOR or every block is gated; clamped to [-1, 1]."""
    import torch
    import torchaudio.functional as F

    if len(wave) < LOUDNESS_BLOCK_S * sample_rate:
        raise AudioMetricsError(
            f"{path}: {len(wave) / sample_rate:.3f} s, shorter than the {LOUDNESS_BLOCK_S} s block that loudness "
            f"(ITU-R BS.1770) needs; pass --normalise none to compare such short clips unnormalised"
        )
    if float(np.sqrt(np.mean(np.square(wave, dtype=np.float64)))) < ENERGY_FLOOR:
        return Audio(wave, sample_rate, None, None)
    lufs = float(F.loudness(torch.from_numpy(wave)[None], sample_rate))  # [1, N] -> scalar
    if not math.isfinite(lufs):
        return Audio(wave, sample_rate, None, None)
    gain_db = TARGET_LUFS - lufs
    out = np.clip(wave * np.float32(10.0 ** (gain_db / 20.0)), -1.0, 1.0).astype(np.float32)  # [N]
    return Audio(out, sample_rate, lufs, gain_db)


def resample(wave: np.ndarray, sr: int, target: int) -> np.ndarray:
    """[N] at sr -> [N * target / sr] float32 (soxr VHQ, the pipeline's resampler)."""
    import soxr

    if sr == target:
        return wave
    return np.ascontiguousarray(soxr.resample(wave, sr, target, quality="VHQ"), dtype=np.float32)


def load_frame_embeddings(path: Path, wav_keys: list[str], what: str) -> np.ndarray:
    """A `tokenizer_pipeline.codec_embeddings` .npy -> [frames, D] float64; its .json sidecar's keys, when there,
    must be `wav_keys`."""
    if not path.is_file():
        raise AudioMetricsError(
            f"{what} {path} does not exist; write it with python -m tokenizer_pipeline.codec_embeddings <wav dir> "
            f"--codec <codec dir> --out {path}"
        )
    try:
        emb = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise AudioMetricsError(f"{what} {path}: not a readable .npy ({e}); write it again") from e
    if emb.ndim != 2 or emb.shape[0] < 2 or not np.issubdtype(emb.dtype, np.floating):
        raise AudioMetricsError(
            f"{what} {path}: expected float embeddings [frames >= 2, D], got {emb.dtype} {emb.shape}"
        )
    if not np.isfinite(emb).all():
        row = int(np.argmax(~np.isfinite(emb).all(axis=1)))
        raise AudioMetricsError(f"{what} {path}: NaN/Inf in frame {row}; recompute the embeddings from the wavs")
    sidecar = path.with_suffix(".json")
    if sidecar.is_file():
        keys = _sidecar_keys(sidecar, what)
        if sorted(keys) != sorted(wav_keys):
            extra, missing = sorted(set(keys) - set(wav_keys)), sorted(set(wav_keys) - set(keys))
            raise AudioMetricsError(
                f"{what} {path} was computed from other clips than the wavs it is compared as ({sidecar}: "
                f"{len(extra)} keys not among the wavs, first {extra[:3]}; {len(missing)} wavs missing, first "
                f"{missing[:3]}); recompute it from the same directory"
            )
    return emb.astype(np.float64)  # [frames, D]


def _sidecar_keys(sidecar: Path, what: str) -> list[str]:
    """The clip keys of a codec_embeddings .json sidecar ({"clips": [{"key", "frames"}, ...]})."""
    try:
        clips = json.loads(sidecar.read_text(encoding="utf-8"))["clips"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise AudioMetricsError(
            f'{what} sidecar {sidecar}: not the codec_embeddings JSON {{"clips": [{{"key": ...}}, ...]}} '
            f"({type(e).__name__}: {e}); write it again with tokenizer_pipeline.codec_embeddings"
        ) from e
    bad = [i for i, c in enumerate(clips) if not isinstance(c, dict) or not isinstance(c.get("key"), str)]
    if bad:
        raise AudioMetricsError(
            f'{what} sidecar {sidecar}: clip entry {bad[0]} has no string "key"; write it again with '
            f"tokenizer_pipeline.codec_embeddings"
        )
    return [c["key"] for c in clips]
