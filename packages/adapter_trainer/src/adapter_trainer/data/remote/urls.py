"""URLs of shard sets: which strings are URLs, the fsspec filesystem that reads one, Hub revisions pinned.

Credentials and endpoints are whatever the backend reads (AWS_*, GOOGLE_APPLICATION_CREDENTIALS, HF_TOKEN, ...).
Filesystems are looked up per call, never pickled: each DataLoader worker opens its own clients (s3fs / aiohttp
sessions are not fork-safe).
"""

from __future__ import annotations

import os
import re
import sys
import weakref
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from adapter_trainer.data.remote.retry import with_retries
from adapter_trainer.errors import UserError

# protocol -> the extra that installs its fsspec backend (pip install 'adapter-trainer[<extra>]')
BACKEND_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http"}
# a revision is one path segment (a branch with "/" is percent-encoded: @feat%2Fx) or a pull request / conversion ref
_HF_DATASET = re.compile(
    r"^hf://datasets/(?P<repo>[^/@]+/[^/@]+)(?:@(?P<rev>refs/(?:pr|convert)/[^/]+|[^/]+))?(?P<path>/.*)?$"
)
_SHA = re.compile(r"^[0-9a-f]{40}$")
_PARENT_CLIENTS: list[object] = []  # in a forked child: the parent's fsspec filesystems, never closed here


def _keep_parent_clients() -> None:
    """After a fork, in the child: keep the parent's fsspec filesystems referenced and detach their finalizers.

    fsspec forgets its instances in a new process, and collecting an async one closes its aiohttp session, whose
    pooled sockets are registered in the parent's epoll instance (shared by the fork): closing them here would
    unregister them in the parent too, which then waits on that connection until aiohttp's timeout. The kernel
    closes the child's copies when it exits."""
    spec = sys.modules.get("fsspec.spec")
    if spec is None:
        return  # fsspec was not used before the fork: nothing was copied
    classes = [spec.AbstractFileSystem]
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        _PARENT_CLIENTS.extend(vars(cls).get("_cache", {}).values())
    # weakref.finalize's _registry is private; without it the references above still cover workers (os._exit)
    for fin in list(getattr(weakref.finalize, "_registry", {})):
        info = fin.peek()
        if info is not None and isinstance(info[0], spec.AbstractFileSystem):
            fin.detach()


if hasattr(os, "register_at_fork"):  # POSIX; spawned processes copy nothing
    os.register_at_fork(after_in_child=_keep_parent_clients)


def is_url(path: str) -> bool:
    """True for `scheme://...` other than file:// (a file URL is a local directory)."""
    m = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://", str(path))
    return bool(m) and m.group(1).lower() != "file"


def local_path(path: str) -> str:
    """A file:// URL as a plain path (percent-escapes decoded; host empty or localhost); anything else unchanged."""
    if not str(path).lower().startswith("file://"):
        return str(path)
    parts = urlsplit(str(path))
    if parts.netloc not in ("", "localhost"):
        raise UserError(f"{path}: a file:// URL names this machine's files (file:///path); mount {parts.netloc} first")
    return unquote(parts.path)


def join(url: str, rel: str) -> str:
    """`<url>/<rel>` for a set root URL and a manifest's relative shard path (a query string stays at the end)."""
    parts = urlsplit(url)
    if parts.query and protocol(url) in ("http", "https"):
        return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/" + rel.lstrip("/")))
    return url.rstrip("/") + "/" + rel.lstrip("/")


def protocol(url: str) -> str:
    return url.split("://", 1)[0].lower()


def filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path within it) for `url`; a UserError naming the extra when no backend is installed."""
    import fsspec

    proto = protocol(url)
    try:
        fs = fsspec.filesystem(proto)
    except (ImportError, ValueError) as e:
        extra = BACKEND_EXTRAS.get(proto)
        fix = (
            f"pip install 'adapter-trainer[{extra}]'"
            if extra
            else "use s3://, gs://, hf://datasets/... or http(s)://, or install the fsspec backend for it"
        )
        raise UserError(f"{url}: no fsspec backend for {proto}:// is installed ({e}); {fix}") from e
    return fs, url if proto in ("http", "https") else fs._strip_protocol(url)


def pin(url: str, *, tries: int = 5) -> str:
    """The URL with a Hub revision (branch, tag or none = main) replaced by its commit sha, so every rank, worker and
    resume reads one revision. Other URLs are unchanged: the manifest's sha256s pin their bytes."""
    m = _HF_DATASET.match(url)
    if not m:
        if url.startswith("hf://") and not url.startswith("hf://datasets/"):
            raise UserError(
                f"{url}: a shard set on the Hub is a dataset repo: hf://datasets/owner/name[@revision]/path"
            )
        return url
    rev = m.group("rev") or "main"
    if _SHA.match(rev):
        return url
    from huggingface_hub import HfApi

    repo = m.group("repo")
    info = with_retries(
        lambda: HfApi().dataset_info(repo, revision=unquote(rev)),
        what=f"shard set {url}",
        url=url,
        tries=tries,
    )
    return f"hf://datasets/{repo}@{info.sha}{m.group('path') or ''}"


def pin_all(paths: list[str], *, tries: int = 5) -> list[str]:
    """`pin` of every URL among `paths` (directories unchanged)."""
    return [pin(p, tries=tries) if is_url(p) else p for p in paths]
