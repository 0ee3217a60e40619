"""Split settings every source shares, and which split a whole track goes to when the source names none.

Split names become directories of the set, so every source checks them (`check_split_names`). A track's split is a
function of its audio's sha256 (docs/shard-format.md, "The split of your own audio"); `KeptSplits` keeps the split an
existing set gives a track, and a track with no file to hash is labelled by its track id (`is_eval`).
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ..errors import ConfigError
from ..shards.keys import KEY_RULE, key_problem


def audio_sha256(path: Path) -> str:
    """sha256 of the file's bytes, remembered per process while its size and mtime stay: planning hashes every track
    once (its split), and the resume check and each decode worker reuse it."""
    st = Path(path).stat()
    return _sha256_of(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=1 << 16)  # about 20 MB of hashes; least recently used dropped first
def _sha256_of(path: str, size: int, mtime_ns: int) -> str:
    """The file's sha256, cached by (path, size, mtime): a changed file is read again."""
    from ..shards.write_shards import sha256_file  # not at import: `make audio` reads split names, never torch

    return sha256_file(Path(path))


def unit(sha256_hex: str) -> float:
    """A position in [0, 1) from the first 64 bits of a sha256 hex digest."""
    return int(sha256_hex[:16], 16) / 2**64


def audio_is_eval(sha256_hex: str, eval_fraction: float) -> bool:
    """The split rule: eval when the audio file's sha256 falls below eval_fraction."""
    return unit(sha256_hex) < eval_fraction


def track_unit(track_id: str) -> float:
    """The position of a track id in [0, 1), from the first 64 bits of sha256(track_id)."""
    return unit(hashlib.sha256(track_id.encode("utf-8")).hexdigest())


def is_eval(track_id: str, eval_fraction: float) -> bool:
    """The label of a track with no audio to hash (its failure line only)."""
    return track_unit(track_id) < eval_fraction


@dataclass(frozen=True)
class KeptSplits:
    """The splits an existing set in out_dir gives the tracks it holds samples of, when the source is encoded into it
    again: by the audio's sha256, then by the file, then by the file without its extension (a collection converted
    from WAV to FLAC keeps its keys, which carry no extension, and so keeps its splits)."""

    by_sha256: dict[str, str] = field(default_factory=dict)
    by_file: dict[str, str] = field(default_factory=dict)

    def of(self, sha256_hex: str | None, source_file: str) -> str | None:
        """The split the set holds this audio (or this file, or this file under another extension) in, or None for a
        track it does not hold."""
        return (
            (self.by_sha256.get(sha256_hex) if sha256_hex else None)
            or self.by_file.get(source_file)
            or self.by_file.get(without_suffix(source_file))
        )


def without_suffix(source_file: str) -> str:
    """`dir/a.flac` -> `dir/a` (the key a file's track id comes from carries no extension)."""
    return str(PurePosixPath(source_file).with_suffix("")) if PurePosixPath(source_file).suffix else source_file


def check_eval_fraction(eval_fraction: float) -> None:
    if not (isinstance(eval_fraction, (int, float)) and math.isfinite(eval_fraction) and 0 <= eval_fraction <= 1):
        raise ConfigError(f"split.eval_fraction={eval_fraction} must be between 0 and 1 (the share of tracks in eval)")


def check_split_names(train_name: str, eval_name: str) -> None:
    """Split names become directories of the shard set: plain names under the sample-key rule, and different.

    Raises ConfigError (exit 2, one line) naming the key; every source calls it before anything is written."""
    for key, name in (("split.train_name", train_name), ("split.eval_name", eval_name)):
        problem = key_problem(name)
        if problem:
            raise ConfigError(
                f"{key}={name!r} {problem}; a split name is a plain directory name inside out_dir (e.g. train, eval): "
                f"{KEY_RULE}"
            )
    if train_name == eval_name:
        raise ConfigError(f"split.train_name and split.eval_name must differ, both are {train_name!r}")
    if train_name.casefold() == eval_name.casefold():  # one directory on a case-insensitive file system
        raise ConfigError(
            f"split.train_name={train_name!r} and split.eval_name={eval_name!r} differ only in letter case, so they "
            "are one directory on macOS and Windows; rename one"
        )
