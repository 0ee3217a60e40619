"""An exclusive, non-waiting OS file lock on an output directory, so two runs never write one directory at once."""

from __future__ import annotations

from pathlib import Path

import filelock

from .errors import UserError


def lock_dir(out_dir: Path, lock_name: str, who: str, error: type[UserError]) -> filelock.BaseFileLock:
    """Create `out_dir` if needed and lock `out_dir/lock_name`; release the returned lock when done.

    Raises `error` (the command's own UserError) when another process (`who`: "tokenizer_pipeline run") holds the
    lock, or `out_dir` is not writable."""
    lock_path = out_dir / lock_name
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(lock_path, timeout=0)
        lock.acquire()
    except filelock.Timeout as e:
        raise error(
            f"another {who} is writing {out_dir} (it holds {lock_path}). Wait for it to finish or "
            f"choose another out_dir. The lock is released when that process exits; if no run is active (a stale "
            f"lock, e.g. on a network file system), delete {lock_path}."
        ) from e
    except OSError as e:
        raise error(f"out_dir {out_dir} is not writable ({e}); choose another out_dir or fix its permissions") from e
    return lock
