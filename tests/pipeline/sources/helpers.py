"""Tiny your-own-audio layouts for the source tests: full-length tracks (stereo 44.1 kHz by default) written as an
audiocraft manifest + sidecars or as a Hugging Face audiofolder."""

from __future__ import annotations

import csv
import gzip
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import soundfile as sf

from tokenizer_pipeline.config import CodecConfig, PipelineConfig, SegmentConfig, ShardConfig, SourceConfig


def write_track(path: Path, seconds: float, sr: int = 44100, channels: int = 2, seed: int = 0) -> Path:
    """A tone + noise track whose content changes over time (so segments differ); int16 wav."""
    rng = np.random.default_rng(seed)
    n = int(round(seconds * sr))
    t = np.arange(n) / sr
    f = 220.0 * (1 + seed % 5) * (1 + 0.2 * np.floor(t / 3.0))  # [N] a step every 3 s
    x = 0.3 * np.sin(2 * np.pi * f * t) + 0.02 * rng.standard_normal(n)  # [N]
    y = np.stack([x, 0.8 * x][:channels], axis=1)  # [N, C]
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, y.astype(np.float32), sr, subtype="PCM_16")
    return path


def audiocraft_line(path: str, seconds: float, sr: int = 44100, weight: float | None = None) -> dict:
    """One line of audiocraft's manifest (AudioMeta.to_dict())."""
    return {
        "path": path,
        "duration": seconds,
        "sample_rate": sr,
        "amplitude": None,
        "weight": weight,
        "info_path": None,
    }


def audiocraft_writer(folder: Path, manifest: Path) -> Path:
    """What `python -m audiocraft.data.audio_dataset <folder> <manifest>` writes (audiocraft 1.3.0 find_audio_files +
    save_audio_meta, read from its source: it is not installable here, see the module docstring of audiocraft.py):
    os.walk over the folder (so an absolute folder gives absolute paths, a non-UTF-8 byte a '\\udcXX' surrogate),
    sorted, one `json.dumps(AudioMeta.to_dict())` per line."""
    paths = sorted(Path(root) / f for root, _, files in os.walk(folder, followlinks=True) for f in files
                   if f.endswith((".wav", ".mp3", ".flac", ".ogg", ".m4a")))  # audiocraft's DEFAULT_EXTS  # fmt: skip
    return write_manifest(manifest, [audiocraft_line(str(p), 1.0, 16000) for p in paths])


def write_manifest(path: Path, lines: list[dict], gz: bool = False) -> Path:
    text = "".join(json.dumps(d) + "\n" for d in lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode(), mtime=0) if gz else text.encode())
    return path


def make_audiocraft(root: Path, tracks: list[dict], gz: bool = False) -> Path:
    """tracks: {"name", "seconds", optional "sidecar" (dict), "weight", "sr", "channels", "declared"}; returns the
    manifest (root/egs/data.jsonl[.gz]) naming the audio next to it by absolute paths, as audiocraft's writer does
    when given an absolute folder."""
    egs = root / "egs"
    lines = []
    for i, t in enumerate(tracks):
        audio = (egs / t["name"]).absolute()
        write_track(audio, t["seconds"], t.get("sr", 44100), t.get("channels", 2), seed=i)
        if t.get("sidecar") is not None:
            audio.with_suffix(".json").write_text(json.dumps(t["sidecar"]))
        lines.append(audiocraft_line(str(audio), t.get("declared", t["seconds"]), t.get("sr", 44100), t.get("weight")))
    return write_manifest(egs / ("data.jsonl.gz" if gz else "data.jsonl"), lines, gz)


def make_audiofolder(root: Path, rows: dict[str, list[dict]], fmt: str = "csv", seconds: float = 3.0) -> Path:
    """rows: folder ("" = root, "train", "test", ...) -> metadata rows (each with file_name); writes the audio and the
    folder's metadata.csv / metadata.jsonl."""
    for k, (folder, metas) in enumerate(rows.items()):
        d = root / folder if folder else root
        for i, r in enumerate(metas):
            write_track(d / r["file_name"], r.pop("_seconds", seconds), seed=10 * k + i)
        d.mkdir(parents=True, exist_ok=True)
        if fmt == "csv":
            cols = list(dict.fromkeys(c for r in metas for c in r))
            with (d / "metadata.csv").open("w", newline="", encoding="utf-8") as f:
                w = csv.DictWriter(f, fieldnames=cols)
                w.writeheader()
                w.writerows(metas)
        else:
            (d / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metas), encoding="utf-8")
    return root


def source_config(kind: str, where: Path, out_dir: Path, codec_dir: Path, **overrides) -> PipelineConfig:
    """A config as `source=<kind>` composes it, for the tiny codec, in-process decoding and 2-sample shards."""
    src = SourceConfig(kind=kind, manifest=str(where) if kind == "audiocraft" else None,
                       dir=str(where) if kind == "audiofolder" else None,
                       caption_column="description" if kind == "audiocraft" else "caption")  # fmt: skip
    cfg = PipelineConfig(
        audio_dir=None, out_dir=str(out_dir), workers=0, source=src, segment=SegmentConfig(),
        codec=CodecConfig(name_or_path=str(codec_dir), device="cpu", batch_size=3), shard=ShardConfig(max_samples=2),
    )  # fmt: skip
    return replace(cfg, **overrides)


def samples(out: Path) -> dict[str, dict]:
    """key -> sample json of every sample in the set (manifest order)."""
    import tarfile

    m = json.loads((out / "manifest.json").read_text())
    found = {}
    for s in m["splits"].values():
        for e in s["shards"]:
            with tarfile.open(out / e["path"]) as tar:
                for member in tar:
                    if member.name.endswith(".json"):
                        found[member.name.split(".")[0]] = json.loads(tar.extractfile(member).read())  # type: ignore[union-attr]
    return found


def failures(out: Path) -> dict[str, dict]:
    return {f["ytid"]: f for f in map(json.loads, (out / "failures.jsonl").read_text().splitlines())}


def snapshot(d: Path) -> dict[str, bytes]:
    return {
        p.relative_to(d).as_posix(): p.read_bytes()
        for p in sorted(d.rglob("*"))
        if p.is_file() and ".progress" not in p.parts and p.name != ".lock"
    }
