"""`python -m tokenizer_pipeline.download out_dir=DIR [hydra overrides]`: MusicCaps CSV -> `<out_dir>/<ytid>.flac`.

For each CSV row: yt-dlp (used as a library) downloads the row's window of the video's audio
(`format=bestaudio/best`): only `[start_s, end_s]` plus `section_margin_s` either side where the
container allows (M4A/MP4, WebM: yt-dlp's `download_ranges`, done by the ffmpeg binary with HTTP Range
requests), else the whole stream. The ffmpeg binary (`audio/ffmpeg_binary.py`: system or imageio-ffmpeg wheel)
then cuts `[start_s, end_s]` exactly (on the whole stream's sample grid, also from a section) to a
16-bit flac at the source's sample rate, written under a temporary name and renamed. The exact cut is
done by us (`clip.py`), not by yt-dlp: a section alone is not sample-exact (10.013-10.016 s for a 10-s window), and
yt-dlp's post-processors need `ffprobe`, which the wheel does not ship. A section that cannot be placed
to the sample, or that a server ignoring Range breaks, is replaced by the whole stream.
The output directory feeds `make shards DATA=<out_dir>` unchanged.

Reads top to bottom: parse CSV -> lock out_dir (`.download.lock`, as `make shards` locks its own) ->
skip rows whose flac exists -> worker threads fetch the rest (each retries transient errors with
backoff) -> `download_failures.jsonl` + `download_summary.json` -> summary.
Failures never stop the run; it exits non-zero only when nothing at all could be fetched.
Config: conf/tokenizer_pipeline/download.yaml over the `DownloadConfig` schema (`config.py`).

This module is the run over the CSV rows (checks, lock, worker pool, failures and summary files,
the Hydra `main`); one row's clip is `clip.py`, yt-dlp itself and its error classes are `youtube.py`.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue
from tqdm import tqdm

from ..audio.ffmpeg_binary import find_ffmpeg
from ..conf_dir import find_conf_dir
from ..dir_lock import lock_dir
from ..errors import USER_ERROR_EXIT, UserError
from ..overrides import check_overrides
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


def main(argv: list[str] | None = None) -> None:
    """Entry point: the overrides' keys are checked against DownloadConfig before Hydra composes (a typo such as
    `+limt=5` would otherwise fetch every row), in one line naming the likely key, exit 2."""
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    try:
        sys.argv[1:] = check_overrides(
            sys.argv[1:], schema=DownloadConfig, conf_dir=find_conf_dir(), primary="download", groups_apply=False,
            keys_hint="python -m tokenizer_pipeline.download out_dir=DIR --cfg job, docs/configuration.md",
        )  # fmt: skip
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(USER_ERROR_EXIT) from None
    _hydra_main()


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
    main()
