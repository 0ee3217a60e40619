"""Where this package's Hydra configs live, for editable and normal installs alike.

A relative `config_path` in `@hydra.main` breaks on non-editable installs, so the path is resolved here
and handed to Hydra as an absolute path. Order: $ADAPTER_TRAINER_CONF_DIR, the repository's `conf/adapter_trainer`
(source tree / editable install), the copy a normal wheel carries (`adapter_trainer/conf`).
Hydra's own `--config-dir` adds a directory on top of whichever is found.
"""

from __future__ import annotations

import os
from pathlib import Path

_ENV = "ADAPTER_TRAINER_CONF_DIR"


def find_conf_dir() -> Path:
    """Absolute path of the config directory; raises FileNotFoundError naming every place looked at."""
    here = Path(__file__).resolve().parent
    candidates: list[Path] = []
    if os.environ.get(_ENV):
        candidates.append(Path(os.environ[_ENV]).expanduser().resolve())
    candidates += [here.parents[3] / "conf" / "adapter_trainer", here / "conf"]
    for c in candidates:
        if c.is_dir():
            return c
    raise FileNotFoundError(
        f"no config directory for adapter_trainer; looked at {', '.join(map(str, candidates))}. "
        f"Set {_ENV}=/path/to/conf/adapter_trainer or pass --config-dir."
    )
