"""A shard set at a URL read back for `verify`: the manifest, failures.jsonl and each tar, one at a time, into a
temporary directory that is removed afterwards (so checking a set needs the disk of its largest tar, not of the set).

Each download is retried (retry.py); a file the URL does not have is left absent, and verify reports it missing. A
Hub branch is pinned to its commit first, so every file is read from one revision even if the branch moves.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..shards.verify import verify
from .retry import with_retries
from .urls import filesystem, join, local_path, parse_hub, scheme_of


def pinned(url: str) -> str:
    """`url`, with a Hub branch (or the default branch) replaced by the commit it points to now."""
    if scheme_of(url) != "hf":
        return url
    from huggingface_hub import HfApi  # only for hf:// URLs

    target = parse_hub(url)
    api = HfApi()
    info = with_retries(
        lambda: api.repo_info(target.repo_id, repo_type="dataset", revision=target.revision),
        what="resolving the revision",
        url=url,
    )
    return target.url(info.sha)


def verify_url(url: str) -> tuple[list[str], str]:
    """verify() of the set at `url`: its problems and its summary line, naming the URL rather than a temp path."""
    path = local_path(url)
    if path is not None:
        return verify(path)
    fs, root = filesystem(pinned(url))

    with tempfile.TemporaryDirectory(prefix="verify-") as tmp:

        def fetch(rel: str) -> None:
            dst = Path(tmp) / rel
            dst.parent.mkdir(parents=True, exist_ok=True)

            def get() -> None:
                try:
                    fs.get_file(join(root, rel), str(dst))
                except FileNotFoundError:
                    dst.unlink(missing_ok=True)

            with_retries(get, what=f"downloading {rel}", url=join(url, rel))

        problems, summary = verify(Path(tmp), fetch=fetch)
    base = url.rstrip("/")
    return [p.replace(tmp, base) for p in problems], summary.replace(tmp, base)
