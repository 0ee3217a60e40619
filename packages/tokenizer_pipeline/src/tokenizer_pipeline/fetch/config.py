"""The `make audio` config schema: `DownloadConfig`, which Hydra composes conf/tokenizer_pipeline/download.yaml onto,
and `DownloadConfigError`, a problem to fix before anything is downloaded."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from ..errors import UserError


@dataclass
class DownloadConfig:
    csv: str = "data/musiccaps/musiccaps-public.csv"  # MusicCaps metadata (relative to the launch directory)
    out_dir: str = MISSING  # required: <out_dir>/<ytid>.flac, later `make shards DATA=<out_dir>`
    url_template: str = "https://www.youtube.com/watch?v={ytid}"  # video URL of a row; {ytid} is replaced
    format: str = "bestaudio/best"  # yt-dlp format selector; audio only keeps downloads small
    workers: int = 4  # parallel downloads; more is faster until YouTube throttles (HTTP 429)
    retries: int = 3  # extra attempts per clip after a transient error (network, 5xx, 429)
    backoff_s: float = 5.0  # wait before retry k: backoff_s * 2**(k-1), +-25% jitter
    limit: int | None = None  # first N CSV rows only (null = all); for quick tries
    cookies_file: str | None = None  # Netscape cookies.txt for yt-dlp (videos that ask to sign in)
    # per-worker rate of whole-stream downloads, yt-dlp syntax ("2M" = 2 MB/s; sections ignore it)
    rate_limit: str | None = None
    proxy: str | None = None  # e.g. socks5://127.0.0.1:1080; null = direct
    socket_timeout_s: float = 30.0  # yt-dlp's network timeout per request
    http_retries: int = 3  # yt-dlp's own retries inside one attempt (it resumes the partial file)
    keep_source: bool = False  # true: keep each downloaded file (whole stream or section) in <out_dir>/source/
    sections: bool = True  # fetch only the window (+ margin) where the container allows; false: whole streams
    section_margin_s: float = 1.0  # seconds fetched either side of a window (at least half is the decoder's lead-in)
    yt_dlp_params: dict[str, Any] = field(default_factory=dict)  # any other YoutubeDL params, passed as is


ConfigStore.instance().store(name="download_schema", node=DownloadConfig)


class DownloadConfigError(UserError, ValueError):
    """A problem to fix before anything is downloaded (bad option, bad CSV row); the message says the fix."""
