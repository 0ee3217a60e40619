"""Resume and heal: `<out>/.progress/` (the run's fingerprint, one record per completed shard) and the redo rule.

A rerun skips a shard whose tar still matches its recorded sha256 and whose inputs did not change
(`ShardRecord.inputs`), and redoes the rest (`why_redo`). `.progress/` stays after the set is complete (about
1 KB per shard): it is what lets a later rerun heal only the shards whose audio changed; readers ignore it.
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
from ..shards.manifest import FailureRecord, ShardEntry, dumps_strict, failure_from_dict, write_text_atomic
from ..shards.write_shards import ShardPlan, sha256_file
from ..sources.plan import SegmentItem, SourceInfo
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
        return cls(
            entry=ShardEntry(**d["entry"]),
            audio_seconds=d["audio_seconds"],
            n_frames=d["n_frames"],
            failures=[failure_from_dict(f) for f in d["failures"]],
            inputs=d["inputs"],
        )


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

    def prepare(
        self,
        fingerprint: dict[str, Any],
        split_names: Iterable[str],
        overwrite: bool,
        explain: dict[str, str] | None = None,
    ) -> None:
        """Make `out_dir` ready: fresh, resumable with the same fingerprint, or cleared by overwrite.

        Raises PipelineError when `out_dir` holds a different (or unknown) run and overwrite is False (RECORDED_ONLY
        keys aside); `explain` words a changed fingerprint key for the message (a changed format_version alone, when
        worded: the rest follows from it).
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
                keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                if "format_version" in keys and "format_version" in (explain or {}):
                    keys = ["format_version"]
                changed = [(explain or {}).get(k, k) for k in keys]
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
        except (KeyError, TypeError, json.JSONDecodeError):  # a record from an older version: redo the shard
            return None
        if rec.entry.bytes != tar.stat().st_size or rec.entry.sha256 != sha256_file(tar):
            return None
        return rec

    def save(self, plan: ShardPlan, record: ShardRecord) -> None:
        write_text_atomic(self.dir / plan.record_name, record.to_json())

    def stale_shards(self, plans: Sequence[ShardPlan], split_names: Iterable[str]) -> list[Path]:
        """Shard tars in out_dir that the plan does not produce."""
        planned = {self.out_dir / p.relpath for p in plans}
        return sorted(p for s in split_names for p in (self.out_dir / s).glob("shard-*.tar") if p not in planned)

    def remove_stale(self, plans: Sequence[ShardPlan], split_names: Iterable[str]) -> None:
        """Delete the stale shard tars and their progress records: their samples are not in the set any more (the
        plan has fewer shards than a previous run), so a fresh run would not have them either."""
        split_names = list(split_names)
        for tar in self.stale_shards(plans, split_names):
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


MUSICCAPS_FINGERPRINT_VERSION = 2  # MusicCaps tars and progress records are unchanged since format version 2


def musiccaps_fingerprint(fingerprint: dict) -> dict:
    """A MusicCaps run's fingerprint as format version 2 wrote it: without the own-audio settings (source.*, segment.*,
    split.eval_fraction, unused by MusicCaps), so a set written before format 3 resumes and heals."""
    config = {k: v for k, v in fingerprint["config"].items() if k not in ("source", "segment")}
    config["split"] = {k: v for k, v in config["split"].items() if k != "eval_fraction"}
    return fingerprint | {"format_version": MUSICCAPS_FINGERPRINT_VERSION, "config": config}


def refusal_words(info: SourceInfo | None) -> dict[str, str] | None:
    """How a refused resume of your own audio words a changed format version (MusicCaps: None, its fingerprint
    stays format 2's)."""
    if info is None:
        return None
    return {
        "format_version": (
            "format_version: these shards were written by an older tokenizer_pipeline, which drew your own audio's "
            "splits from the track ids; this one draws them from the audio (docs/shard-format.md, version 4), so "
            "resuming would move tracks between splits"
        )
    }
