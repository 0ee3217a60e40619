"""Track ids: a safe, deterministic, unique sample-key prefix per track, from its path relative to the source
(with '/' separators; the extension is dropped from the readable part but kept in the hash).

Rule (the key rule of keys.py applies to `<track id>_<segment index>`):
- every run of characters outside `A-Z a-z 0-9 _ -` becomes one '_' (so 'a/b c.wav' -> 'a_b_c'), leading and
  trailing '_' are dropped (an empty result becomes 'track');
- an id never ends in '_<digits>' (its last '_' becomes '-'), so a track id can never equal another track's
  segment key `<id>_<n>`;
- at most `MAX_TRACK_ID_LEN` characters, leaving room for '_<segment index>' within the 90-character key limit;
  a longer id is cut and gets '-' + 8 hex digits of sha256(path);
- ids that still collide (e.g. 'a b.wav' and 'a_b.wav') all get that hash suffix: which one is listed first
  never matters, so an id depends only on the track's own path and on whether another path sanitises alike.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter

from ..shards.keys import MAX_KEY_LEN

MAX_SEGMENT_DIGITS = 9  # '_' + up to 999,999,999 segments
MAX_TRACK_ID_LEN = MAX_KEY_LEN - 1 - MAX_SEGMENT_DIGITS  # 80
HASH_HEX = 8
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def _short_hash(path: str) -> str:
    return hashlib.sha256(path.encode("utf-8")).hexdigest()[:HASH_HEX]


def _with_hash(base: str, path: str) -> str:
    return f"{base[: MAX_TRACK_ID_LEN - HASH_HEX - 1]}-{_short_hash(path)}"


def _stem_path(path: str) -> str:
    """'dir/a b.wav' -> 'dir/a b' (the extension is not part of the readable id)."""
    head, _, name = path.rpartition("/")
    stem = name.rsplit(".", 1)[0] if "." in name.lstrip(".") else name
    return f"{head}/{stem}" if head else stem


def sanitised(path: str) -> str:
    """The readable part of a track id (before collision handling)."""
    s = _UNSAFE.sub("_", _stem_path(path)).strip("_") or "track"
    s = re.sub(r"_(\d+)$", r"-\1", s)  # never '<x>_<digits>': that shape is a segment key
    return s if len(s) <= MAX_TRACK_ID_LEN else _with_hash(s, path)


def track_ids(paths: list[str]) -> list[str]:
    """One id per path (unique relative paths with their extension, '/'-separated); same order."""
    base = [sanitised(p) for p in paths]
    counts = Counter(base)
    return [_with_hash(b, p) if counts[b] > 1 else b for b, p in zip(base, paths)]
