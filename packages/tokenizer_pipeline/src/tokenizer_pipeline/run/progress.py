"""Resume and heal: `<out>/.progress/` (the run's fingerprint, one record per completed shard) and the redo rule.

A rerun skips a shard whose tar still matches its recorded sha256 and whose inputs did not change, and redoes the rest
(`why_redo`). `.progress/` stays after the set is complete so a later rerun heals only what changed.
"""

from __future__ import annotations

import functools
import io
import json
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..audio.ffmpeg_binary import FFmpegNotFoundError, find_ffmpeg
from ..audio.read_audio import ClipFailure, find_audio
from ..config import PipelineConfig
from ..errors import PipelineError
from ..shards.manifest import FailureRecord, ShardEntry, dumps_strict, write_text_atomic
from ..shards.write_shards import ShardPlan, sha256_file
from ..sources.plan import SegmentItem
from .segment_items import segment_identity, sha256_cached

PROGRESS_DIR = ".progress"
FINGERPRINT_FILE = "config.json"
LOCK_FILE = ".lock"
# fingerprint keys written for the next run to read but never compared: the id root your own audio's keys are
# relative to (a run into this set keeps it while it holds a track, kept.py; one that moved keys redoes their shards)
RECORDED_ONLY = ("source_root",)


@dataclass(frozen=True)
class ShardRecord:
    """`.progress/<split>-shard-NNNNNN.json`: what a completed shard holds, for resume and the manifest."""

    entry: ShardEntry
    audio_seconds: float  # sum of the samples' duration_s
    n_frames: int  # sum of the samples' n_frames
    failures: list[FailureRecord]  # rows of this shard that produced no sample
    inputs: dict[str, list[str | None]]  # ytid -> [source file relative to audio_dir, sha256]; [None, None] = no file

    def to_json(self) -> str:
        return dumps_strict(asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ShardRecord:
        d = json.loads(text)
        return cls(**d | {"entry": ShardEntry(**d["entry"]), "failures": [FailureRecord(**f) for f in d["failures"]]})


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}, to name exactly which fingerprint keys changed."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


class ProgressStore:
    """`<out>/.progress/`: the config fingerprint and one record per completed shard."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.dir = out_dir / PROGRESS_DIR

    def prepare(self, fingerprint: dict[str, Any], split_names: Iterable[str], overwrite: bool) -> None:
        """Make `out_dir` ready: fresh, resumable with the same fingerprint, or cleared by overwrite.

        Raises PipelineError when `out_dir` holds a different (or unknown) run and overwrite is False (RECORDED_ONLY
        keys aside).
        """
        fp_path = self.dir / FINGERPRINT_FILE
        entries = [p for p in self.out_dir.iterdir() if p.name != LOCK_FILE] if self.out_dir.is_dir() else []
        if entries and not overwrite:
            if not fp_path.is_file():
                raise PipelineError(
                    f"out_dir {self.out_dir} is not empty and holds no {PROGRESS_DIR}/{FINGERPRINT_FILE} from this "
                    "pipeline; choose an empty out_dir, or pass overwrite=true to clear its shards"
                )
            old = json.loads(fp_path.read_text(encoding="utf-8"))
            a = _flatten({k: v for k, v in old.items() if k not in RECORDED_ONLY})
            b = _flatten({k: v for k, v in fingerprint.items() if k not in RECORDED_ONLY})
            if a != b:
                changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                raise PipelineError(
                    f"out_dir {self.out_dir} holds shards from a different config (changed: {', '.join(changed)}); "
                    "pass overwrite=true to delete them and start over, or choose another out_dir"
                )
        if overwrite:
            self.clear(split_names)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.dir.mkdir(exist_ok=True)
        # The set is incomplete from here until the manifest is written again.
        (self.out_dir / "manifest.json").unlink(missing_ok=True)
        for split in split_names:
            for p in (self.out_dir / split).glob("shard-*.tar.partial"):
                p.unlink()
        write_text_atomic(fp_path, dumps_strict(fingerprint, indent=1, sort_keys=True) + "\n")

    def clear(self, split_names: Iterable[str]) -> None:
        """Delete only what this pipeline writes (never other files a user keeps in out_dir)."""
        for name in ("manifest.json", "failures.jsonl"):
            (self.out_dir / name).unlink(missing_ok=True)
        if self.dir.is_dir():
            shutil.rmtree(self.dir)
        for split in split_names:
            d = self.out_dir / split
            for p in (
                list(d.glob("shard-*.tar")) + list(d.glob("shard-*.tar.partial")) + list(d.glob("index.safetensors"))
            ):
                p.unlink()
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()

    def completed(self, plan: ShardPlan) -> ShardRecord | None:
        """The shard's record if its tar exists and still has the recorded size and sha256, else None."""
        rec_path = self.dir / plan.record_name
        tar = self.out_dir / plan.relpath
        if not (rec_path.is_file() and tar.is_file()):
            return None
        try:
            rec = ShardRecord.from_json(rec_path.read_text(encoding="utf-8"))
        except (KeyError, TypeError, json.JSONDecodeError):  # an unreadable record: redo the shard
            return None
        if rec.entry.bytes != tar.stat().st_size or rec.entry.sha256 != sha256_file(tar):
            return None
        return rec

    def save(self, plan: ShardPlan, record: ShardRecord) -> None:
        write_text_atomic(self.dir / plan.record_name, record.to_json())

    def remove_stale(self, plans: Sequence[ShardPlan], split_names: Iterable[str]) -> None:
        """Delete the shard tars the plan does not produce, and their progress records: their samples are not in the
        set any more (the plan has fewer shards than a previous run), so a fresh run would not have them either."""
        planned = {self.out_dir / p.relpath for p in plans}
        for tar in sorted(p for s in split_names for p in (self.out_dir / s).glob("shard-*.tar") if p not in planned):
            (self.dir / f"{tar.parent.name}-{tar.name}".replace(".tar", ".json")).unlink(missing_ok=True)
            tar.unlink()


@functools.lru_cache(maxsize=1)
def ffmpeg_available() -> bool:
    """Whether FFmpeg formats can be decoded here: an ffmpeg program (the system's, or the imageio-ffmpeg wheel's;
    read_audio falls back to it), or torchcodec with the FFmpeg libraries (probed by decoding a 10-ms wav)."""
    try:
        find_ffmpeg()
        return True
    except FFmpegNotFoundError:
        pass
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.zeros(160, np.float32), 16000, format="WAV")
    try:
        from torchcodec.decoders import AudioDecoder

        AudioDecoder(buf.getvalue())
    except Exception:  # ImportError, or torchcodec's RuntimeError listing the FFmpeg versions it tried
        return False
    return True


def why_redo(store: ProgressStore, plan: ShardPlan, cfg: PipelineConfig) -> str | None:
    """Why this shard must be (re)encoded, or None when its tar and inputs are unchanged.

    Redone: no record or a damaged tar; a retryable failure (`FailureRecord.retryable`: an encode error or
    running out of memory, at once; a missing file once it exists; an FFmpeg failure once FFmpeg is installed);
    a row whose audio file changed (another file or other bytes). Final failures (corrupt audio, too short, ...)
    are redone only when their file changes. Audio deleted after encoding keeps its sample (deleting sources
    never deletes shards).
    """
    rec = store.completed(plan)
    if rec is None:
        return "new or damaged"
    if set(rec.inputs) != {row.ytid for row in plan.rows}:
        return "its planned samples changed (a track's segments or failure changed)"
    for f in rec.failures:
        if f.retryable and f.reason not in ("missing_audio", "needs_ffmpeg"):  # those two: only once the cause went
            return f"{f.ytid} failed with a retryable {f.reason}"
    if cfg.source.kind != "musiccaps":
        return _why_redo_segments(rec, plan)
    audio_dir = Path(cfg.audio_dir or "")
    ffmpeg_failed = {f.ytid for f in rec.failures if f.reason == "needs_ffmpeg"}
    for row in plan.rows:
        try:
            src = find_audio(audio_dir, row.ytid, cfg.audio_ext)
        except ClipFailure:  # still missing
            continue
        old_file, old_sha = rec.inputs.get(row.ytid, [None, None])
        if src.relative_to(audio_dir).as_posix() != old_file or sha256_file(src) != old_sha:
            return f"audio of {row.ytid} appeared or changed"
        if row.ytid in ffmpeg_failed and ffmpeg_available():
            return f"{row.ytid} needed FFmpeg, which is now installed"
    return None


def _why_redo_segments(rec: ShardRecord, plan: ShardPlan) -> str | None:
    """why_redo for segments, after the checks both sources share: a segment whose audio bytes or metadata changed.
    (A track that appeared, vanished or changed length changes the plan's keys, which why_redo checks first.)"""
    hashes: dict[str, str | None] = {}
    for item in plan.rows:
        assert isinstance(item, SegmentItem)
        old = rec.inputs[item.ytid]
        if item.failure is not None:  # planned failures: only their metadata can change without changing the plan
            if old[2:] != [item.input_digest]:
                return f"metadata of {item.ytid} changed"
            continue
        if item.audio_path not in hashes:
            p = Path(item.audio_path)
            hashes[item.audio_path] = sha256_cached(p) if p.is_file() else None
        sha = hashes[item.audio_path]
        if sha is None:  # deleted after encoding: the sample stays, as for MusicCaps
            continue
        if old != segment_identity(item, item.source_file, sha):
            return f"audio or metadata of {item.ytid} appeared or changed"
    return None


def musiccaps_fingerprint(fingerprint: dict) -> dict:
    """A MusicCaps run's fingerprint without the own-audio settings (source.*, segment.*, split.eval_fraction), which
    MusicCaps never reads, so changing them never refuses its resume."""
    config = {k: v for k, v in fingerprint["config"].items() if k not in ("source", "segment")}
    config["split"] = {k: v for k, v in config["split"].items() if k != "eval_fraction"}
    return fingerprint | {"config": config}
