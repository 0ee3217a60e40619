"""`python -m tokenizer_pipeline.push SHARD_SET URL`: copy a shard set to a directory, s3://, gs:// or hf://."""

from __future__ import annotations

import argparse
from pathlib import Path

from tokenizer_pipeline.errors import exit_code
from tokenizer_pipeline.remote.push import push


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tokenizer_pipeline.push", description=__doc__.splitlines()[0])
    ap.add_argument("shard_set", type=Path, help="the local shard-set directory (holding manifest.json)")
    ap.add_argument(
        "url",
        help="a directory, file:///path, s3://bucket/prefix, gs://bucket/prefix or hf://datasets/owner/name[@branch][/path]",
    )
    ap.add_argument("--private", action="store_true", help="hf://: create the dataset repo private")
    ap.add_argument("--jobs", type=int, default=4, help="tars uploaded at once to a directory or bucket (default 4)")
    args = ap.parse_args(argv)
    return exit_code(lambda: push(args.shard_set, args.url, private=args.private, jobs=max(1, args.jobs)))


if __name__ == "__main__":
    raise SystemExit(main())
