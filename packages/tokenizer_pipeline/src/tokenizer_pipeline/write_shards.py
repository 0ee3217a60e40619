"""Stage: samples -> WebDataset tar shards, deterministically and resumably.

Layout (docs/shard-format.md): `<out>/<split>/shard-%06d.tar`, each sample = `<ytid>.codes.npy` + `<ytid>.json`.
Shards are planned up front: the rows of each split in CSV order, chunked by `max_samples`, so a
clip's shard never depends on what happened to other clips. Each tar is written to a temp name in
the same directory and renamed when complete; a per-shard record in `<out>/.progress/` lets a
rerun skip shards whose tar still matches its recorded sha256 and whose inputs did not change
(`ShardRecord.inputs`). `.progress/` stays after the set is complete (about 1 KB per shard): it is
what lets a later rerun heal only the shards whose audio changed; readers ignore it. Keys must match
the contract's character set `[A-Za-z0-9_-]` (no '.': WebDataset splits member names at the first dot,
`base_plus_ext`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import webdataset as wds

from .errors import UserError
from .manifest import (
    CODES_MEMBER,
    JSON_MEMBER,
    FailureRecord,
    SampleRecord,
    ShardEntry,
    dumps_strict,
    failure_from_dict,
    write_text_atomic,
)
from .musiccaps import ClipRow, check_ytids

PROGRESS_DIR = ".progress"
FINGERPRINT_FILE = "config.json"
SHARD_PATTERN = "shard-%06d.tar"
LOCK_FILE = ".lock"
# Fixed tar member metadata for byte-identical output. TarWriter takes mtime/user/group/mode
# (webdataset>=0.2.x); uid/gid stay tarfile's default 0. mtime 0 = 1970-01-01, chosen as "no time".
# An int: tarfile writes a float mtime as a PAX header (+2 x 512 bytes per member).
TAR_MTIME = 0
TAR_USER = "root"
TAR_GROUP = "root"
TAR_MODE = 0o444


class PipelineError(UserError, RuntimeError):
    """A problem with the inputs or the output directory that the user must fix; the message says how."""


@dataclass(frozen=True)
class ShardPlan:
    """Which CSV rows go into one shard."""

    split: str
    index: int  # shard number within the split, from 0
    rows: tuple[ClipRow, ...]  # in CSV order (or sources.SegmentItem in source order: the same fields used here)

    @property
    def relpath(self) -> str:
        return f"{self.split}/{SHARD_PATTERN % self.index}"

    @property
    def record_name(self) -> str:
        return f"{self.split}-{SHARD_PATTERN % self.index}".replace(".tar", ".json")


@dataclass(frozen=True)
class ShardRecord:
    """`.progress/<split>-shard-NNNNNN.json`: what a completed shard holds, for resume and the manifest."""

    entry: ShardEntry
    audio_seconds: float  # sum of the samples' duration_s
    n_frames: int  # sum of the samples' n_frames
    failures: list[FailureRecord]  # rows of this shard that produced no sample
    inputs: dict[str, list[str | None]]  # ytid -> [source file relative to audio_dir, sha256]; [None, None] = no file

    def to_json(self) -> str:
        return dumps_strict(asdict(self), indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ShardRecord:
        d = json.loads(text)
        return cls(
            entry=ShardEntry(**d["entry"]),
            audio_seconds=d["audio_seconds"],
            n_frames=d["n_frames"],
            failures=[failure_from_dict(f) for f in d["failures"]],
            inputs=d["inputs"],
        )


def check_keys(rows: Sequence[ClipRow], csv_path: Path) -> None:
    """Keys become tar member prefixes: musiccaps.check_ytids's rule. Raises PipelineError naming the rows."""
    check_ytids(rows, csv_path, PipelineError)


def plan_shards(rows: Sequence[ClipRow], split_names: Sequence[str], max_samples: int) -> list[ShardPlan]:
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


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
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
            self._file.close()
            self.partial.unlink(missing_ok=True)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}, to name exactly which fingerprint keys changed."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


class ProgressStore:
    """`<out>/.progress/`: the config fingerprint and one record per completed shard."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.dir = out_dir / PROGRESS_DIR

    def prepare(
        self,
        fingerprint: dict[str, Any],
        split_names: Iterable[str],
        overwrite: bool,
        explain: dict[str, str] | None = None,
    ) -> None:
        """Make `out_dir` ready: fresh, resumable with the same fingerprint, or cleared by overwrite.

        Raises PipelineError when `out_dir` holds a different (or unknown) run and overwrite is False; `explain` words
        a changed fingerprint key for the message (e.g. csv_sha256 of a source that is not a CSV).
        """
        fp_path = self.dir / FINGERPRINT_FILE
        entries = [p for p in self.out_dir.iterdir() if p.name != LOCK_FILE] if self.out_dir.is_dir() else []
        if entries and not overwrite:
            if not fp_path.is_file():
                raise PipelineError(
                    f"out_dir {self.out_dir} is not empty and holds no {PROGRESS_DIR}/{FINGERPRINT_FILE} from this "
                    "pipeline; choose an empty out_dir, or pass overwrite=true to clear its shards"
                )
            old = json.loads(fp_path.read_text(encoding="utf-8"))
            if old != fingerprint:
                a, b = _flatten(old), _flatten(fingerprint)
                changed = [
                    (explain or {}).get(k, k) for k in sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
                ]
                raise PipelineError(
                    f"out_dir {self.out_dir} holds shards from a different config (changed: {', '.join(changed)}); "
                    "pass overwrite=true to delete them and start over, or choose another out_dir"
                )
        if overwrite:
            self.clear(split_names)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.dir.mkdir(exist_ok=True)
        # The set is incomplete from here until the manifest is written again.
        (self.out_dir / "manifest.json").unlink(missing_ok=True)
        for split in split_names:
            for p in (self.out_dir / split).glob("shard-*.tar.partial"):
                p.unlink()
        write_text_atomic(fp_path, dumps_strict(fingerprint, indent=1, sort_keys=True) + "\n")

    def clear(self, split_names: Iterable[str]) -> None:
        """Delete only what this pipeline writes (never other files a user keeps in out_dir)."""
        for name in ("manifest.json", "failures.jsonl"):
            (self.out_dir / name).unlink(missing_ok=True)
        if self.dir.is_dir():
            shutil.rmtree(self.dir)
        for split in split_names:
            d = self.out_dir / split
            for p in list(d.glob("shard-*.tar")) + list(d.glob("shard-*.tar.partial")):
                p.unlink()
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()

    def completed(self, plan: ShardPlan) -> ShardRecord | None:
        """The shard's record if its tar exists and still has the recorded size and sha256, else None."""
        rec_path = self.dir / plan.record_name
        tar = self.out_dir / plan.relpath
        if not (rec_path.is_file() and tar.is_file()):
            return None
        try:
            rec = ShardRecord.from_json(rec_path.read_text(encoding="utf-8"))
        except (KeyError, TypeError, json.JSONDecodeError):  # a record from an older version: redo the shard
            return None
        if rec.entry.bytes != tar.stat().st_size or rec.entry.sha256 != sha256_file(tar):
            return None
        return rec

    def save(self, plan: ShardPlan, record: ShardRecord) -> None:
        write_text_atomic(self.dir / plan.record_name, record.to_json())

    def stale_shards(self, plans: Sequence[ShardPlan], split_names: Iterable[str]) -> list[Path]:
        """Shard tars in out_dir that the plan does not produce."""
        planned = {self.out_dir / p.relpath for p in plans}
        return sorted(p for s in split_names for p in (self.out_dir / s).glob("shard-*.tar") if p not in planned)

    def remove_stale(self, plans: Sequence[ShardPlan], split_names: Iterable[str]) -> None:
        """Delete the stale shard tars and their progress records: their samples are not in the set any more (the
        plan has fewer shards than a previous run), so a fresh run would not have them either."""
        split_names = list(split_names)
        for tar in self.stale_shards(plans, split_names):
            (self.dir / f"{tar.parent.name}-{tar.name}".replace(".tar", ".json")).unlink(missing_ok=True)
            tar.unlink()
