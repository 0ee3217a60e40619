"""`python -m adapter_trainer.listen_page <run dir> [--source-audio DIR]`: write `<run dir>/listen/index.html`."""

from __future__ import annotations

import argparse
from pathlib import Path

from adapter_trainer.demo.listen_page import build_page
from adapter_trainer.errors import run_command


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m adapter_trainer.listen_page", description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--source-audio", type=Path, default=None, help="directory of the original {ytid}.* audio files")
    args = ap.parse_args(argv)

    def write() -> str:
        out = build_page(args.run_dir, args.source_audio)
        return f"listen: wrote {out} (open it in a browser: file://{out.resolve()})"

    return run_command("adapter_trainer.listen_page", write)


if __name__ == "__main__":
    raise SystemExit(main())
