"""yt-dlp as a library: one video's audio, whole or as a section, and what its errors mean."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..audio.ffmpeg_binary import find_ffmpeg
from .config import DownloadConfig

# Reason classes, in match order (first match wins). Only TRANSIENT ones are retried within a run;
# a rerun retries every failed row.
REASON_PATTERNS: tuple[tuple[str, re.Pattern], ...] = tuple(
    (name, re.compile(p, re.IGNORECASE))
    for name, p in (
        ("private", r"private video"),
        ("region_blocked", r"in your country|geo.?restrict"),
        ("login_required", r"sign in to confirm|login required|members.only|join this channel|age.restrict"),
        ("rate_limited", r"HTTP Error 429|too many requests"),
        (
            "unavailable",
            r"video unavailable|not available|has been removed|been terminated|no longer available|"
            r"does not exist|copyright|HTTP Error 4(?:04|10)",
        ),
        (
            "network",
            r"HTTP Error 5\d\d|timed? ?out|connection|network|name resolution|temporary failure|"
            r"content too short|incomplete|bytes read|did not get any data|unable to download|ssl|reset by peer",
        ),
    )
)
TRANSIENT = frozenset({"network", "rate_limited"})
VIDEO_REASONS = frozenset({"private", "region_blocked", "login_required", "rate_limited", "unavailable"})
SECTION_EXTS = frozenset({"m4a", "mp4", "webm"})  # containers whose section start is exact (section_first_sample)
# ffmpeg's HTTP Range request size for a section: it reads at most this much past what it needs; smaller means more
# requests (they share one connection, -multiple_requests).
SECTION_REQUEST_BYTES = 64 * 1024
REASONS = (*(name for name, _ in REASON_PATTERNS), "decode", "short_source", "other")


def classify(message: str) -> str:
    """Reason class of a yt-dlp error message: one of REASONS ('other' when nothing matches)."""
    for name, pattern in REASON_PATTERNS:
        if pattern.search(message):
            return name
    return "other"


class ClipError(Exception):
    """A clip that could not be fetched; `reason` is one of REASONS; `section`: a section download failed."""

    def __init__(self, reason: str, message: str, section: bool = False) -> None:
        super().__init__(message)
        self.reason, self.section = reason, section


class _YdlLogger:
    """yt-dlp's logger hook: its errors come back as exceptions, so only warnings are worth printing."""

    def __init__(self) -> None:
        self.ytid = ""  # the clip the worker is on

    def warning(self, msg: str) -> None:
        if "Falling back on generic information extractor" not in msg:
            tqdm.write(f"{self.ytid}: {msg}", file=sys.stderr)

    def _drop(self, msg: str) -> None:
        """debug and info say nothing a user needs; an error is raised as DownloadError right after, same text."""

    debug = info = error = _drop


def ydl_params(cfg: DownloadConfig, partial: Path) -> dict[str, Any]:
    """YoutubeDL params: quiet, no post-processing, files named by the row's ytid, the user's pass-through last."""
    from yt_dlp.utils import parse_bytes

    params: dict[str, Any] = {
        "format": cfg.format,
        # musiccaps_ytid: extra_info below; a section is <ytid>.section.<ext>, never mistaken for (or resumed
        # as) the whole stream <ytid>.<ext>, whose .part a later run resumes
        "outtmpl": {"default": str(partial / "%(musiccaps_ytid)s%(section_end&.section|)s.%(ext)s")},
        "noplaylist": True,
        "quiet": True,
        "noprogress": True,
        "logger": _YdlLogger(),
        "retries": cfg.http_retries,
        "fragment_retries": cfg.http_retries,
        "socket_timeout": cfg.socket_timeout_s,
        "cachedir": False,
        "continuedl": True,
        # sections (download_ranges) go through ffmpeg: the same binary as the cut; bounded Range requests,
        # so ffmpeg reads ahead at most one request past what it needs; -copyts keeps the whole stream's
        # timestamps in the section, which is how section_first_sample places it
        "ffmpeg_location": find_ffmpeg(),
        "external_downloader_args": {
            "ffmpeg_i": ["-request_size", str(SECTION_REQUEST_BYTES), "-multiple_requests", "1"],
            "ffmpeg_o": ["-copyts"],
        },
    }
    if cfg.cookies_file:
        params["cookiefile"] = cfg.cookies_file
    if cfg.rate_limit:
        params["ratelimit"] = parse_bytes(cfg.rate_limit)
    if cfg.proxy:
        params["proxy"] = cfg.proxy
    return params | dict(cfg.yt_dlp_params)


class Workers:
    """One YoutubeDL per worker thread (building one costs ~0.3 s), all closed at the end of the run."""

    def __init__(self, cfg: DownloadConfig, partial: Path) -> None:
        self.cfg, self.partial = cfg, partial
        self.local = threading.local()
        self.lock = threading.Lock()
        self.all: list = []

    def ydl(self):
        if getattr(self.local, "ydl", None) is None:
            from yt_dlp import YoutubeDL

            self.local.ydl = YoutubeDL(ydl_params(self.cfg, self.partial))
            with self.lock:
                self.all.append(self.local.ydl)
        return self.local.ydl

    def close(self) -> None:
        for ydl in self.all:
            ydl.close()


def download_source(ydl, url: str, ytid: str, section: tuple[float, float] | None) -> tuple[Path, bool]:
    """Audio of the video at `url` into `<partial>/<ytid>.<ext>`: only `section` = (start_s, end_s) when
    given and the chosen format's container has exact section starts (SECTION_EXTS), else the whole
    stream (yt-dlp resumes a `.part` file). Returns (path, is a section)."""
    from yt_dlp.postprocessor.ffmpeg import FFmpegPostProcessor
    from yt_dlp.utils import YoutubeDLError, download_range_func

    ydl.params["logger"].ytid = ytid
    is_section = False
    try:
        # extract and choose the format first: whether to cut a section depends on the chosen container
        info = ydl.extract_info(url, download=False, extra_info={"musiccaps_ytid": ytid})
        is_section = section is not None and (info or {}).get("ext") in SECTION_EXTS
        ydl.params.pop("download_ranges", None)
        if is_section:
            ydl.params["download_ranges"] = download_range_func(None, [section])
            # yt-dlp enables its FFmpegFD (sections) only if it finds ffmpeg through this context variable or on
            # PATH (its check ignores `ffmpeg_location`), and the wheel's binary is not on PATH. Per thread: set in
            # the worker thread that downloads.
            FFmpegPostProcessor._ffmpeg_location.set(find_ffmpeg())
        info = ydl.process_ie_result(info, download=True)
    except YoutubeDLError as e:
        msg = re.sub(r"^ERROR: |\r|\[download\] ", "", str(e)).strip()
        raise ClipError(classify(msg), msg, section=is_section) from e
    downloads = (info or {}).get("requested_downloads") or []
    paths = [Path(d["filepath"]) for d in downloads if d.get("filepath")]
    if len(paths) != 1 or not paths[0].is_file():
        raise ClipError("other", f"yt-dlp reported no single downloaded file for {url} (got {paths})")
    return paths[0], is_section
