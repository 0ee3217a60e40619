"""A directory's footprint as coreutils' `du -sb` gives it (the apparent size of every file and directory under it, the
directory too): the reference the shard cache's bound is held against."""

from __future__ import annotations

import subprocess
from pathlib import Path


def du_bytes(root: Path | str) -> int:
    """`du -sb root` (0 when it does not exist; a file vanishing during the walk is du's own warning, not an error)."""
    if not Path(root).exists():
        return 0
    out = subprocess.run(["du", "-sb", str(root)], capture_output=True, text=True, check=False).stdout
    return int(out.split()[0]) if out.strip() else 0
