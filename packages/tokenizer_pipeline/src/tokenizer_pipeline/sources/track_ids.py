"""Track ids: a safe, deterministic, unique sample-key prefix per track, from its path relative to the source's root.

Characters outside `A-Z a-z 0-9 _ -` become '_', '..' parts 'up', the path is read in NFC; a non-ASCII, too long or
colliding path gets '-' + 8 hex digits of its sha256; an id never ends in '_<digits>', so it never equals a segment
key; a path named again gets the id of `duplicate_path` (docs/shard-format.md, "Segment samples").
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter

from ..shards.keys import MAX_KEY_LEN

MAX_SEGMENT_DIGITS = 9  # '_' + up to 999,999,999 segments
MAX_TRACK_ID_LEN = MAX_KEY_LEN - 1 - MAX_SEGMENT_DIGITS  # 80
HASH_HEX = 8
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def path_bytes(path: str) -> bytes:
    """The path's exact bytes: UTF-8, with a surrogate-escaped byte of a non-UTF-8 name (os.fsdecode) as that byte."""
    try:
        return path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that is no escaped byte (e.g. half of a pair): its code point's bytes
        return path.encode("utf-8", "surrogatepass")


def _short_hash(path: str) -> str:
    return hashlib.sha256(path_bytes(path)).hexdigest()[:HASH_HEX]


def _with_hash(base: str, path: str) -> str:
    return f"{base[: MAX_TRACK_ID_LEN - HASH_HEX - 1]}-{_short_hash(path)}"


def _stem_path(path: str) -> str:
    """'dir/a b.wav' -> 'dir/a b' (the extension is not part of the readable id)."""
    head, _, name = path.rpartition("/")
    stem = name.rsplit(".", 1)[0] if "." in name.lstrip(".") else name
    return f"{head}/{stem}" if head else stem


def nfc(path: str) -> str:
    """The path in Unicode NFC (a surrogate-escaped byte of a non-UTF-8 name is kept as it is)."""
    return unicodedata.normalize("NFC", path)


def duplicate_path(path: str, line: int) -> str:
    """The pseudo-path whose id a repeat of `path` (on `line`) gets: 'dir/a.wav' -> 'dir/a-dup<line>\\0.wav'. Its
    readable part is '<stem>-dup<line>'; the NUL byte, which no file name can hold, keeps it from equalling a real
    path, so track_ids gives it an id of its own (hash-suffixed if a real path sanitises alike)."""
    stem = _stem_path(path)
    return f"{stem}-dup{line}\0{path[len(stem) :]}"


def _up(path: str) -> str:
    """'../new/x' -> 'up/new/x': a path from the root to a track outside it, readable."""
    return "/".join("up" if part == ".." else part for part in path.split("/"))


def sanitised(path: str) -> str:
    """The readable part of a track id (before collision handling)."""
    path = nfc(path)
    s = _UNSAFE.sub("_", _up(_stem_path(path))).strip("_") or "track"
    s = re.sub(r"_(\d+)$", r"-\1", s)  # never '<x>_<digits>': that shape is a segment key
    return s if len(s) <= MAX_TRACK_ID_LEN and path.isascii() else _with_hash(s, path)


def track_ids(paths: list[str]) -> list[str]:
    """One id per path (unique relative paths with their extension, '/'-separated); same order."""
    base = [sanitised(p) for p in paths]
    counts = Counter(base)
    forms = Counter(nfc(p) for p in paths)  # >1: paths that differ only in normalisation hash their exact text
    return [(_with_hash(b, p if forms[nfc(p)] > 1 else nfc(p)) if counts[b] > 1 else b) for b, p in zip(base, paths)]
