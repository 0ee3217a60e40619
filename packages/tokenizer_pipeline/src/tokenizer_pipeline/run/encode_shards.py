"""The encode side of a run: one shard's decoded clips -> equal-length batches -> codes -> its tar and record."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..codec.encode import CodecEncoder
from ..config import PipelineConfig
from ..shards.manifest import FailureRecord, SampleRecord, SegmentSampleRecord
from ..shards.write_shards import ShardPlan, ShardTarWriter
from ..sources.plan import SegmentItem
from .loader import DecodedClip, clip_failure
from .planning import PlanItem
from .progress import ShardRecord
from .segment_items import segment_identity, segment_sample_record


@dataclass(frozen=True)
class EncodedClip:
    row: PlanItem
    codes: np.ndarray  # [T, K] int16
    n_samples: int  # audio samples at the codec's rate
    source_file: str
    source_sha256: str


class LengthBuckets:
    """Collects decoded clips into batches of equal length (MusicCaps windows are all 10 s).

    `add` returns the batches that are ready: a bucket that reached `batch_size`, or every bucket
    once `max_pending` clips wait (odd lengths never pile up a whole shard of audio). Which clips
    share a batch depends only on the order of `add` calls, so the codes never depend on timing.
    """

    def __init__(self, batch_size: int, same_length: bool) -> None:
        self.batch_size, self.same_length = batch_size, same_length
        self.max_pending = 2 * batch_size
        self.buckets: dict[int, list[DecodedClip]] = {}

    def add(self, clip: DecodedClip) -> list[list[DecodedClip]]:
        assert clip.wav is not None
        key = int(clip.wav.shape[-1]) if self.same_length else 0
        bucket = self.buckets.setdefault(key, [])
        bucket.append(clip)
        if len(bucket) == self.batch_size:
            return [self.buckets.pop(key)]
        if sum(len(b) for b in self.buckets.values()) >= self.max_pending:
            return self.drain()
        return []

    def drain(self) -> list[list[DecodedClip]]:
        batches = list(self.buckets.values())
        self.buckets = {}
        return batches


def encode_isolated(encoder: CodecEncoder, clips: list[DecodedClip]) -> list[np.ndarray | FailureRecord]:
    """Codes ([T, K] int16) per clip; if the batch's forward fails, each clip is retried alone so only a bad one fails."""
    try:
        return list(encoder.encode_batch([c.wav for c in clips]))  # each [N] -> [T, K]
    except Exception as e:  # per-clip isolation (OOM, a kernel error on one input, ...): recorded below
        if len(clips) == 1:
            return [clip_failure(clips[0].row, e, "encode", clips[0].source_file)]
        return [encode_isolated(encoder, [c])[0] for c in clips]


# the MusicCaps row's fields a sample record keeps as they are
CSV_FIELDS = ("ytid", "start_s", "end_s", "caption", "author_id", "is_balanced_subset", "is_audioset_eval", "split",
              "csv_row")  # fmt: skip


def sample_record(clip: EncodedClip, sampling_rate: int) -> SampleRecord | SegmentSampleRecord:
    row = clip.row
    if isinstance(row, SegmentItem):
        return segment_sample_record(
            row, clip.codes, clip.n_samples, clip.source_file, clip.source_sha256, sampling_rate
        )
    return SampleRecord(
        **{name: getattr(row, name) for name in CSV_FIELDS},
        audioset_positive_labels=list(row.audioset_positive_labels),
        aspect_list=list(row.aspect_list),
        n_frames=int(clip.codes.shape[0]),
        n_codebooks=int(clip.codes.shape[1]),
        duration_s=clip.n_samples / sampling_rate,
        source_file=clip.source_file,
        source_sha256=clip.source_sha256,
    )


def encode_shard(
    plan: ShardPlan, clips: Iterator[DecodedClip], encoder: CodecEncoder, cfg: PipelineConfig, out_dir: Path
) -> ShardRecord:
    """Take the shard's rows from `clips` (in plan order), encode them in equal-length batches, write the tar.

    Memory: at most `2 x batch_size` decoded clips plus the shard's codes (~1 MB per 256 clips).
    """
    done: dict[str, EncodedClip | FailureRecord] = {}
    inputs: dict[str, list[str | None]] = {}
    buckets = LengthBuckets(cfg.codec.batch_size, same_length=not cfg.codec.pad_batches)

    def encode(batch: list[DecodedClip]) -> None:
        for clip, out in zip(batch, encode_isolated(encoder, batch)):
            if isinstance(out, FailureRecord):
                done[clip.row.ytid] = out
            else:  # keep the codes, drop the audio
                assert clip.wav is not None and clip.source_file and clip.source_sha256
                done[clip.row.ytid] = EncodedClip(
                    clip.row, out, int(clip.wav.shape[-1]), clip.source_file, clip.source_sha256
                )

    for row in plan.rows:
        clip = next(clips)
        if clip.row != row:
            raise RuntimeError(f"decode order broke: expected row {row.csv_row}, got {clip.row.csv_row}")
        inputs[row.ytid] = (
            segment_identity(row, clip.source_file, clip.source_sha256)
            if isinstance(row, SegmentItem)
            else [clip.source_file, clip.source_sha256]
        )
        if clip.failure is not None:
            done[row.ytid] = clip.failure
            continue
        for batch in buckets.add(clip):
            encode(batch)
    for batch in buckets.drain():
        encode(batch)

    failures: list[FailureRecord] = []
    audio_s, n_frames = 0.0, 0
    with ShardTarWriter(out_dir, plan) as writer:
        for row in plan.rows:  # CSV order, whatever order the batches finished in
            out = done[row.ytid]
            if isinstance(out, FailureRecord):
                failures.append(out)
                continue
            rec = sample_record(out, encoder.sampling_rate)
            writer.write(rec, out.codes)
            audio_s += rec.duration_s
            n_frames += rec.n_frames
        entry = writer.commit()
    return ShardRecord(entry=entry, audio_seconds=audio_s, n_frames=n_frames, failures=failures, inputs=inputs)
