"""How a run handles a `sources.SegmentItem` (a segment of your own audio, or a track that failed while planning):
decode its window, record its sample or failure and resume identity, summarise the source for the manifest.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..audio.read_audio import ClipFailure, load_audio
from ..config import PipelineConfig
from ..shards.manifest import FailureRecord, SegmentSampleRecord
from ..sources.plan import SegmentItem, SourceInfo
from ..sources.splits import audio_sha256


def sha256_cached(path: Path) -> str:
    """sha256 of a file, remembered per process while its size and mtime stay (sources.splits.audio_sha256: planning
    hashed it for the track's split): the segments of one track hash it once per decode worker, not once per segment."""
    return audio_sha256(path)


def segment_label(item: SegmentItem) -> str:
    """'segment 2 [20.000, 30.000] s of songs/a.wav' (or 'track songs/a.wav' for a track-level failure)."""
    if item.segment_index is None:
        return f"track {item.source_file}"
    return f"segment {item.segment_index} [{item.start_s:.3f}, {item.end_s:.3f}] s of {item.source_file}"


def segment_failure(item: SegmentItem, err: ClipFailure) -> FailureRecord:
    """One failures.jsonl line for this segment (or track): its `detail` names the file and the time range."""
    fields = err.record_fields()
    fields["detail"] = f"{segment_label(item)}: {fields['detail']}"
    return FailureRecord(ytid=item.ytid, csv_row=item.csv_row, split=item.split, **fields)


def planned_failure(item: SegmentItem) -> FailureRecord:
    """The failure a track-level item carries from planning (no_caption, missing or unreadable file)."""
    assert item.failure is not None
    reason, detail = item.failure
    retryable = ClipFailure(reason, item.audio_path, detail).retryable  # the reason decides (missing_audio: yes)
    return FailureRecord(
        ytid=item.ytid, csv_row=item.csv_row, split=item.split, reason=reason, detail=f"{segment_label(item)}: {detail}",
        retryable=retryable,
    )  # fmt: skip


def decode_segment(
    item: SegmentItem, sampling_rate: int, tolerance_s: float
) -> tuple[torch.Tensor | None, str | None, str | None, FailureRecord | None]:
    """(wav [N] at `sampling_rate` or None, source_file, sha256, failure or None). Only the segment's window is read
    (a seek), so memory is one segment whatever the track's length; the file is hashed once per process."""
    if item.failure is not None:
        return None, None, None, planned_failure(item)
    src, sha = Path(item.audio_path), None
    try:
        sha = sha256_cached(src)
        wav = load_audio(
            src, sampling_rate, start_s=item.start_s, end_s=item.end_s, crop_to_window=True,
            duration_tolerance_s=tolerance_s,
        )  # [N]  # fmt: skip
    except Exception as e:  # per-segment isolation, as for a clip: recorded, never raised
        err = e if isinstance(e, ClipFailure) else ClipFailure.from_exception("decode_error", src, e)
        return None, item.source_file, sha, segment_failure(item, err)
    return wav, item.source_file, sha, None


def segment_sample_record(
    item: SegmentItem, codes: np.ndarray, n_samples: int, source_file: str, sha: str, sampling_rate: int
) -> SegmentSampleRecord:
    """`<key>.json` of an encoded segment; codes: int16 [T, K]."""
    return SegmentSampleRecord(
        ytid=item.ytid, start_s=item.start_s, end_s=item.end_s, aspect_list=list(item.aspect_list),
        caption=item.caption, split=item.split, csv_row=item.csv_row, n_frames=int(codes.shape[0]),
        n_codebooks=int(codes.shape[1]), duration_s=n_samples / sampling_rate, source_file=source_file,
        source_sha256=sha, source_kind=item.source_kind, track_id=item.track_id, source_path=item.source_path,
        segment_index=int(item.segment_index or 0), segment_start_s=item.start_s, segment_end_s=item.end_s,
        weight=item.weight, metadata=json.loads(item.metadata_json),
    )  # fmt: skip


def segment_identity(item: SegmentItem, source_file: str | None, sha: str | None) -> list[str | None]:
    """What a shard's record remembers of a segment's inputs: [file, sha256, digest of caption + metadata], so a changed
    audio file, sidecar or metadata row redoes the shard."""
    return [source_file, sha, item.input_digest]


def source_summary(cfg: PipelineConfig, info: SourceInfo | None, sha: str) -> dict:
    """The manifest's `source` object (docs/shard-format.md)."""
    if info is None:  # the CSV's split.eval_column decides (version 3's manifest: no split_rule field)
        return {"kind": "musiccaps", "csv": str(cfg.csv), "csv_sha256": sha, "sha256": sha,
                "audio_dir": str(cfg.audio_dir)}  # fmt: skip
    where = {"audiocraft": "manifest", "audiofolder": "dir"}[info.kind]
    root = {} if info.root is None else {"root": info.root}  # audiocraft: the folder the track ids are relative to
    return {
        "kind": info.kind, where: info.path, "sha256": sha, "metadata_files": info.metadata_files,
        "n_tracks": info.n_tracks, "n_duration_disagreements": info.n_duration_disagreements, **root,
        "split_rule": info.split_rule,
    }  # fmt: skip


def segmentation_summary(info: SourceInfo | None) -> dict | None:
    """The manifest's `segmentation` object (None for MusicCaps, whose windows are not cut)."""
    if info is None:
        return None
    seg = info.segmentation
    return {
        "seconds": seg.seconds, "hop_seconds": seg.hop_seconds, "min_seconds": seg.min_seconds,
        "n_tracks": info.n_tracks, "n_segments_planned": info.n_segments, "n_dropped_short": info.n_dropped_short,
        "n_dropped_short_tracks": info.n_dropped_short_tracks, "n_dropped_tails": info.n_dropped_tails,
        "n_track_failures": info.track_failures,
    }  # fmt: skip
