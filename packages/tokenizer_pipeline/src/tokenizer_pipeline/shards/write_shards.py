"""Stage: samples -> WebDataset tar shards `<out>/<split>/shard-%06d.tar`, deterministically.

Shards are planned up front (each split's rows in source order, chunked by `max_samples`), so a clip's shard never
depends on other clips; each tar is written to a temp name and renamed, with fixed member metadata.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import webdataset as wds

from ..errors import PipelineError
from .manifest import CODES_MEMBER, JSON_MEMBER, SampleRecord, ShardEntry

SHARD_PATTERN = "shard-%06d.tar"
# Fixed tar member metadata for byte-identical output. TarWriter takes mtime/user/group/mode
# (webdataset>=0.2.x); uid/gid stay tarfile's default 0. mtime 0 = 1970-01-01, chosen as "no time".
# An int: tarfile writes a float mtime as a PAX header (+2 x 512 bytes per member).
TAR_MTIME = 0
TAR_USER = "root"
TAR_GROUP = "root"
TAR_MODE = 0o444


class PlannedSample(Protocol):
    """What shard planning reads of a planned sample: a MusicCaps `ClipRow` or a `sources.SegmentItem`."""

    ytid: str  # the sample key
    split: str


@dataclass(frozen=True)
class ShardPlan:
    """Which planned samples (CSV rows or segments) go into one shard."""

    split: str
    index: int  # shard number within the split, from 0
    rows: tuple[PlannedSample, ...]  # ClipRows in CSV order, or sources.SegmentItems in source order

    @property
    def relpath(self) -> str:
        return f"{self.split}/{SHARD_PATTERN % self.index}"

    @property
    def record_name(self) -> str:
        return f"{self.split}-{SHARD_PATTERN % self.index}".replace(".tar", ".json")


def plan_shards(rows: Sequence[PlannedSample], split_names: Sequence[str], max_samples: int) -> list[ShardPlan]:
    """Rows of each split (in `split_names` order) in CSV order, chunked by `max_samples`."""
    if max_samples < 1:
        raise PipelineError(f"shard.max_samples={max_samples} must be >= 1")
    plans = []
    for split in split_names:
        split_rows = [r for r in rows if r.split == split]
        for i in range(0, len(split_rows), max_samples):
            plans.append(ShardPlan(split, i // max_samples, tuple(split_rows[i : i + max_samples])))
    return plans


def npy_bytes(codes: np.ndarray) -> bytes:
    """`.npy` bytes of an int16 `[T, K]` array, no pickle, little-endian."""
    if codes.ndim != 2:
        raise ValueError(f"codes must be [T, K], got shape {codes.shape}")
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(codes, dtype="<i2"), version=(1, 0), allow_pickle=False)
    return buf.getvalue()


def sha256_file(*paths: Path) -> str:
    """sha256 of the files' bytes, back to back."""
    h = hashlib.sha256()
    for path in paths:
        with Path(path).open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


class ShardTarWriter:
    """Writes one shard to `<final>.partial` and renames it to `<final>` on `commit()`.

    Use as a context manager; leaving the block with an exception deletes the partial file.
    """

    def __init__(self, out_dir: Path, plan: ShardPlan) -> None:
        self.final = out_dir / plan.relpath
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.partial = self.final.with_name(self.final.name + ".partial")
        self._file = self.partial.open("wb")
        self._tar = wds.TarWriter(
            self._file, user=TAR_USER, group=TAR_GROUP, mode=TAR_MODE, mtime=TAR_MTIME, encoder=False
        )
        self.n_samples = 0

    def write(self, record: SampleRecord, codes: np.ndarray) -> None:
        """codes: int16 `[T, K]`."""
        if codes.shape != (record.n_frames, record.n_codebooks):
            raise ValueError(f"{record.ytid}: codes shape {codes.shape} != ({record.n_frames}, {record.n_codebooks})")
        self._tar.write({"__key__": record.ytid, CODES_MEMBER: npy_bytes(codes), JSON_MEMBER: record.to_json_bytes()})
        self.n_samples += 1

    def commit(self) -> ShardEntry:
        self._tar.close()  # also closes the tar stream's end blocks; the file object is ours
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self.partial, self.final)
        return ShardEntry(
            path=self.final.relative_to(self.final.parents[1]).as_posix(),
            n_samples=self.n_samples,
            bytes=self.final.stat().st_size,
            sha256=sha256_file(self.final),
        )

    def __enter__(self) -> ShardTarWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            try:
                self._file.close()  # on a full disk the buffered tail fails to flush again
            except OSError:
                pass
            finally:
                self.partial.unlink(missing_ok=True)
