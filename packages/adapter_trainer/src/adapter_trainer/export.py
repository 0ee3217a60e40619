"""`python -m adapter_trainer.export RUN_DIR --out DIR`: a run's checkpoint as a shareable adapter folder.

    python -m adapter_trainer.export RUN_DIR [--checkpoint latest|step-XXXXXX] --out DIR [--push-to-hub REPO]

`--push-to-hub` uploads the written folder (`sharing.hub`); a failed upload leaves it intact.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from adapter_trainer.errors import run_command
from adapter_trainer.model.adapter_io import CARD_FILE, CONFIG_FILE, GENERATION_FILE, WEIGHTS_FILE
from adapter_trainer.sharing.export import export_adapter


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m adapter_trainer.export", description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path, help="the training run's trainer.output_dir")
    p.add_argument("--checkpoint", default="latest", help="latest (default), a step-XXXXXX name, or a checkpoint dir")
    p.add_argument("--out", type=Path, required=True, help="the adapter folder to write")
    p.add_argument("--license", default="other", help="the card's license (default other: the base models' apply)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.add_argument("--push-to-hub", metavar="REPO", help="then upload the folder to this Hub repo (user/name)")
    p.add_argument("--private", action="store_true", help="with --push-to-hub: create the repo private")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def export() -> str:
        out = export_adapter(
            args.run_dir, args.out, checkpoint=args.checkpoint, license=args.license, overwrite=args.overwrite
        )
        print(f"export: wrote {out} ({WEIGHTS_FILE}, {CONFIG_FILE}, {GENERATION_FILE}, {CARD_FILE})")
        if not args.push_to_hub:
            return ""
        from adapter_trainer.sharing.hub import push_folder

        return f"export: pushed {out} to {push_folder(out, args.push_to_hub, private=args.private)}"

    return run_command("adapter_trainer.export", export)


if __name__ == "__main__":
    raise SystemExit(main())
