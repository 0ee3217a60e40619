"""source=audiofolder: a Hugging Face `audiofolder` directory -> Tracks, read as `datasets.load_dataset("audiofolder")`.

Which metadata files are read: audiofolder_layout.py; their values: audiofolder_rows.py. Each row names one audio file
(`file_name` or the one `<name>_file_name` column) relative to its metadata file's folder. A file name that is missing,
absolute or leads outside DIR stops the run naming the file and line; one row's bad values or path are that track's
failure, and rows naming one file are `duplicate_audio` repeats (duplicates.py).
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any

from .audiofolder_layout import find_layout
from .audiofolder_rows import Row, read_rows
from .track import SourceError, Track, check_relative, shown

FILE_COLUMN = "file_name"
NOT_UTF8_FIX = (
    "the file name is not UTF-8 (e.g. Latin-1): rename the file to UTF-8 (e.g. `convmv -f latin1 -t utf8 --notest "
    "<file>`) and its row"
)


def file_column(rows: list[Row], mfile: Path) -> str:
    """The table's audio column: `file_name` or the one `<name>_file_name`; SourceError otherwise."""
    columns = list(dict.fromkeys(k for r in rows for k in r.fields))
    lists = [c for c in columns if c == "file_names" or c.endswith("_file_names")]
    names = [c for c in columns if c == FILE_COLUMN or c.endswith("_" + FILE_COLUMN)]
    if lists or len(names) > 1:
        raise SourceError(
            f"{mfile}: names {len(lists) + len(names)} audio columns ({', '.join(lists + names)}); a track is one "
            f"audio file per row: keep one {FILE_COLUMN} column (or write one row per file)"
        )
    if not names:
        listed = columns[:20] + (["..."] if len(columns) > 20 else [])
        raise SourceError(f"{mfile}: no {FILE_COLUMN} column (columns: {listed}); add {FILE_COLUMN}, the audio file "
                          "relative to this metadata file's folder")  # fmt: skip
    return names[0]


def _relative_name(name: Any, folder: Path, where: str, column: str) -> str:
    """`name` as a '/'-separated relative path; SourceError unless it is relative and without '..'."""
    if not isinstance(name, str) or not name.strip():
        raise SourceError(f"{where}: {column} is missing or empty; every row names its audio file")
    if name.startswith(("/", "\\")) or Path(name).is_absolute() or "://" in name:
        raise SourceError(f"{where}: {column} {shown(name)!r} is absolute; it must be relative to {folder}")
    check_relative(name, where, column)
    return posixpath.normpath(name.replace("\\", "/"))  # datasets: os.path.normpath(name).replace("\\", "/")


def _visible(text: str) -> str:
    """`text` as UTF-8 and a path can hold it: a lone surrogate as '\\udce9', a NUL as '\\x00'."""
    return shown(text).replace("\x00", "\\x00")


def _path_problem(raw: str, rel: str, where: str, column: str) -> tuple[str, str] | None:
    """The track's `bad_path` problem for a file name no file can have, or None."""
    if "\x00" in raw:
        return ("bad_path", f"{where}: {column} {shown(raw)!r} holds a NUL character, which no file name can: "
                            "fix the name in that row")  # fmt: skip
    if raw.replace("\\", "/").rstrip().endswith(("/", "/.")) or raw.strip() == ".":
        return ("bad_path", f"{where}: {column} {shown(raw)!r} names a folder, not an audio file: add the file's "
                            "name (e.g. sub/a.wav)")  # fmt: skip
    if shown(rel) != rel:  # a lone surrogate: a byte of a non-UTF-8 name (or a broken \\udcXX escape)
        return ("bad_path", f"{where}: {column} {shown(rel)!r}: {NOT_UTF8_FIX}")
    return None


def _check_inside(root: Path, path: Path, name: str, where: str, column: str) -> None:
    """SourceError when the file's folder lies outside root (a linked folder); a link loop is left to the read."""
    if "\x00" in name:  # no such file (its track's bad_path); resolve() would raise ValueError
        return
    try:
        parent = path.parent.resolve()
    except (OSError, RuntimeError):  # a symlink loop: the file cannot be opened, its track fails as missing
        return
    if not parent.is_relative_to(root.resolve()):  # the file itself may be a link, as in audio_dir
        raise SourceError(f"{where}: {column} {shown(name)!r} leads outside {root} (through a linked folder)")


def read_audiofolder(root: Path) -> tuple[list[Track], list[Path]]:
    """Every metadata row as a Track (metadata files in path order, rows in file order), and the metadata files."""
    root = Path(root)
    layout = find_layout(root)
    tracks: list[Track] = []
    for mfile in layout.splits:
        rows = read_rows(mfile)
        column = file_column(rows, mfile) if rows else FILE_COLUMN
        rel_file = shown(mfile.relative_to(root).as_posix())
        for row in rows:
            where = f"{shown(str(mfile))}:{row.line}"
            name = _relative_name(row.fields.get(column), mfile.parent, where, column)
            audio = mfile.parent / name
            _check_inside(root, audio, name, where, column)
            rel = audio.relative_to(root).as_posix()
            meta_error = None if row.problem is None else f"{where}: {row.problem}"
            problem = _path_problem(row.fields[column], rel, where, column)
            bad = problem is not None or meta_error is not None
            tracks.append(
                Track(
                    line=row.line, source_path=_visible(row.fields[column]), audio_path=Path(_visible(str(audio))) if bad else audio,
                    source_file=_visible(rel), metadata={} if bad else dict(row.fields), split=layout.our_split(mfile),
                    metadata_file=rel_file, metadata_error=meta_error, problem=problem,
                )
            )  # fmt: skip
    return tracks, list(layout.splits)
