"""The split indexes of a run: each shard's part computed once from its tar, kept in
`.progress/index/<tar sha256>.safetensors`, and assembled by rank 0 into `<split>/index.safetensors`.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..shards.manifest import ShardEntry
from ..shards.split_index import ShardPart, shard_part, write_split_index

PARTS_DIR = "index"


def _part_file(progress_dir: Path, entry: ShardEntry) -> Path:
    return progress_dir / PARTS_DIR / f"{entry.sha256}.safetensors"


def save_part(out_dir: Path, progress_dir: Path, entry: ShardEntry, n_codebooks: int, codebook_size: int) -> ShardPart:
    """Compute the part of the shard `entry` from its tar and keep it (written atomically: ranks share the folder)."""
    part = shard_part(out_dir / entry.path, n_codebooks, codebook_size)
    f = _part_file(progress_dir, entry)
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_name(f".{f.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(part.to_bytes())
        os.replace(tmp, f)
    except BaseException:  # a full disk, Ctrl-C: no temp file stays (a missing part is recomputed from its tar)
        tmp.unlink(missing_ok=True)
        raise
    return part


def load_part(out_dir: Path, progress_dir: Path, entry: ShardEntry, n_codebooks: int, codebook_size: int) -> ShardPart:
    """The kept part of `entry`, or (none kept, or unreadable) one computed from its tar now."""
    f = _part_file(progress_dir, entry)
    if f.is_file():
        try:
            part = ShardPart.from_bytes(f.read_bytes())
            if len(part.columns["key"]) == entry.n_samples and part.code_counts.shape == (n_codebooks, codebook_size):
                return part
        except Exception:  # a damaged part is recomputed from the tar, which the manifest's sha256 vouches for
            pass
    return save_part(out_dir, progress_dir, entry, n_codebooks, codebook_size)


def write_indexes(
    out_dir: Path, progress_dir: Path, splits: dict[str, list[ShardEntry]], n_codebooks: int, codebook_size: int
) -> dict[str, dict]:
    """Write every split's sidecar; returns {split: the manifest's index entry}. Parts of shards no longer in the set
    are deleted."""
    out = {}
    for split, entries in splits.items():
        parts = [load_part(out_dir, progress_dir, e, n_codebooks, codebook_size) for e in entries]
        out[split] = write_split_index(out_dir, split, parts, n_codebooks, codebook_size)
    keep = {_part_file(progress_dir, e).name for entries in splits.values() for e in entries}
    for f in (progress_dir / PARTS_DIR).glob("*.safetensors") if (progress_dir / PARTS_DIR).is_dir() else ():
        if f.name not in keep:
            f.unlink(missing_ok=True)
    return out
