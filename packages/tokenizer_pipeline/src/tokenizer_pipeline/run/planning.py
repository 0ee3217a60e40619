"""The run's planned items in source order: MusicCaps CSV rows or segments of your own audio, keys checked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..config import PipelineConfig
from ..errors import ConfigError, PipelineError
from ..shards.write_shards import sha256_file
from ..sources.musiccaps import ClipRow, CsvRowError, check_ytids, read_musiccaps_csv
from ..sources.plan import SegmentItem, SourceInfo, plan_items
from ..sources.track import SourceError
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
    try:
        items, info = plan_items(cfg, None if kept is None else kept.root, None if kept is None else kept.splits)
    except (SourceError, ConfigError) as e:
        raise PipelineError(str(e)) from e
    check_keys(items, Path(info.path))  # the key rule holds by construction (track_ids.py); checked all the same
    return list(items), info


def source_sha256(cfg: PipelineConfig, info: SourceInfo | None) -> str:
    """sha256 of the CSV, the audiocraft manifest, or the audiofolder metadata (in the fingerprint and manifest)."""
    return sha256_file(Path(cfg.csv)) if info is None else info.sha256
