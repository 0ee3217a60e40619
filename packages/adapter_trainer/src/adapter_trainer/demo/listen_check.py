"""Render the listen page to a PNG with headless Chromium (fresh profile, networking extras off), so a person can
check the page without opening a browser (`python -m adapter_trainer.listen_check`).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from adapter_trainer.errors import UserError

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
)


class ChromiumNotFoundError(UserError, FileNotFoundError):
    """No chromium program on PATH; the message says how to install it."""


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise ChromiumNotFoundError("no chromium on PATH; install it (Debian/Ubuntu: apt-get install -y chromium)")


def render(page: Path, png: Path, width: int = 1200, height: int = 2400, timeout: float = 120.0) -> Path:
    """Screenshot `page` into `png` (width x height CSS px). Raises RuntimeError with Chromium's output on failure."""
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="listen-check-profile-") as profile:
        cmd = [
            find_chromium(),
            *FLAGS,
            f"--user-data-dir={profile}",
            f"--window-size={width},{height}",
            f"--screenshot={png.resolve()}",
            page.resolve().as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not png.is_file() or png.stat().st_size < 1000:
        raise RuntimeError(f"chromium did not write {png} (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return png
