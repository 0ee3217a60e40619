"""An audiofolder metadata table (metadata.csv / .jsonl / .parquet) -> rows, each with its own problem or None.

Values are read as `datasets` reads them: csv cells pandas reads as missing (`PANDAS_NA`) are None, others stay text,
header names as pandas makes them (`csv_header`); jsonl split on '\\n' only; parquet through pyarrow (dates as ISO
text, a binary column refused). A row whose values cannot go into a sample gets a `problem` (that track's
`bad_metadata` failure); a table that cannot be parsed stops the run naming the file and line.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import math
from dataclasses import dataclass
from json.decoder import WHITESPACE, scanstring  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

from .track import SourceError, shown

MAX_NESTING = 100  # deeper metadata values are refused per row (json/pyarrow/our own walks recurse)
# pandas.read_csv's default na_values (pandas._libs.parsers.STR_NA_VALUES), what datasets reads as missing
PANDAS_NA = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                       "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})  # fmt: skip


@dataclass(frozen=True)
class Row:
    line: int  # 1-based line of the file (csv: where the row starts; parquet: the row number)
    fields: dict[str, Any]
    problem: str | None = None  # why this row's values cannot be used (its track's bad_metadata failure)


class _Constant:
    """NaN / Infinity / -Infinity in a jsonl line, kept as a marker so the row (and its file_name) survives."""

    def __init__(self, name: str) -> None:
        self.name = name


def _int(digits: str) -> int | _Constant:
    """json's parse_int: an integer of more digits than int() reads (sys.get_int_max_str_digits) is a marker."""
    try:
        return int(digits)
    except ValueError:
        return _Constant(f"a {len(digits.lstrip('-'))}-digit integer")


class _TooDeep:
    """A value nested past Python's recursion limit, skipped unparsed."""


def _text(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SourceError(f"cannot read {path}: {e.strerror or e}; check the file and its permissions") from e
    return data.decode("utf-8-sig", errors="surrogateescape")  # a bad byte is its row's problem, not the file's


def value_problem(value: Any) -> str | None:
    """Why `value` cannot be stored in a sample's JSON, or None. Iterative: a deep value cannot overflow the stack."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_NESTING:
            return f"a value nests deeper than {MAX_NESTING} levels"
        if isinstance(v, _TooDeep):
            return "a value nests deeper than Python's json can parse"
        if isinstance(v, _Constant) or (isinstance(v, float) and not math.isfinite(v)):
            name = v.name if isinstance(v, _Constant) else repr(v)
            return (f"has {name}, which is not JSON or too large to read (a number too large, or NaN); write null "
                    "for a missing value, or the number as text")  # fmt: skip
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return (f"text {shown(v)[:60]!r} is not UTF-8 (a non-UTF-8 byte, or a lone surrogate "
                        "escape such as \\udce9); save the metadata as UTF-8 and name files in UTF-8")  # fmt: skip
        elif isinstance(v, dict):
            stack += [(k, depth + 1) for k in v] + [(x, depth + 1) for x in v.values()]
        elif isinstance(v, list):
            stack += [(x, depth + 1) for x in v]
        elif not (v is None or isinstance(v, (bool, int, float))):
            return f"holds a {type(v).__name__}, which JSON cannot store"
    return None


def _row(line: int, fields: dict[str, Any]) -> Row:
    return Row(line, fields, value_problem(fields))


def csv_header(names: list[str]) -> list[str]:
    """Column names as pandas' C parser (what datasets reads with) makes them: an empty name is "Unnamed: <i>"; a
    repeat gets ".1", ".2", ... skipping names the header already has ("a,a,a.1" -> a, a.2, a.1)."""
    header = [n if n else f"Unnamed: {i}" for i, n in enumerate(names)]
    counts: dict[str, int] = {}
    for i, col in enumerate(header):
        old, count = col, counts.get(col, 0)
        while count > 0:  # pandas/_libs/parsers.pyx TextReader._get_header
            counts[old] = count + 1
            col = f"{old}.{count}"
            count = count + 1 if col in header else counts.get(col, 0)
        header[i] = col
        counts[col] = count + 1
    return header


def csv_rows(path: Path) -> list[Row]:
    reader = csv.reader(io.StringIO(_text(path), newline=""))
    rows: list[Row] = []
    try:
        header = csv_header(next(reader, []))
        line = reader.line_num + 1
        for record in reader:
            if record:
                if len(record) > len(header):
                    raise SourceError(f"{path}:{line}: {len(record)} fields, the header has {len(header)}; quote "
                                      "fields that hold a comma, or name every column in the header")  # fmt: skip
                record += [""] * (len(header) - len(record))  # a short row: the rest missing, as pandas reads it
                rows.append(_row(line, {k: None if v in PANDAS_NA else v for k, v in zip(header, record)}))
            line = reader.line_num + 1
    except csv.Error as e:
        raise SourceError(f"{path}:{reader.line_num}: cannot parse CSV ({e}); check the quoting") from e
    return rows


def _shallow_object(text: str) -> dict[str, Any]:
    """A JSON object whose nested values are too deep for json: top-level keys parsed, each too-deep value skipped
    (brackets counted outside strings) and replaced by _TooDeep. ValueError when it is not an object."""
    decoder = json.JSONDecoder(parse_constant=_Constant, parse_int=_int)
    i = WHITESPACE.match(text, 0).end()
    if text[i : i + 1] != "{":
        raise ValueError("nested too deep, and not a JSON object")
    out: dict[str, Any] = {}
    i += 1
    while True:
        i = WHITESPACE.match(text, i).end()
        if text[i : i + 1] == "}":
            return out
        if text[i : i + 1] != '"':
            raise ValueError(f"expected a key at column {i + 1}")
        key, i = scanstring(text, i + 1)
        i = WHITESPACE.match(text, i).end()
        if text[i : i + 1] != ":":
            raise ValueError(f"expected ':' at column {i + 1}")
        i = WHITESPACE.match(text, i + 1).end()
        try:
            out[key], i = decoder.raw_decode(text, i)
        except RecursionError:
            out[key], i = _TooDeep(), _skip_container(text, i)
        i = WHITESPACE.match(text, i).end()
        if text[i : i + 1] == ",":
            i += 1
        elif text[i : i + 1] != "}":
            raise ValueError(f"expected ',' or '}}' at column {i + 1}")


def _skip_container(text: str, i: int) -> int:
    """The index just past the [...] / {...} starting at text[i] (no recursion)."""
    depth = 0
    while i < len(text):
        c = text[i]
        if c == '"':
            _, i = scanstring(text, i + 1)
            continue
        depth += c in "[{"
        depth -= c in "]}"
        i += 1
        if depth == 0:
            return i
    raise ValueError("unterminated array or object")


def _json_object(text: str) -> dict[str, Any]:
    try:
        d = json.loads(text, parse_constant=_Constant, parse_int=_int)
    except RecursionError:
        d = _shallow_object(text)
    if not isinstance(d, dict):
        raise ValueError(f"a JSON {type(d).__name__}, not an object")
    return d


def jsonl_rows(path: Path) -> list[Row]:
    rows = []
    for line, text in enumerate(_text(path).split("\n"), start=1):
        if not text.strip():
            continue
        try:
            rows.append(_row(line, _json_object(text)))
        except ValueError as e:
            raise SourceError(f"{path}:{line}: not a JSON object ({e}); fix or delete that line") from e
    return rows


def parquet_rows(path: Path) -> list[Row]:
    try:
        import pyarrow.parquet as pq  # optional: comes with `datasets`; csv/jsonl need nothing
    except ImportError as e:
        raise SourceError(
            f"{path}: reading metadata.parquet needs pyarrow (`pip install pyarrow`), or convert it to "
            "metadata.jsonl (pandas.read_parquet(p).to_json('metadata.jsonl', orient='records', lines=True))"
        ) from e
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as e:
        raise SourceError(f"{path}: cannot read parquet ({e}); rewrite the file") from e
    binary = [f.name for f in table.schema if _has_binary(f.type)]
    if binary:
        raise SourceError(f"{path}: column(s) {', '.join(map(shown, binary))} hold binary values, which a sample's "
                          "JSON metadata cannot store: drop them, or store them as text (e.g. base64)")  # fmt: skip
    return [_row(n, {k: _plain(v) for k, v in r.items()}) for n, r in enumerate(table.to_pylist(), start=1)]


def _has_binary(t: Any) -> bool:
    """A pyarrow type that is, or holds, bytes (binary, large_binary, fixed_size_binary; in a list or struct)."""
    import pyarrow as pa

    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return True
    return any(_has_binary(t.field(i).type) for i in range(t.num_fields))


def _plain(v: Any) -> Any:
    """A parquet cell as JSON holds it: a NaN is None (pandas' missing value), a date / time its ISO text."""
    if isinstance(v, float) and math.isnan(v):
        return None
    return v.isoformat() if isinstance(v, (datetime.date, datetime.time)) else v


def read_rows(path: Path) -> list[Row]:
    """The table's rows in file order."""
    return {".csv": csv_rows, ".jsonl": jsonl_rows, ".parquet": parquet_rows}[path.suffix](path)
