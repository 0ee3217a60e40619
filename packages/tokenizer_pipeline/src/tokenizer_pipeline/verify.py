"""`python -m tokenizer_pipeline.verify SHARD_SET|URL`: check a shard set against docs/shard-format.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tokenizer_pipeline.errors import exit_code
from tokenizer_pipeline.remote.fetch import verify_url
from tokenizer_pipeline.shards.verify import EMPTY_SET, URL_RE, verify


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tokenizer_pipeline.verify", description=__doc__.splitlines()[0])
    ap.add_argument(
        "shard_set",
        help="directory holding manifest.json, or the set's URL (s3://, gs://, hf://datasets/..., https://)",
    )
    return exit_code(lambda: check(ap.parse_args(argv).shard_set))


def check(shard_set: str) -> int:
    """Print the set's summary (0) or its problems (1); a URL (file:// too) is read by remote.fetch."""
    problems, summary = verify_url(shard_set) if URL_RE.match(shard_set) else verify(Path(shard_set))
    if len(problems) == 1 and problems[0].startswith(EMPTY_SET):  # a well-formed set of nothing: one line
        print(f"FAILED {shard_set}: {problems[0]}", file=sys.stderr)
        return 1
    if problems:
        print(f"FAILED {shard_set}: {len(problems)} problem(s)", file=sys.stderr)
        for p in problems:
            print(f"  - {p}", file=sys.stderr)
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
