"""The run's planned items in source order: MusicCaps CSV rows or segments of your own audio, keys checked."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..config import PipelineConfig
from ..errors import PipelineError
from ..shards.write_shards import sha256_file
from ..sources.musiccaps import ClipRow, CsvRowError, check_ytids, read_musiccaps_csv
from ..sources.plan import SegmentItem, SourceInfo, plan_items
from .kept import KeptSet

# A planned unit of work: a MusicCaps CSV row (one clip), or a segment (or track-level failure) of another source.
PlanItem = ClipRow | SegmentItem


def check_keys(rows: Sequence[PlanItem], csv_path: Path) -> None:
    """Keys become tar member prefixes: musiccaps.check_ytids's rule. Raises PipelineError naming the rows."""
    check_ytids(rows, csv_path, PipelineError)


def load_rows(cfg: PipelineConfig) -> list[ClipRow]:
    """CSV rows in file order (first `limit`), keys checked. Malformed rows stop the run up front, naming the line."""
    csv_path = Path(cfg.csv)
    try:
        rows = list(read_musiccaps_csv(
            csv_path, train_name=cfg.split.train_name, eval_name=cfg.split.eval_name, eval_column=cfg.split.eval_column
        ))  # fmt: skip
    except CsvRowError as e:
        raise PipelineError(
            f"{e}\nFix or delete that CSV row (the whole CSV is checked before any audio is read)."
        ) from e
    except (FileNotFoundError, ValueError, UnicodeDecodeError) as e:
        raise PipelineError(str(e)) from e
    rows = rows if cfg.limit is None else rows[: cfg.limit]
    check_keys(rows, csv_path)
    return rows


def load_plan(cfg: PipelineConfig, kept: KeptSet | None = None) -> tuple[list[PlanItem], SourceInfo | None]:
    """The run's planned items in source order: CSV rows (musiccaps) or segments (sources/plan.py), keys checked;
    `kept`: the id root and splits an existing set in out_dir keeps (kept.py)."""
    if cfg.source.kind == "musiccaps":
        return list(load_rows(cfg)), None
    items, info = plan_items(cfg, None if kept is None else kept.root, None if kept is None else kept.splits)
    check_keys(items, Path(info.path))  # the key rule holds by construction (track_ids.py); checked all the same
    return list(items), info


def source_sha256(cfg: PipelineConfig, info: SourceInfo | None) -> str:
    """sha256 of the CSV, the audiocraft manifest, or the audiofolder metadata (in the fingerprint and manifest)."""
    return sha256_file(Path(cfg.csv)) if info is None else info.sha256


def check_audio_dir(cfg: PipelineConfig, rows: Sequence[PlanItem], hint: str) -> None:
    """MusicCaps: at least one row's `{ytid}.<ext>` is in audio_dir (one listing of the folder, before the codec
    loads). None at all is a wrong or empty folder, refused in one line; some missing are per-row failures."""
    audio_dir = Path(str(cfg.audio_dir))
    exts = [e.lstrip(".") for e in cfg.audio_ext]
    with os.scandir(audio_dir) as it:
        names = {e.name for e in it if e.is_file()}
    if any(f"{r.ytid}.{ext}" in names for r in rows if isinstance(r, ClipRow) for ext in exts):
        return
    audio = sorted(n for n in names if n.rpartition(".")[2].lower() in exts)
    there = (
        f"{len(audio)} audio files there, none named after a CSV row (e.g. {audio[0]})"
        if audio
        else f"{len(names)} files there, none of them audio"
    )
    raise PipelineError(
        f"audio_dir={cfg.audio_dir} holds no {{ytid}}.<ext> file of the CSV's {len(rows)} rows ({there}; "
        f"ext: {', '.join(exts)}); point audio_dir at the folder of downloaded clips ({hint})"
    )


def check_out_dir(out_dir: str) -> None:
    """out_dir (or the nearest folder above it that exists) is a writable directory: checked before the codec loads,
    so a typo or a read-only disk costs no encoding time."""
    path = Path(out_dir).expanduser().absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        problem = f"{existing} is not a directory"
    elif not os.access(existing, os.W_OK | os.X_OK):
        problem = f"{existing} is not writable here"
    else:
        return
    raise PipelineError(f"out_dir={out_dir} cannot be written ({problem}); choose another out_dir")
