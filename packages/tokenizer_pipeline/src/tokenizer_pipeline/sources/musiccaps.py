"""Stage: read the MusicCaps CSV into typed rows, one `ClipRow` per clip, in file order.

The whole CSV is parsed before any clip is encoded: malformed rows refuse the run up front with one `CsvRowError`
listing every bad row's line, column and value, never skipped (their ytid or window cannot be trusted).
"""

from __future__ import annotations

import ast
import codecs
import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, UserError
from ..shards.keys import MAX_KEY_LEN, key_problem
from .splits import check_split_names

BOOL_COLUMNS = ("is_audioset_eval", "is_balanced_subset")  # allowed split.eval_column values
COLUMNS = (
    "ytid", "start_s", "end_s", "audioset_positive_labels", "aspect_list",
    "caption", "author_id", "is_balanced_subset", "is_audioset_eval",
)  # fmt: skip


ENCODING_COLUMNS = ("ytid", "start_s", "end_s", "caption")  # what encoding reads, with the split column
# the other columns, when a CSV lacks them: what generated shards write (docs/shard-format.md)
ABSENT_VALUES = {
    "audioset_positive_labels": "", "aspect_list": "[]", "author_id": "-1",
    "is_balanced_subset": "False", "is_audioset_eval": "False",
}  # fmt: skip


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


MAX_REPORTED = 20  # malformed rows listed in one CsvRowError message
ROW_FIX = (
    "Fix or delete these rows and rerun. The published musiccaps-public.csv parses cleanly; a broken row "
    "usually comes from editing it in a spreadsheet (unquoted comma or newline in a caption, a changed "
    "True/False, a list column that lost its brackets)."
)


class CsvError(UserError, ValueError):
    """The CSV cannot be used (missing, unreadable, wrong header); the message names the file and the fix."""


class CsvHeaderError(CsvError):
    """The CSV's header (line 1) lacks a column encoding reads; the message names them and what is optional."""


class CsvRowError(CsvError):
    """Malformed CSV row(s); the message names the file, each line and column, and the fix. `csv_row` is the first
    malformed row's 1-based line (header is line 1), `problems` `(line, message)` for every one."""

    def __init__(self, csv_path: Path, csv_row: int, msg: str, problems: list[tuple[int, str]] | None = None) -> None:
        super().__init__(f"{csv_path}:{csv_row}: {msg}")
        self.csv_path = csv_path
        self.csv_row = csv_row
        self.problems = problems if problems is not None else [(csv_row, msg)]


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
    raw: dict[str, str], csv_path: Path, csv_row: int, *, train_name: str = "train", eval_name: str = "eval",
    eval_column: str = "is_audioset_eval",
) -> ClipRow:  # fmt: skip
    """Parse one `csv.DictReader` row; raises `CsvRowError` naming file, line and column."""
    parsers = {
        "ytid": str.strip, "start_s": float, "end_s": float,
        "audioset_positive_labels": lambda s: tuple(x.strip() for x in s.split(",") if x.strip()),
        "aspect_list": _parse_aspects, "caption": str, "author_id": int,
        "is_balanced_subset": _parse_bool, "is_audioset_eval": _parse_bool,
    }  # fmt: skip
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
    for col in ("start_s", "end_s"):  # float() also parses "nan", "-inf" and "1e999"
        if not math.isfinite(values[col]) or values[col] < 0:
            raise CsvRowError(csv_path, csv_row, f"column {col!r}: {raw[col]!r} is not a finite number >= 0 (seconds)")
    if values["end_s"] <= values["start_s"]:
        raise CsvRowError(csv_path, csv_row, f"end_s={values['end_s']} is not after start_s={values['start_s']}")
    split = eval_name if values[eval_column] else train_name
    return ClipRow(**values, split=split, csv_row=csv_row)


def _read_text(csv_path: Path) -> str:
    """The CSV's text, decoded as UTF-8 (a leading byte-order mark, as spreadsheets save it, is dropped).

    Read whole (the MusicCaps CSV is 3 MB) so that a bad byte is reported with its own line number.
    """
    try:
        data = csv_path.read_bytes()
    except OSError as e:
        raise CsvError(
            f"cannot read MusicCaps CSV {csv_path}: {e.strerror or e}; check the path and its permissions"
        ) from e
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise CsvError(f"{csv_path}:{line}: not UTF-8 text ({e.reason}); save the CSV as UTF-8") from e


def read_musiccaps_csv(
    csv_path: Path, *, train_name: str = "train", eval_name: str = "eval", eval_column: str = "is_audioset_eval"
) -> list[ClipRow]:
    """All of the CSV's rows in file order, or an error before any work is done. `csv_row` is the line a row starts
    on (captions may contain newlines); the split is `eval_name` where the boolean `eval_column` is True.

    Raises:
        CsvRowError: one or more malformed rows (all of them listed).
        CsvError: the file is missing, not UTF-8, has broken quoting, or lacks columns.
        ConfigError: unusable split settings.
    """
    if eval_column not in BOOL_COLUMNS:
        raise ConfigError(
            f"split.eval_column={eval_column!r} is not a boolean MusicCaps column; use one of {BOOL_COLUMNS}"
        )
    check_split_names(train_name, eval_name)
    csv_path = Path(csv_path)
    if not csv_path.is_file():
        raise CsvError(
            f"MusicCaps CSV not found: {csv_path}. The repo ships it at data/musiccaps/musiccaps-public.csv; "
            f"pass csv=/path/to/musiccaps-public.csv"
        )
    text = _read_text(csv_path)
    rows: list[ClipRow] = []
    problems: list[tuple[int, str]] = []
    line = 1
    try:
        # csv.reader, not DictReader: DictReader skips blank lines inside one step, so the line a row starts on
        # (the line after the previous record's last line) could not be told; here a blank line is its own [] record.
        reader = csv.reader(io.StringIO(text, newline=""))
        fieldnames: list[str] = next((r for r in reader if r), [])
        needed = [*ENCODING_COLUMNS, eval_column]
        missing = [c for c in needed if c not in fieldnames]
        if missing:
            raise CsvHeaderError(
                f"{csv_path}: its header (line 1) lacks the column(s) {missing}; encoding reads {needed} (the "
                f"others of musiccaps-public.csv, {[c for c in COLUMNS if c not in needed]}, are carried when present). "
                f"Name the columns in the CSV's first line, or set split.eval_column to the boolean column it has"
            )
        absent = {c: v for c, v in ABSENT_VALUES.items() if c not in fieldnames}
        line = reader.line_num + 1  # first data row starts after the header's last line
        for record in reader:
            if record:  # as DictReader: surplus fields under the key None, missing ones absent
                raw: dict = absent | dict(zip(fieldnames, record))
                if len(record) > len(fieldnames):
                    raw[None] = record[len(fieldnames) :]
                try:
                    split_kw = {"train_name": train_name, "eval_name": eval_name, "eval_column": eval_column}
                    rows.append(parse_row(raw, csv_path, line, **split_kw))
                except CsvRowError as e:
                    problems.extend(e.problems)
            line = reader.line_num + 1
    except csv.Error as e:
        raise CsvError(f"{csv_path}:{line}: cannot parse CSV ({e}); check the quoting from that line on") from e
    if problems:
        listed = "\n".join(f"  line {n}: {msg}" for n, msg in problems[:MAX_REPORTED])
        more = f"\n  ... and {len(problems) - MAX_REPORTED} more" if len(problems) > MAX_REPORTED else ""
        first, msg = problems[0]
        raise CsvRowError(
            csv_path, first,
            f"{msg}\n{len(problems)} malformed row(s) in {csv_path}; nothing was encoded:\n{listed}{more}\n{ROW_FIX}",
            problems,
        )  # fmt: skip
    return rows


def check_ytids(rows: Sequence[ClipRow], csv_path: Path, error: type[Exception]) -> None:
    """ytids become sample keys (tar member prefixes) and audio file names: `keys.key_problem`'s rule, no repeats.

    One rule for `make audio` and `make shards`; each raises its own user-error type (`error`), naming the CSV row.
    """
    seen: dict[str, int] = {}
    for r in rows:
        problem = key_problem(r.ytid)
        if problem:
            shown = r.ytid if len(r.ytid) <= 40 else f"{r.ytid[:40]}..."
            raise error(
                f"{csv_path}:{r.csv_row}: ytid {shown!r} {problem}; sample keys may only use A-Z a-z 0-9 _ -, "
                f"at most {MAX_KEY_LEN} characters (docs/shard-format.md); fix the CSV row"
            )
        if r.ytid in seen:
            raise error(
                f"{csv_path}:{r.csv_row}: ytid {r.ytid!r} repeats row {seen[r.ytid]}; keys must be unique "
                "within a shard set, remove the duplicate row"
            )
        seen[r.ytid] = r.csv_row
