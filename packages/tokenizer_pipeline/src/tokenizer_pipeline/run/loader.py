"""The decode side of a run: planned items -> `DecodedClip`s in plan order, decoded in DataLoader worker processes.

A worker finds, hashes, decodes and resamples one item (a MusicCaps clip, or a segment's window); whatever breaks
on that one file is its `FailureRecord`, never the run's end. Results come back in index order, so which clips
share a batch downstream never depends on timing.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..audio.read_audio import ClipFailure, find_audio, load_audio
from ..config import PipelineConfig
from ..shards.manifest import FailureRecord
from ..shards.write_shards import sha256_file
from ..sources.plan import SegmentItem
from .planning import PlanItem
from .segment_items import decode_segment, segment_failure


def clip_failure(row: PlanItem, err: Exception, stage: str, path: Path | str | None = None) -> FailureRecord:
    """A typed failure: `ClipFailure`s keep their reason (audio.read_audio.REASONS); any other exception while
    decoding or encoding this clip becomes `decode_error` / `encode_error` with its type and message.
    A segment's failure names its source file and time range in `detail`."""
    if not isinstance(err, ClipFailure):
        err = ClipFailure.from_exception(f"{stage}_error", path if path is not None else f"{row.ytid}.*", err)
    if isinstance(row, SegmentItem):
        return segment_failure(row, err)
    return FailureRecord(ytid=row.ytid, csv_row=row.csv_row, split=row.split, **err.record_fields())


@dataclass(frozen=True)
class DecodedClip:
    """One row after the decode worker: audio ready for the encoder, or the reason it is not."""

    row: PlanItem
    wav: torch.Tensor | None  # [N] float32 mono at the codec's rate; None when it failed
    source_file: str | None  # relative to audio_dir; None when no file exists
    source_sha256: str | None
    failure: FailureRecord | None


class ClipSource(torch.utils.data.Dataset):
    """Row i -> DecodedClip: find, hash, decode, resample. Runs in DataLoader worker processes."""

    def __init__(self, rows: list[PlanItem], cfg: PipelineConfig, sampling_rate: int) -> None:
        self.rows, self.cfg, self.sampling_rate = rows, cfg, sampling_rate
        self.audio_dir = Path(cfg.audio_dir or "")  # musiccaps only; segments name their files

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> DecodedClip:
        if isinstance(self.rows[i], SegmentItem):
            return self._segment(self.rows[i])
        row, rel, sha, src = self.rows[i], None, None, None
        try:
            src = find_audio(self.audio_dir, row.ytid, self.cfg.audio_ext)
            rel, sha = src.relative_to(self.audio_dir).as_posix(), sha256_file(src)
            wav = load_audio(
                src, self.sampling_rate, start_s=row.start_s, end_s=row.end_s, crop_to_window=self.cfg.crop_to_window,
                duration_tolerance_s=self.cfg.duration_tolerance_s, min_seconds=self.cfg.min_seconds,
            )  # [N]  # fmt: skip
        except Exception as e:  # per-clip isolation: whatever breaks on this one file is recorded for it, not raised
            return DecodedClip(row, None, rel, sha, clip_failure(row, e, "decode", src))
        return DecodedClip(row, wav, rel, sha, None)

    def _segment(self, item: SegmentItem) -> DecodedClip:
        wav, rel, sha, failure = decode_segment(item, self.sampling_rate, self.cfg.duration_tolerance_s)  # [N]
        return DecodedClip(item, wav, rel, sha, failure)


def _worker_init(_: int) -> None:
    torch.set_num_threads(1)  # one core per decode worker; the encoder owns the intra-op threads
    # Ctrl-C reaches the whole foreground job: the main process decides (it closes the workers, which finish the clip
    # in hand); a SIGTERM to the job ends a worker quietly (exit 0: the main process does not report it as a crash)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))


def _as_is(clip: DecodedClip) -> DecodedClip:
    return clip


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Decode in the main process with one thread, as a worker would (same floats for any worker count)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def decoded_clips(rows: list[PlanItem], cfg: PipelineConfig, sampling_rate: int, workers: int) -> Iterator[DecodedClip]:
    """DecodedClips in `rows` order. workers > 0: that many processes, at most `prefetch` clips ahead each, ended when
    the generator is closed or exhausted."""
    source = ClipSource(rows, cfg, sampling_rate)
    if workers == 0:
        for i in range(len(source)):
            with _one_thread():
                clip = source[i]
            yield clip
        return
    loader = torch.utils.data.DataLoader(
        source, batch_size=None, shuffle=False, num_workers=workers, prefetch_factor=cfg.prefetch,
        collate_fn=_as_is, worker_init_fn=_worker_init,  # yields in index order (in_order defaults to True)
    )  # fmt: skip
    clips = iter(loader)
    try:
        yield from clips
    finally:
        # closed (contextlib.closing in the caller) on every way out of the encoding loop, an error or Ctrl-C too: the
        # workers end now, not at the interpreter's exit. DataLoader has no public close; `_shutdown_workers` is what
        # its iterator's __del__ calls (each worker told to leave and joined, then terminated).
        shutdown = getattr(clips, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
