"""Track ids: a safe, deterministic, unique sample-key prefix per track, from its path relative to the source's root
(audiocraft: `source.root`, else the root an existing set in out_dir recorded, else the deepest folder holding every
track; audiofolder: `source.dir`), with '/' separators; the extension is dropped from the readable part but kept in
the hash. The root, not the machine's directories, is what makes an id survive a move: the same files under
/home/me/music or /mnt/data give the same ids. A track outside a kept root has a path with '..' parts, written 'up'
('../new/x.wav' -> 'up_new_x'). An id changes only when the track's own path from the root changes (its name, or a
folder between it and the root), or when another path sanitises alike (below); it never decides the split (splits.py).

Rule (the key rule of keys.py applies to `<track id>_<segment index>`):
- every run of characters outside `A-Z a-z 0-9 _ -` becomes one '_' (so 'a/b c.wav' -> 'a_b_c'), leading and
  trailing '_' are dropped (an empty result becomes 'track');
- a path with any character outside ASCII (e.g. 'песня.wav', 'café.wav') always gets '-' + 8 hex digits of
  sha256(path): the readable part dropped those characters, the hash keeps the id lossless (40 Cyrillic names give
  40 ids, and 40 different splits draws), whatever other tracks there are;
- an id never ends in '_<digits>' (its last '_' becomes '-'), so a track id can never equal another track's
  segment key `<id>_<n>`;
- at most `MAX_TRACK_ID_LEN` characters, leaving room for '_<segment index>' within the 90-character key limit;
  a longer id is cut and gets '-' + 8 hex digits of sha256(path);
- ids that still collide (e.g. 'a b.wav' and 'a_b.wav') all get that hash suffix: which one is listed first
  never matters, so an id depends only on the track's own path and on whether another path sanitises alike;
- the path is read in Unicode NFC first (a name typed on macOS, NFD, and the same name on Linux, NFC, give one id);
  two listed paths that differ only in normalisation hash their exact text, so they still get two ids;
- a path named again (a duplicate_audio failure) gets the id of `duplicate_path(path, line)`, '<stem>-dup<line>'
  in the same collision set, so its key can never equal another track's.
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
