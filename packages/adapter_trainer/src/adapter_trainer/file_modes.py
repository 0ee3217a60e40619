"""Files the package writes get the mode the process umask gives every other file (0644 under the usual 022).

safetensors' `save_file` (and `save_pretrained` through it) writes mode 0600 whatever the umask, so a teammate could
not load a checkpoint on a shared disk: every safetensors write goes through `save_safetensors`, every
`save_pretrained` folder through `follow_umask`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def process_umask() -> int:
    """The process umask: from /proc/self/status where Linux has it, else set and restored (os.umask only reads it
    by setting it, which for that instant would give another thread's new files mode 0666)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def follow_umask(path: str | Path) -> None:
    """Give a file, or every file under a folder, the mode open() would have given it: 0o666 & ~umask."""
    path = Path(path)
    mode = 0o666 & ~process_umask()
    for f in [path] if path.is_file() else (p for p in path.rglob("*") if p.is_file() and not p.is_symlink()):
        f.chmod(mode)


def save_safetensors(
    tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None
) -> None:
    """`safetensors.torch.save_file`, then the mode every other file of the run has (`follow_umask`)."""
    from safetensors.torch import save_file  # here: the module stays importable without torch loaded

    save_file(tensors, str(path), metadata=metadata)
    follow_umask(path)
