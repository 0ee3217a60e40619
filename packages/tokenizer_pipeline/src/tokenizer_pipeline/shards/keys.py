"""The shard set's naming rule: sample keys, split names and shard paths are data, never paths.

A key (and a split name) is 1..`MAX_KEY_LEN` characters of `A-Z a-z 0-9 _ -` (no '.': WebDataset splits member names
at the first dot; short enough for a plain ustar name); a shard path is relative and resolves inside the set
(docs/shard-format.md, "Keys and paths"). adapter_trainer keeps a checked copy (`data/sample_keys.py`).
"""

from __future__ import annotations

import re
from pathlib import Path

USTAR_NAME_BYTES = 100  # the ustar header's name field; longer names need a PAX/GNU long-name header
LONGEST_MEMBER_SUFFIX = ".codes.npy"  # `<key>.codes.npy` is the longest member name of a sample
MAX_KEY_LEN = USTAR_NAME_BYTES - len(LONGEST_MEMBER_SUFFIX)  # 90
KEY_RE = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_KEY_LEN}}}")
KEY_RULE = f"keys are 1-{MAX_KEY_LEN} characters of A-Z a-z 0-9 _ -"  # for messages


def key_problem(key: str) -> str | None:
    """Why `key` is not a valid sample key (or split name), or None when it is."""
    if not isinstance(key, str) or not key:
        return "is empty"
    if len(key) > MAX_KEY_LEN:
        return f"is {len(key)} characters long, more than {MAX_KEY_LEN} (its tar member names must fit a ustar header)"
    if not KEY_RE.fullmatch(key):
        bad = sorted({c for c in key if not re.fullmatch(r"[A-Za-z0-9_-]", c)})
        return f"contains {', '.join(repr(c) for c in bad)}"
    return None


def shard_path_problem(root: Path, rel: str) -> str | None:
    """Why the manifest's shard path `rel` is unusable for the set at `root` (absolute, or leaving the set), or None."""
    if not isinstance(rel, str) or not rel:
        return "is empty"
    p = Path(rel)
    if p.is_absolute() or rel.startswith(("/", "\\")):
        return "is absolute; shard paths are relative to the shard set"
    if ".." in p.parts:
        return "contains '..'; shard paths must stay inside the shard set"
    base = Path(root).resolve()
    if not (base / p).resolve().is_relative_to(base):
        return f"resolves outside the shard set {base} (through a symlink); copy the shard into the set instead"
    return None
