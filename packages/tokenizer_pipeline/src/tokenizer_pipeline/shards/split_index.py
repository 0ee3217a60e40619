"""The per-split index sidecar (docs/shard-format.md#the-split-index): what a reader needs to start.

`<split>/index.safetensors` holds, per sample in shard and tar order, its key, its members' payload offsets, weight
and text digests, plus the split's code counts. safetensors: read without pickles, bytes a pure function of the arrays
(not .npz, which stamps times), and ONE metadata key (several are written in hash order). Parts come from the tars
alone (`shard_part`), so writer, rerun and `verify` agree; `assemble` concatenates them.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import load, save

from .manifest import CODES_MEMBER, JSON_MEMBER

INDEX_FILE = "index.safetensors"
INDEX_FORMAT = "musiccaps-encodec-shards-index/1"  # the sidecar's one metadata value ("format")
# per-sample columns, [N] each except `key` ([N, W] ASCII bytes, zero-padded); `code_counts` is [K, C]
COLUMNS = {
    "key": np.uint8,
    "codes_offset": np.int64,  # byte offset of <key>.codes.npy's payload in its tar
    "codes_size": np.int64,
    "json_offset": np.int64,
    "json_size": np.int64,
    "weight": np.float64,  # the sample's `weight` field, 1.0 when absent
    "caption_digest": np.uint64,  # text_digest(caption)
    "aspects_digest": np.uint64,  # text_digest(", ".join(aspect_list))
}


def text_digest(text: str) -> int:
    """The first 8 bytes of BLAKE2b-64 of the text's UTF-8, as a little-endian unsigned integer."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


@dataclass(frozen=True)
class ShardPart:
    """One shard's rows of the index (tar order) and its code counts."""

    columns: dict[str, np.ndarray]  # COLUMNS; key as [n] np.bytes_
    code_counts: np.ndarray  # [K, C] int64

    def to_bytes(self) -> bytes:
        keys = self.columns["key"]
        return save(
            {**{k: v for k, v in self.columns.items() if k != "key"}, "key": _key_matrix(keys),
             "code_counts": self.code_counts},
            metadata={"format": INDEX_FORMAT},
        )  # fmt: skip

    @classmethod
    def from_bytes(cls, data: bytes) -> ShardPart:
        t = load(data)
        cols = {k: t[k] for k in COLUMNS if k != "key"}
        cols["key"] = key_strings(t["key"])
        return cls(cols, t["code_counts"])


def _key_matrix(keys: np.ndarray) -> np.ndarray:
    """[n] np.bytes_ -> [n, W] uint8 (W: the longest key, at least 1), zero-padded."""
    width = max(int(keys.dtype.itemsize), 1) if len(keys) else 1
    return np.frombuffer(keys.astype(f"S{width}").tobytes(), dtype=np.uint8).reshape(len(keys), width).copy()


def key_strings(matrix: np.ndarray) -> np.ndarray:
    """[n, W] uint8 -> [n] np.bytes_ (trailing zeros dropped)."""
    m = np.ascontiguousarray(matrix, dtype=np.uint8)
    return m.view(f"S{m.shape[1]}").reshape(m.shape[0])


def shard_part(tar_path: Path, n_codebooks: int, codebook_size: int) -> ShardPart:
    """The index rows and code counts of one shard, read from the tar (every member: codes are counted)."""
    rows: dict[str, dict[str, object]] = {}
    counts = np.zeros((n_codebooks, codebook_size), dtype=np.int64)
    with tarfile.open(tar_path, "r:") as tar:
        for m in tar:
            key, _, member = m.name.partition(".")
            f = tar.extractfile(m)
            if f is None:
                raise ValueError(f"{tar_path}: member {m.name!r} is not a regular file")
            data = f.read()
            row = rows.setdefault(key, {})
            if member == CODES_MEMBER:
                row["codes"] = (m.offset_data, m.size)
                codes = np.load(io.BytesIO(data), allow_pickle=False)  # [T, K]
                for k in range(n_codebooks):
                    counts[k] += np.bincount(codes[:, k].astype(np.int64), minlength=codebook_size)[:codebook_size]
            elif member == JSON_MEMBER:
                row["json"] = (m.offset_data, m.size)
                meta = json.loads(data)
                row["weight"] = float(meta.get("weight", 1.0))
                row["caption"] = text_digest(meta["caption"])
                row["aspects"] = text_digest(", ".join(str(a) for a in meta["aspect_list"]))
    vals = list(rows.values())
    cols = {
        "key": np.array([k.encode("ascii") for k in rows], dtype=np.bytes_) if rows else np.zeros(0, "S1"),
        "codes_offset": np.array([v["codes"][0] for v in vals], dtype=np.int64),  # type: ignore[index]
        "codes_size": np.array([v["codes"][1] for v in vals], dtype=np.int64),  # type: ignore[index]
        "json_offset": np.array([v["json"][0] for v in vals], dtype=np.int64),  # type: ignore[index]
        "json_size": np.array([v["json"][1] for v in vals], dtype=np.int64),  # type: ignore[index]
        "weight": np.array([v["weight"] for v in vals], dtype=np.float64),
        "caption_digest": np.array([v["caption"] for v in vals], dtype=np.uint64),
        "aspects_digest": np.array([v["aspects"] for v in vals], dtype=np.uint64),
    }
    return ShardPart(cols, counts)


def assemble(parts: Sequence[ShardPart], n_codebooks: int, codebook_size: int) -> tuple[bytes, dict]:
    """A split's sidecar bytes from its shards' parts (manifest order), and the manifest's summary of it (without
    `path`): bytes, sha256, n_samples, distinct caption / aspect texts, and the weights' min, max and sum."""
    cols: dict[str, np.ndarray] = {}
    for name, dtype in COLUMNS.items():
        if name == "key":
            keys = [p.columns["key"] for p in parts]
            cols["key"] = np.concatenate(keys) if keys else np.zeros(0, "S1")
        else:
            cols[name] = np.concatenate([p.columns[name] for p in parts]).astype(dtype) if parts else np.zeros(0, dtype)
    counts = np.zeros((n_codebooks, codebook_size), dtype=np.int64)
    for p in parts:
        counts += p.code_counts
    data = ShardPart(cols, counts).to_bytes()
    w = cols["weight"]
    summary = {
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "n_samples": len(w),
        "n_distinct_captions": int(np.unique(cols["caption_digest"]).size),
        "n_distinct_aspects": int(np.unique(cols["aspects_digest"]).size),
        "weight_min": float(w.min()) if len(w) else 1.0,
        "weight_max": float(w.max()) if len(w) else 1.0,
        "weight_sum": float(w.sum()),
    }
    return data, summary


def write_split_index(
    out_dir: Path, split: str, parts: Sequence[ShardPart], n_codebooks: int, codebook_size: int
) -> dict:
    """Write `<out_dir>/<split>/index.safetensors` atomically; returns the manifest's `index` entry."""
    data, summary = assemble(parts, n_codebooks, codebook_size)
    rel = f"{split}/{INDEX_FILE}"
    path = out_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(data)
        tmp.replace(path)
    except BaseException:  # a full disk, Ctrl-C: no temp file stays
        tmp.unlink(missing_ok=True)
        raise
    return {"path": rel, **summary}
