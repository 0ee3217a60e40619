"""source=audiofolder: a Hugging Face `audiofolder` directory -> Tracks.

Layout (as `datasets.load_dataset("audiofolder", data_dir=DIR)` reads it): audio files plus a `metadata.csv` or
`metadata.jsonl` with a `file_name` column (the audio file, relative to the metadata file's folder) and any other
columns (text, numbers). The metadata file sits in DIR, or one per split folder. Split folders (first level only),
as datasets names them:
    train/ training/                                        -> split.train_name
    validation/ valid/ val/ dev/ test/ testing/ eval/ evaluation/  -> split.eval_name
Without split folders each track's split is chosen by hash (`split.eval_fraction`, splits.py).

Paths: `file_name` must be relative, without '..', and stay inside DIR; anything else stops the run before any
audio is read, naming the metadata file and line. Audio files that no metadata row names are not read (as in
datasets, every example is a metadata row).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from .track import NotJsonConstant, SourceError, Track, check_relative, refuse_constant

METADATA_NAMES = ("metadata.csv", "metadata.jsonl")
FILE_COLUMN = "file_name"
TRAIN_DIRS = ("train", "training")
EVAL_DIRS = ("validation", "valid", "val", "dev", "test", "testing", "eval", "evaluation")


def split_of_dir(name: str) -> str | None:
    """ "train" | "eval" for a split folder name (case-insensitive), else None."""
    low = name.lower()
    return "train" if low in TRAIN_DIRS else "eval" if low in EVAL_DIRS else None


def metadata_files(root: Path) -> list[Path]:
    """The metadata files: DIR's own and each split folder's, sorted by path; SourceError when none or two in one."""
    if not root.is_dir():
        raise SourceError(f"audiofolder source.dir={root} is not a directory")
    folders = [root] + sorted(p for p in root.iterdir() if p.is_dir() and split_of_dir(p.name))
    found = []
    for folder in folders:
        here = [folder / n for n in METADATA_NAMES if (folder / n).is_file()]
        if len(here) > 1:
            raise SourceError(f"{folder} has both {' and '.join(METADATA_NAMES)}; keep one of them")
        found += here
    if not found:
        raise SourceError(
            f"audiofolder {root} has no {' or '.join(METADATA_NAMES)} (in it or in a train/, test/, validation/ "
            f"folder); write one with a {FILE_COLUMN} column and a caption column"
        )
    return found


def _csv_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    text = _text(path)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, [])
        rows, line = [], reader.line_num + 1
        for record in reader:
            if record:
                if len(record) != len(header):
                    raise SourceError(f"{path}:{line}: {len(record)} fields, the header has {len(header)}")
                rows.append((line, dict(zip(header, record))))
            line = reader.line_num + 1
    except csv.Error as e:
        raise SourceError(f"{path}: cannot parse CSV ({e}); check the quoting") from e
    return rows


def _jsonl_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    for line, text in enumerate(_text(path).splitlines(), start=1):
        if not text.strip():
            continue
        try:
            d = json.loads(text, parse_constant=refuse_constant)
        except NotJsonConstant as e:
            raise SourceError(f"{path}:{line}: {e}") from e
        except ValueError as e:
            raise SourceError(f"{path}:{line}: not a JSON object ({e}); fix or delete that line") from e
        if not isinstance(d, dict):
            raise SourceError(f"{path}:{line}: not a JSON object")
        rows.append((line, d))
    return rows


def _text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"cannot read {path}: {e}; metadata must be UTF-8") from e


def _audio_path(root: Path, folder: Path, name: Any, where: str) -> Path:
    """`folder / name`, refused unless it is relative, without '..' and inside root."""
    if not isinstance(name, str) or not name.strip():
        raise SourceError(f"{where}: {FILE_COLUMN} is missing or empty; every row names its audio file")
    if name.startswith(("/", "\\")) or Path(name).is_absolute():
        raise SourceError(f"{where}: {FILE_COLUMN} {name!r} is absolute; it must be relative to {folder}")
    check_relative(name, where, FILE_COLUMN)
    path = folder / name
    if not path.parent.resolve().is_relative_to(root.resolve()):  # the file itself may be a link, as in audio_dir
        raise SourceError(f"{where}: {FILE_COLUMN} {name!r} leads outside {root} (through a linked folder)")
    return path


def read_audiofolder(root: Path) -> tuple[list[Track], list[Path]]:
    """Every metadata row as a Track (metadata files in path order, rows in file order), and the metadata files."""
    root = Path(root)
    files = metadata_files(root)
    tracks: list[Track] = []
    seen: dict[str, str] = {}
    for mfile in files:
        rows = _csv_rows(mfile) if mfile.suffix == ".csv" else _jsonl_rows(mfile)
        for line, row in rows:
            where = f"{mfile}:{line}"
            audio = _audio_path(root, mfile.parent, row.get(FILE_COLUMN), where)
            rel = audio.relative_to(root).as_posix()
            if rel in seen:
                raise SourceError(f"{where}: {FILE_COLUMN} {rel!r} repeats {seen[rel]}; remove the duplicate row")
            seen[rel] = where
            first = rel.split("/", 1)[0] if "/" in rel else ""
            tracks.append(
                Track(
                    line=line, source_path=row[FILE_COLUMN], audio_path=audio, source_file=rel, metadata=dict(row),
                    split=split_of_dir(first), metadata_file=mfile.relative_to(root).as_posix(),
                )
            )  # fmt: skip
    return tracks, files
