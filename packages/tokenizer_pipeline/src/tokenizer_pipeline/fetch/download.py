"""MusicCaps CSV -> `<out_dir>/<ytid>.flac` (`python -m tokenizer_pipeline.download`).

Parse the CSV, lock out_dir (`.download.lock`), skip rows whose flac exists, fetch the rest in worker threads
(clip.py: a section of the stream, cut sample-exact by the ffmpeg program), write `download_failures.jsonl` and
`download_summary.json`. Failures never stop the run; it exits non-zero only when nothing could be fetched.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import OmegaConf
from tqdm import tqdm

from ..audio.ffmpeg_binary import find_ffmpeg
from ..dir_lock import lock_dir
from ..hydra_cli import find_conf_dir
from ..shards.manifest import write_text_atomic
from ..sources.musiccaps import ClipRow, check_ytids, read_musiccaps_csv
from .clip import PARTIAL_DIR, SECTION_MIN_LEAD_IN_S, ClipResult, DownloadFailure, fetch_clip
from .config import DownloadConfig, DownloadConfigError
from .youtube import Workers

FAILURES_FILE = "download_failures.jsonl"
SUMMARY_FILE = "download_summary.json"
LOCK_FILE = ".download.lock"  # held while a run writes out_dir (a second run into it is refused)


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
    pool, workers = ThreadPoolExecutor(max_workers=cfg.workers), Workers(cfg, out_dir / PARTIAL_DIR)
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


def config_from_overrides(overrides: list[str]) -> DownloadConfig:
    """Compose the typed config as the CLI would (for tests and notebooks)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(find_conf_dir()), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="download", overrides=overrides))
