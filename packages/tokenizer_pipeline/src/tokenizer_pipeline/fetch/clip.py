"""One CSV row's clip: fetch its window (a section, else the whole stream), cut it exactly, retry.

`fetch_clip` downloads through `youtube.download_source`, cuts `[start_s, end_s]` to a 16-bit flac on the whole
stream's sample grid (`audio/ffmpeg_binary.cut_to_flac`), checks its length and renames it to `<ytid>.flac`;
transient errors are retried with backoff, other failures come back as a `ClipResult` with a `DownloadFailure`.
"""

from __future__ import annotations

import glob
import random
import time
from dataclasses import dataclass
from pathlib import Path

import soundfile as sf

from ..audio.ffmpeg_binary import FFmpegError, cut_to_flac, probe, section_first_sample
from ..sources.musiccaps import ClipRow
from .config import DownloadConfig
from .youtube import TRANSIENT, VIDEO_REASONS, ClipError, Workers, download_source

PARTIAL_DIR = ".partial"  # yt-dlp's downloads in progress (resumable `.part` files) and uncut sources
SHORT_TOLERANCE_S = 0.01  # a cut shorter than the window by more than this is a `short_source` failure
# Lead-in a section must have before the window for its decoder to settle (Opus' pre-roll is 80 ms, AAC's one
# 1,024-sample frame), whatever section_margin_s asks; a section with less is not trusted (the whole stream is fetched).
SECTION_MIN_LEAD_IN_S = 0.1


@dataclass(frozen=True)
class DownloadFailure:
    """One line of download_failures.jsonl."""

    ytid: str
    csv_row: int  # 1-based line of the row in the CSV
    reason: str  # one of REASONS
    message: str  # yt-dlp's / ffmpeg's own words
    attempts: int  # tries made this run


@dataclass(frozen=True)
class ClipResult:
    ytid: str
    status: str  # fetched | present | failed
    bytes: int = 0  # size of the flac written (fetched) or found (present)
    download_bytes: int = 0  # size of the source file yt-dlp fetched (the whole stream or a section)
    failure: DownloadFailure | None = None
    section: bool = False  # fetched as a section (only the window and a margin)


def _cut(src: Path, cut: Path, row: ClipRow, first_sample: int = 0) -> float:
    """Cut the row's window of `src` (whose first sample is `first_sample` of the whole stream) to `cut`; its seconds."""
    try:
        cut_to_flac(src, cut, start_s=row.start_s, duration_s=row.end_s - row.start_s, first_sample=first_sample)
    except FFmpegError as e:
        raise ClipError("decode", str(e)) from e
    info = sf.info(str(cut))
    return info.frames / info.samplerate


def _fetch_section(cfg: DownloadConfig, ydl, url: str, row: ClipRow) -> tuple[Path | None, int | None]:
    """Try to download only the row's window plus `section_margin_s` either side.

    Returns (section, its first sample in the whole stream); (whole stream, None) when yt-dlp fetched the
    whole stream (a container not in SECTION_EXTS); (None, None) when the section is unusable and
    the whole stream must be downloaded: its start is not known to the sample (`section_first_sample`),
    or the download failed for a reason that is not about the video itself (e.g. ffmpeg could not seek
    because the server ignores HTTP Range).
    """
    bounds = (max(row.start_s - cfg.section_margin_s, 0.0), row.end_s + cfg.section_margin_s)
    try:
        src, is_section = download_source(ydl, url, row.ytid, bounds)
    except ClipError as e:
        if e.reason in VIDEO_REASONS or not e.section:  # the whole stream would fail the same way / was it
            raise
        return None, None
    if not is_section:
        return src, None
    try:
        first, sr = section_first_sample(src), probe(src).sample_rate
    except FFmpegError:  # unreadable: e.g. an MP4 section whose index ffmpeg could not fetch without Range
        first = sr = None
    # the decoder needs a lead-in before the window to settle (AAC: one frame; Opus: more); a section that
    # starts later than half the margin before the window (ffmpeg reading without Range can land anywhere)
    # is not trusted
    lead_in = max(cfg.section_margin_s / 2, SECTION_MIN_LEAD_IN_S)
    ok = first is not None and first <= max(round((row.start_s - lead_in) * sr), 0)
    if not ok:
        src.unlink()
        return None, None
    return src, first


def _fetch_window(cfg: DownloadConfig, ydl, row: ClipRow, cut: Path) -> tuple[Path, bool]:
    """The row's window, cut exactly to `cut`; returns (the downloaded source, whether it was a section).

    With `cfg.sections` only the window plus a margin is downloaded (ffmpeg's HTTP Range requests; the
    margin lets AAC/Opus decoding settle before the window) and the window is cut from it on the whole
    stream's sample grid; a section that does not cover the window (a server that ignores Range can give
    one that ends early) is dropped too. Otherwise, or as the fallback, the whole stream is downloaded.
    """
    url, window_s = cfg.url_template.format(ytid=row.ytid), row.end_s - row.start_s
    src = None
    if cfg.sections:
        src, first = _fetch_section(cfg, ydl, url, row)
        if src is not None and first is not None:
            try:
                if _cut(src, cut, row, first) >= window_s - SHORT_TOLERANCE_S:
                    return src, True
            except ClipError:  # a section ffmpeg cannot cut: the whole stream below
                pass
            src.unlink()
            cut.unlink(missing_ok=True)
            src = None
    if src is None:
        src, _ = download_source(ydl, url, row.ytid, None)
    got = _cut(src, cut, row)
    if got < window_s - SHORT_TOLERANCE_S:
        raise ClipError(
            "short_source",
            f"the source ends before the window: got {got:.3f} s of [{row.start_s}, {row.end_s}] s from {src.name}",
        )
    return src, False


def fetch_clip(cfg: DownloadConfig, row: ClipRow, out_dir: Path, workers: Workers) -> ClipResult:
    """Download, cut and check one row; retries transient errors. Failures come back as a ClipResult."""
    dst = out_dir / f"{row.ytid}.flac"
    if dst.is_file():
        return ClipResult(row.ytid, "present", bytes=dst.stat().st_size)
    partial = out_dir / PARTIAL_DIR
    attempt = 0
    while True:
        attempt += 1
        try:
            cut = partial / f"{row.ytid}.window.flac"  # checked before it gets its final name
            src, section = _fetch_window(cfg, workers.ydl(), row, cut)
            cut.replace(dst)  # same file system: atomic, so an existing <ytid>.flac is always complete
            size = src.stat().st_size
            if cfg.keep_source:
                (out_dir / "source").mkdir(exist_ok=True)
                src.replace(out_dir / "source" / src.name)
            else:
                src.unlink()
            return ClipResult(row.ytid, "fetched", bytes=dst.stat().st_size, download_bytes=size, section=section)
        except ClipError as e:
            if e.reason in TRANSIENT and attempt <= cfg.retries:
                time.sleep(cfg.backoff_s * 2 ** (attempt - 1) * random.uniform(0.75, 1.25))
                continue
            # a bad source or cut must not be reused by the next run
            for stale in partial.glob(f"{glob.escape(row.ytid)}.*"):
                if not stale.name.endswith(".part"):
                    stale.unlink()
            return ClipResult(
                row.ytid, "failed", failure=DownloadFailure(row.ytid, row.csv_row, e.reason, str(e), attempt)
            )
