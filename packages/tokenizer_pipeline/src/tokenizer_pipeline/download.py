"""`python -m tokenizer_pipeline.download out_dir=DIR [hydra overrides]`: MusicCaps CSV -> `<out_dir>/<ytid>.flac`.

For each CSV row: yt-dlp (used as a library) downloads the row's window of the video's audio
(`format=bestaudio/best`): only `[start_s, end_s]` plus `section_margin_s` either side where the
container allows (M4A/MP4, WebM: yt-dlp's `download_ranges`, done by the ffmpeg binary with HTTP Range
requests), else the whole stream. The ffmpeg binary (`ffmpeg_binary.py`: system or imageio-ffmpeg wheel)
then cuts `[start_s, end_s]` exactly (on the whole stream's sample grid, also from a section) to a
16-bit flac at the source's sample rate, written under a temporary name and renamed. The exact cut is
done here, not by yt-dlp: a section alone is not sample-exact (10.013-10.016 s for a 10-s window), and
yt-dlp's post-processors need `ffprobe`, which the wheel does not ship. A section that cannot be placed
to the sample, or that a server ignoring Range breaks, is replaced by the whole stream.
The output directory feeds `make shards DATA=<out_dir>` unchanged.

Reads top to bottom: parse CSV -> lock out_dir (`.download.lock`, as `make shards` locks its own) ->
skip rows whose flac exists -> worker threads fetch the rest (each retries transient errors with
backoff) -> `download_failures.jsonl` + `download_summary.json` -> summary.
Failures never stop the run; it exits non-zero only when nothing at all could be fetched.
Config: conf/tokenizer_pipeline/download.yaml over the `DownloadConfig` schema below.
"""

from __future__ import annotations

import glob
import json
import math
import random
import re
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import hydra
import soundfile as sf
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue
from tqdm import tqdm

from .conf_dir import find_conf_dir
from .dir_lock import lock_dir
from .errors import USER_ERROR_EXIT, UserError
from .ffmpeg_binary import FFmpegError, cut_to_flac, find_ffmpeg, probe, section_first_sample
from .manifest import write_text_atomic
from .musiccaps import ClipRow, check_ytids, read_musiccaps_csv

FAILURES_FILE = "download_failures.jsonl"
SUMMARY_FILE = "download_summary.json"
LOCK_FILE = ".download.lock"  # held while a run writes out_dir (a second run into it is refused)
PARTIAL_DIR = ".partial"  # yt-dlp's downloads in progress (resumable `.part` files) and uncut sources
SHORT_TOLERANCE_S = 0.01  # a cut shorter than the window by more than this is a `short_source` failure


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
    rate_limit: str | None = (
        None  # per-worker rate of whole-stream downloads, yt-dlp syntax ("2M" = 2 MB/s; sections ignore it)
    )
    proxy: str | None = None  # e.g. socks5://127.0.0.1:1080; null = direct
    socket_timeout_s: float = 30.0  # yt-dlp's network timeout per request
    http_retries: int = 3  # yt-dlp's own retries inside one attempt (it resumes the partial file)
    keep_source: bool = False  # true: keep each downloaded file (whole stream or section) in <out_dir>/source/
    sections: bool = True  # fetch only the window (+ margin) where the container allows; false: whole streams
    section_margin_s: float = 1.0  # seconds fetched either side of a window (at least half is the decoder's lead-in)
    yt_dlp_params: dict[str, Any] = field(default_factory=dict)  # any other YoutubeDL params, passed as is


ConfigStore.instance().store(name="download_schema", node=DownloadConfig)

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
# Lead-in a section must have before the window for its decoder to settle (Opus' pre-roll is 80 ms, AAC's one
# 1,024-sample frame), whatever section_margin_s asks: margin 0 gave sections starting at the window, cut 6146/32768
# off the whole stream's decode. A section with less is not trusted (the whole stream is fetched instead).
SECTION_MIN_LEAD_IN_S = 0.1
# ffmpeg's HTTP Range request size for a section: it reads at most this much past what it needs (index,
# window). Bytes fetched for a 10-s window of a 4-min source, against the whole stream (tests' local server,
# AAC 128 kbps / Opus 96 kbps): 32 KiB 0.08 / 0.08 (11 requests), 64 KiB 0.10 / 0.11 (7-8),
# 128 KiB 0.15 / 0.15 (6), 256 KiB 0.21 / 0.22 (5). Requests share one connection (-multiple_requests).
SECTION_REQUEST_BYTES = 64 * 1024
REASONS = (*(name for name, _ in REASON_PATTERNS), "decode", "short_source", "other")


def classify(message: str) -> str:
    """Reason class of a yt-dlp error message: one of REASONS ('other' when nothing matches)."""
    for name, pattern in REASON_PATTERNS:
        if pattern.search(message):
            return name
    return "other"


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


class DownloadConfigError(UserError, ValueError):
    """A problem to fix before anything is downloaded (bad option, bad CSV row); the message says the fix."""


class ClipError(Exception):
    """A clip that could not be fetched; `reason` is one of REASONS; `section`: a section download failed."""

    def __init__(self, reason: str, message: str, section: bool = False) -> None:
        super().__init__(message)
        self.reason, self.section = reason, section


class _YdlLogger:
    """yt-dlp's logger hook: its errors come back as exceptions, so only warnings are worth printing."""

    def __init__(self) -> None:
        self.ytid = ""  # the clip the worker is on

    def debug(self, msg: str) -> None:
        pass

    def info(self, msg: str) -> None:
        pass

    def warning(self, msg: str) -> None:
        if "Falling back on generic information extractor" not in msg:
            tqdm.write(f"{self.ytid}: {msg}", file=sys.stderr)

    def error(self, msg: str) -> None:
        pass  # raised as DownloadError right after, with the same text


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


class _Workers:
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


def _download_source(ydl, url: str, ytid: str, section: tuple[float, float] | None) -> tuple[Path, bool]:
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
            # yt-dlp downloads a section with its FFmpegFD, which it enables only if it finds an ffmpeg program
            # through this context variable or on PATH: the availability check ignores the `ffmpeg_location`
            # param (yt-dlp's "Fixme" in downloader/external.py), and the wheel's binary is not on PATH.
            # yt-dlp's own command line sets the same variable for --ffmpeg-location (yt_dlp/__init__.py).
            # A context variable is per thread: set here, in the worker thread that downloads.
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
        src, is_section = _download_source(ydl, url, row.ytid, bounds)
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
        src, _ = _download_source(ydl, url, row.ytid, None)
    got = _cut(src, cut, row)
    if got < window_s - SHORT_TOLERANCE_S:
        raise ClipError(
            "short_source",
            f"the source ends before the window: got {got:.3f} s of [{row.start_s}, {row.end_s}] s from {src.name}",
        )
    return src, False


def fetch_clip(cfg: DownloadConfig, row: ClipRow, out_dir: Path, workers: _Workers) -> ClipResult:
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


@dataclass(frozen=True)
class DownloadResult:
    counts: dict[str, int]  # rows, fetched, present, failed
    failures_by_reason: dict[str, int]
    failures: list[DownloadFailure]
    elapsed_s: float
    flac_bytes: int  # total size of the flacs fetched this run
    download_bytes: int  # total size of the sources downloaded this run (whole streams or sections)
    exit_code: int  # 0 unless nothing was fetched or present
    message: str


def run_download(cfg: DownloadConfig, *, progress: bool = True) -> DownloadResult:
    """Fetch every row's window. Raises DownloadConfigError for problems to fix before anything runs."""
    if cfg.workers < 1:
        raise DownloadConfigError(f"workers={cfg.workers} must be >= 1")
    if cfg.retries < 0 or cfg.backoff_s < 0:
        raise DownloadConfigError(f"retries={cfg.retries} and backoff_s={cfg.backoff_s} must be >= 0")
    if not math.isfinite(cfg.section_margin_s) or cfg.section_margin_s < 0:
        raise DownloadConfigError(
            f"section_margin_s={cfg.section_margin_s} must be a finite number of seconds >= 0 (default 1.0; below "
            f"{2 * SECTION_MIN_LEAD_IN_S:g} a section has too little lead-in and the whole stream is fetched)"
        )
    if "{ytid}" not in cfg.url_template:
        raise DownloadConfigError(
            f"url_template={cfg.url_template!r} has no {{ytid}} placeholder, every row would fetch the same URL"
        )
    if cfg.cookies_file and not Path(cfg.cookies_file).is_file():
        raise DownloadConfigError(
            f"cookies_file={cfg.cookies_file} does not exist; export cookies.txt from a browser or drop the option"
        )
    if cfg.rate_limit:
        from yt_dlp.utils import parse_bytes

        if parse_bytes(cfg.rate_limit) is None:
            raise DownloadConfigError(
                f"rate_limit={cfg.rate_limit!r} is not a byte rate; use e.g. 500K or 2M (bytes per second)"
            )
    try:
        find_ffmpeg()
    except FileNotFoundError as e:
        raise DownloadConfigError(str(e)) from e
    csv_path, out_dir = Path(cfg.csv), Path(cfg.out_dir)
    rows = list(read_musiccaps_csv(csv_path))  # a missing / unreadable / malformed CSV is a CsvError (UserError)
    if cfg.limit is not None:
        rows = rows[: cfg.limit]
    check_ytids(rows, csv_path, DownloadConfigError)  # the rule make shards applies to the same rows
    lock = lock_dir(out_dir, LOCK_FILE, "tokenizer_pipeline.download run", DownloadConfigError)
    try:
        return _fetch_rows(cfg, rows, out_dir, progress)
    finally:
        lock.release()


def _fetch_rows(cfg: DownloadConfig, rows: list[ClipRow], out_dir: Path, progress: bool) -> DownloadResult:
    """Fetch `rows` into the locked `out_dir`, write the failures and the summary."""
    (out_dir / PARTIAL_DIR).mkdir(parents=True, exist_ok=True)

    results: list[ClipResult] = []
    t0 = time.monotonic()
    pool, workers = ThreadPoolExecutor(max_workers=cfg.workers), _Workers(cfg, out_dir / PARTIAL_DIR)
    try:
        with tqdm(total=len(rows), unit="clip", desc="download", disable=not progress, dynamic_ncols=True) as bar:
            futures = [pool.submit(fetch_clip, cfg, row, out_dir, workers) for row in rows]
            for fut in as_completed(futures):
                results.append(fut.result())  # only unexpected errors (disk full, bugs) raise here, and stop the run
                bar.update(1)
                bar.set_postfix(failed=sum(r.status == "failed" for r in results), refresh=False)
    finally:  # also on Ctrl-C or an unexpected error: record what is known; finished flacs are complete files
        pool.shutdown(wait=True, cancel_futures=True)
        workers.close()
        elapsed = time.monotonic() - t0
        failures = sorted((r.failure for r in results if r.failure), key=lambda f: f.csv_row)
        write_text_atomic(
            out_dir / FAILURES_FILE,
            "".join(json.dumps(asdict(f), ensure_ascii=False, allow_nan=False) + "\n" for f in failures),
        )
        if not any((out_dir / PARTIAL_DIR).iterdir()):
            (out_dir / PARTIAL_DIR).rmdir()

    counts = {"rows": len(rows), **{s: sum(r.status == s for r in results) for s in ("fetched", "present", "failed")}}
    by_reason = dict(Counter(f.reason for f in failures).most_common())
    flac_bytes = sum(r.bytes for r in results if r.status == "fetched")
    download_bytes = sum(r.download_bytes for r in results)
    section_clips = sum(r.section for r in results)
    summary = {"counts": counts, "failures_by_reason": by_reason, "elapsed_s": round(elapsed, 3), "workers": cfg.workers,
               "flac_bytes": flac_bytes, "download_bytes": download_bytes, "section_clips": section_clips}  # fmt: skip
    write_text_atomic(out_dir / SUMMARY_FILE, json.dumps(summary, indent=2, allow_nan=False) + "\n")

    lines = [
        f"{out_dir}: {counts['fetched']} fetched, {counts['present']} already there, {counts['failed']} failed "
        f"of {counts['rows']} rows in {elapsed:.1f} s ({counts['fetched'] / max(elapsed, 1e-9):.2f} clips/s, {cfg.workers} workers)",
    ]
    if counts["fetched"]:
        lines.append(
            f"  {flac_bytes / counts['fetched'] / 1e6:.2f} MB flac per clip, {download_bytes / counts['fetched'] / 1e6:.2f} MB downloaded per clip "
            f"({section_clips} of {counts['fetched']} as a section of the window)"
        )
    if failures:
        lines.append(
            "  failed: "
            + ", ".join(f"{k} {v}" for k, v in by_reason.items())
            + f" (one line each in {out_dir / FAILURES_FILE}; a rerun retries them)"
        )
    code = 1 if rows and counts["fetched"] + counts["present"] == 0 else 0
    lines.append(
        f"nothing could be fetched: see {out_dir / FAILURES_FILE}" if code else f"next: make shards DATA={out_dir}"
    )
    return DownloadResult(counts, by_reason, failures, elapsed, flac_bytes, download_bytes, code, "\n".join(lines))


@hydra.main(config_path=str(find_conf_dir()), config_name="download", version_base="1.3")
def _hydra_main(dcfg: DictConfig) -> None:
    try:
        cfg: DownloadConfig = OmegaConf.to_object(dcfg)  # typed from here on
    except MissingMandatoryValue as e:
        print(
            f"error: {e.full_key} is required, e.g. python -m tokenizer_pipeline.download out_dir=build/musiccaps_audio",
            file=sys.stderr,
        )
        raise SystemExit(2) from e
    try:
        result = run_download(cfg)
    except UserError as e:  # DownloadConfigError, CsvError: config / CSV problems, before any download
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(USER_ERROR_EXIT) from None
    print(result.message, file=sys.stderr if result.exit_code else sys.stdout)
    if result.exit_code:
        raise SystemExit(result.exit_code)


def config_from_overrides(overrides: list[str]) -> DownloadConfig:
    """Compose the typed config as the CLI would (for tests and notebooks)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(find_conf_dir()), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="download", overrides=overrides))


if __name__ == "__main__":
    _hydra_main()
