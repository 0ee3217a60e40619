"""A track read from a source (one manifest line or metadata row), before it is cut into segments."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserError


class SourceError(UserError, ValueError):
    """A manifest or metadata file that cannot be used (unreadable, malformed line, a path leaving its folder);
    the message names the file and line and the fix. Raised before any audio is read."""


@dataclass(frozen=True)
class Track:
    """One audio file of a source and what the source says about it."""

    line: int  # 1-based line of the manifest / metadata file that names it (the sample's csv_row)
    source_path: str  # the path as the source gives it (audiocraft `path`, audiofolder `file_name`)
    audio_path: Path  # the file to read
    # the sample's source_file and what the track id is derived from: the path relative to the source's root
    # (audiocraft: source.root or the tracks' common folder; audiofolder: its dir), shown() when it is not UTF-8
    source_file: str
    metadata: dict[str, Any] = field(default_factory=dict)  # every metadata field the source gave, verbatim
    weight: float = 1.0  # audiocraft's per-row sampling weight (> 0)
    split: str | None = None  # "train" | "eval" when the source's layout names it; None: chosen by hash
    declared_duration_s: float | None = None  # audiocraft's `duration` (the header wins when they disagree)
    metadata_file: str | None = None  # where the metadata came from (sidecar / info_path / metadata.csv), for messages
    metadata_error: str | None = None  # why its own metadata file is unusable (MetadataError): a bad_metadata failure
    problem: tuple[str, str] | None = None  # (reason, detail): any other track-level failure found reading the source


class MetadataError(SourceError):
    """One track's own metadata file (sidecar / info_path) is unusable: that track's `bad_metadata` failure, not the
    run's end (a manifest or metadata table that cannot be read still stops the run: it is every track's)."""


class NotJsonConstant(ValueError):
    """NaN / Infinity / -Infinity in a metadata file: Python's json accepts them, JSON (and the shard json) does not."""


def refuse_constant(name: str) -> None:
    """json.loads(parse_constant=refuse_constant): NaN and Infinity raise NotJsonConstant instead of becoming floats
    that the sample json cannot hold."""
    raise NotJsonConstant(f"has {name}, which is not JSON (Python's json.dump writes it for a float NaN); write null "
                          "for a missing value")  # fmt: skip


def finite_float(text: str) -> float:
    """json.loads(parse_float=finite_float): a number too large for a float (1e400 -> inf) raises NotJsonConstant,
    as NaN does: the sample json cannot hold it."""
    value = float(text)
    if not math.isfinite(value):
        raise NotJsonConstant(f"has the number {text[:40]}, too large for a float (it reads as infinity); write a "
                              "smaller number or null")  # fmt: skip
    return value


def shown(text: str) -> str:
    """`text` as UTF-8 can hold it: a lone surrogate (a byte of a non-UTF-8 file name, as os.fsdecode and audiocraft's
    manifest writer give it) becomes the visible escape '\\udce9'; any other text is returned unchanged."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_relative(raw: str, where: str, what: str) -> None:
    """A relative path must stay in its folder: no '..' component. Raises SourceError naming `where`."""
    if ".." in Path(raw).parts or ".." in raw.replace("\\", "/").split("/"):
        raise SourceError(
            f"{where}: {what} {raw!r} contains '..'; relative paths must stay inside the folder they are relative "
            "to (move the file there, or give an absolute path where the layout allows one)"
        )
