"""Stage: read the MusicCaps CSV into typed rows, one `ClipRow` per clip, in file order."""
from __future__ import annotations

import ast
import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

BOOL_COLUMNS = ("is_audioset_eval", "is_balanced_subset")  # allowed split.eval_column values
COLUMNS = (
    "ytid", "start_s", "end_s", "audioset_positive_labels", "aspect_list",
    "caption", "author_id", "is_balanced_subset", "is_audioset_eval",
)  # fmt: skip


@dataclass(frozen=True)
class ClipRow:
    """One MusicCaps row, parsed. Field meanings follow docs/shard-format.md (`<ytid>.json`)."""

    ytid: str  # YouTube id, the sample key; never contains '.'
    start_s: float  # window start in the source video, seconds
    end_s: float  # window end, seconds
    audioset_positive_labels: tuple[str, ...]  # CSV column split on ','
    aspect_list: tuple[str, ...]  # CSV column parsed as a Python list literal
    caption: str  # verbatim
    author_id: int
    is_balanced_subset: bool
    is_audioset_eval: bool
    split: str  # eval_name if row[eval_column] else train_name
    csv_row: int  # 1-based line number in the CSV (header is line 1)


class CsvRowError(ValueError):
    """A malformed CSV row; the message names the file, the line and the column."""

    def __init__(self, csv_path: Path, csv_row: int, msg: str) -> None:
        super().__init__(f"{csv_path}:{csv_row}: {msg}")
        self.csv_path = csv_path
        self.csv_row = csv_row


def _parse_bool(s: str) -> bool:
    if s in ("True", "true", "1"):
        return True
    if s in ("False", "false", "0"):
        return False
    raise ValueError(f"expected True/False, got {s!r}")


def _parse_aspects(s: str) -> tuple[str, ...]:
    value = ast.literal_eval(s)  # a list literal such as "['pop', 'male vocal']"; never eval()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"expected a list of strings, got {type(value).__name__}")
    return tuple(value)


def parse_row(
    raw: dict[str, str],
    csv_path: Path,
    csv_row: int,
    *,
    train_name: str = "train",
    eval_name: str = "eval",
    eval_column: str = "is_audioset_eval",
) -> ClipRow:
    """Parse one `csv.DictReader` row; raises `CsvRowError` naming file, line and column."""
    parsers = {
        "ytid": str.strip,
        "start_s": float,
        "end_s": float,
        "audioset_positive_labels": lambda s: tuple(x.strip() for x in s.split(",") if x.strip()),
        "aspect_list": _parse_aspects,
        "caption": str,
        "author_id": int,
        "is_balanced_subset": _parse_bool,
        "is_audioset_eval": _parse_bool,
    }
    values = {}
    for col, parse in parsers.items():
        cell = raw.get(col)
        if cell is None:
            raise CsvRowError(csv_path, csv_row, f"column {col!r} is missing (row has too few fields)")
        try:
            values[col] = parse(cell)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as e:
            raise CsvRowError(csv_path, csv_row, f"column {col!r}: cannot parse {cell[:80]!r}: {e}") from e
    if None in raw:  # DictReader puts surplus fields under the key None
        raise CsvRowError(csv_path, csv_row, f"row has {len(raw[None])} more fields than the header")
    if not values["ytid"]:
        raise CsvRowError(csv_path, csv_row, "empty ytid")
    if values["end_s"] <= values["start_s"]:
        raise CsvRowError(csv_path, csv_row, f"end_s={values['end_s']} is not after start_s={values['start_s']}")
    split = eval_name if values[eval_column] else train_name
    return ClipRow(**values, split=split, csv_row=csv_row)


def read_musiccaps_csv(
    csv_path: Path, *, train_name: str = "train", eval_name: str = "eval", eval_column: str = "is_audioset_eval"
) -> Iterator[ClipRow]:
    """Yield the CSV's rows in file order. Raises `CsvRowError` on the first malformed row.

    `csv_row` is the physical line number where the row starts (captions may contain newlines).
    Split: `eval_name` where the boolean `eval_column` is True, else `train_name`.
    """
    if eval_column not in BOOL_COLUMNS:
        raise ValueError(f"split.eval_column={eval_column!r} is not a boolean MusicCaps column; use one of {BOOL_COLUMNS}")
    if train_name == eval_name:
        raise ValueError(f"split.train_name and split.eval_name must differ, both are {train_name!r}")
    csv_path = Path(csv_path)
    if not csv_path.is_file():
        raise FileNotFoundError(
            f"MusicCaps CSV not found: {csv_path}. The repo ships it at data/musiccaps/musiccaps-public.csv; "
            f"pass csv=/path/to/musiccaps-public.csv"
        )
    with csv_path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise CsvRowError(csv_path, 1, f"header lacks columns {missing}; expected {list(COLUMNS)}")
        line = reader.line_num + 1  # first data row starts after the header's last line
        for raw in reader:
            yield parse_row(raw, csv_path, line, train_name=train_name, eval_name=eval_name, eval_column=eval_column)
            line = reader.line_num + 1
