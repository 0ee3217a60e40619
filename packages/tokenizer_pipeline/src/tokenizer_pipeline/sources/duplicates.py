"""The same audio named twice (one path on two lines, or a copy or link under another path): only the first track that
is encoded keeps it, the others are `duplicate_audio` failures naming it, so one audio never lands in both splits.

Compared by resolved path, then by content: only equal-size files are read, first `PARTIAL_BYTES` at each end, and
only partial matches are hashed in full.
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

from ..shards.write_shards import sha256_file
from .track import Track

PARTIAL_BYTES = 64 * 1024


def partial_hash(path: Path, size: int) -> str:
    """sha256 of the size, the first and the last PARTIAL_BYTES of the file (the whole file when it is that small)."""
    h = hashlib.sha256(str(size).encode("ascii") + b"\0")
    with open(path, "rb") as f:
        h.update(f.read(PARTIAL_BYTES))
        if size > PARTIAL_BYTES:
            f.seek(max(PARTIAL_BYTES, size - PARTIAL_BYTES))
            h.update(f.read(PARTIAL_BYTES))
    return h.hexdigest()


def _first_by(indices: list[int], key_of: Callable[[int], str]) -> dict[str, list[int]]:
    """Groups `indices` by key_of(index) (an unreadable file is left out: its header read says why)."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i in indices:
        try:
            groups[key_of(i)].append(i)
        except OSError:
            continue
    return groups


def duplicates(
    tracks: list[Track], candidates: Iterable[int] | None = None, known: Callable[[int], str | None] | None = None
) -> dict[int, int]:
    """{index of a repeat: index of the first track with that audio}, over `candidates` (default: every track), in
    order; a track with a problem of its own (a bad path, a missing or unreadable file) is never one. `known`: the
    sha256 already taken of a track's file (or None), read instead of hashing it again."""

    def full_hash(i: int) -> str:
        return (known(i) if known else None) or sha256_file(Path(tracks[i].audio_path))

    first_by_path: dict[str, int] = {}
    repeat: dict[int, int] = {}
    by_size: dict[int, list[int]] = defaultdict(list)
    for i in range(len(tracks)) if candidates is None else sorted(candidates):
        t = tracks[i]
        if t.problem is not None:
            continue
        try:
            key = os.path.realpath(t.audio_path)
            if key in first_by_path:
                repeat[i] = first_by_path[key]
                continue
            first_by_path[key] = i
            if t.audio_path.is_file():
                by_size[t.audio_path.stat().st_size].append(i)
        except (OSError, ValueError):  # unreadable, or a path no file can have (a NUL byte): that track's failure
            continue
    for size, same_size in by_size.items():
        if len(same_size) < 2:
            continue
        partial = _first_by(same_size, lambda i, size=size: partial_hash(Path(tracks[i].audio_path), size))
        for group in (g for g in partial.values() if len(g) > 1):
            for same in _first_by(group, full_hash).values():
                for i in same[1:]:
                    repeat[i] = same[0]
    return dict(sorted(repeat.items()))
