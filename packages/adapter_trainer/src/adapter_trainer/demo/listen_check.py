"""`python -m adapter_trainer.listen_check <index.html> <out.png>`: render the listen page as a browser shows it.

Headless Chromium (Debian's `chromium` package: `apt-get install -y chromium`) loads the page from file:// in a
fresh profile with networking extras off and writes a full-window screenshot, so a person can check that the
summary, captions, attributes, players and spectrograms are visible without opening a browser. Opt-in
(`make listen-check`), never part of `make test`: it needs a browser the test machines may not have.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from adapter_trainer.errors import USER_ERROR_EXIT, UserError

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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adapter_trainer.listen_check", description=__doc__.splitlines()[0])
    ap.add_argument("page", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--width", type=int, default=1200)
    ap.add_argument("--height", type=int, default=2400)
    args = ap.parse_args(argv)
    try:
        out = render(args.page, args.png, args.width, args.height)
    except UserError as e:
        print(f"adapter_trainer.listen_check: error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT
    print(f"listen-check: rendered {args.page} -> {out} ({out.stat().st_size} bytes); look at it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
