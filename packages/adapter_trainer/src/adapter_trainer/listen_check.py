"""`python -m adapter_trainer.listen_check <index.html> <out.png>`: render the listen page as a browser shows it.

Opt-in (`make listen-check`), never part of `make test`: it needs headless Chromium (`apt-get install -y chromium`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from adapter_trainer.demo.listen_check import render
from adapter_trainer.errors import run_command


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adapter_trainer.listen_check", description=__doc__.splitlines()[0])
    ap.add_argument("page", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--width", type=int, default=1200)
    ap.add_argument("--height", type=int, default=2400)
    args = ap.parse_args(argv)

    def write() -> str:
        out = render(args.page, args.png, args.width, args.height)
        return f"listen-check: rendered {args.page} -> {out} ({out.stat().st_size} bytes); look at it"

    return run_command("adapter_trainer.listen_check", write)


if __name__ == "__main__":
    raise SystemExit(main())
