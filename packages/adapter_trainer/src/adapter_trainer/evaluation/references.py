"""Where `audio_metrics` reads its reference clips: a directory of audio files (`--reference`), or the original audio
of an own-audio shard set (`--reference-shards`: each sample's `source_file` over its `[start_s, end_s)` window, read
from the samples' `<key>.json` members only).
"""

from __future__ import annotations

import argparse
import json
import tarfile
from pathlib import Path

from adapter_trainer.data.shards import open_tar, read_manifest
from adapter_trainer.evaluation.audio_inputs import AUDIO_SUFFIXES, AudioMetricsError, list_audio

Source = tuple[Path, tuple[float, float] | None]  # an audio file and its window in seconds (None: the whole file)


def reference_sources(args: argparse.Namespace) -> tuple[dict[str, Source], str]:
    """The references the options name -> ({key: (file, window)}, "codec-reconstruction" | "original")."""
    if args.reference:
        found = list_audio(Path(args.reference), "--reference", AUDIO_SUFFIXES)
        return {k: (p, None) for k, p in found.items()}, args.reference_kind
    return shard_originals(Path(args.reference_shards), args.reference_split, Path(args.audio_root)), "original"


def shard_originals(shards: Path, split: str, audio_root: Path) -> dict[str, Source]:
    """Every sample of `split`: its key -> (audio_root / source_file, (start_s, end_s)), each file checked to exist."""
    shard_set = read_manifest(shards)  # ShardFormatError (a UserError) on a bad set
    if split not in shard_set.splits:
        raise AudioMetricsError(
            f"--reference-shards {shards} has no split {split!r} (it has {sorted(shard_set.splits)})"
        )
    out: dict[str, Source] = {}
    for entry in shard_set.splits[split]:
        with open_tar(entry) as held, tarfile.open(None, "r", fileobj=held) as tar:
            for member in tar:
                if not member.name.endswith(".json"):
                    continue
                where = f"{entry.location} member {member.name}"
                f = tar.extractfile(member)
                try:
                    sample = json.loads(f.read().decode("utf-8")) if f else None
                except (UnicodeDecodeError, json.JSONDecodeError) as e:
                    raise AudioMetricsError(f"{where}: not UTF-8 JSON ({e}); re-make the shard set") from e
                out.update([_source(sample, audio_root, where)])
    if len(out) < 2:
        raise AudioMetricsError(f"--reference-shards {shards} split {split!r} has {len(out)} sample(s); need >= 2")
    return dict(sorted(out.items()))


def _source(sample: object, audio_root: Path, where: str) -> tuple[str, Source]:
    """One sample json -> (key, (file, window)); a sample without its source or window is refused."""
    ok = isinstance(sample, dict) and all(
        isinstance(sample.get(k), t) for k, t in (("ytid", str), ("source_file", str), ("start_s", (int, float)))
    )
    if not ok or not sample["source_file"] or not isinstance(sample.get("end_s"), (int, float)):
        raise AudioMetricsError(
            f"{where}: no source_file / start_s / end_s (a generated set, or a sample without its source); pass "
            f"the shard set made from the audio, or --reference with the audio files"
        )
    path = Path(sample["source_file"])
    path = path if path.is_absolute() else audio_root / path
    if not path.is_file():
        raise AudioMetricsError(
            f"{where}: its source {path} does not exist; --audio-root must be the directory source_file is "
            f"relative to (the source's folder or audiocraft manifest directory)"
        )
    return sample["ytid"], (path, (float(sample["start_s"]), float(sample["end_s"])))
