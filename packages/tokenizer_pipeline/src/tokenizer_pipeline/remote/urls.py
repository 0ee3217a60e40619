"""Which strings are URLs, what they name, and the fsspec filesystem behind one (credentials are the backends' own)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

import fsspec
from fsspec import AbstractFileSystem

from ..errors import UserError

URL_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# scheme -> (the module its fsspec backend needs, the extra of tokenizer-pipeline that installs it)
BACKENDS = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "http": ("aiohttp", "http"),
    "https": ("aiohttp", "http"),
    "hf": ("huggingface_hub", None),  # a dependency of the package
    "file": ("fsspec", None),
}
HUB_RE = re.compile(r"^hf://datasets/(?P<repo>[^/@]+/[^/@]+)(?:@(?P<revision>[^/]+))?(?:/(?P<path>.*))?$")
HUB_FORM = "hf://datasets/<owner>/<name>[@<revision>][/<path in repo>]"


class RemoteError(UserError, OSError):
    """A URL that cannot be used, or a transfer that failed for good; the message says which file and why."""


@dataclass(frozen=True)
class HubTarget:
    """A shard set in a Hugging Face dataset repo: `hf://datasets/<repo_id>[@<revision>][/<path_in_repo>]`."""

    repo_id: str
    revision: str | None  # a branch to push to (None: the repo's default branch, main)
    path_in_repo: str  # "" for the repo's root

    def repo_path(self, rel: str) -> str:
        """Path in the repo of the set's file `rel`."""
        return f"{self.path_in_repo}/{rel}" if self.path_in_repo else rel

    def url(self, revision: str | None = None) -> str:
        rev = revision or self.revision
        tail = f"/{self.path_in_repo}" if self.path_in_repo else ""
        return f"hf://datasets/{self.repo_id}{'@' + rev if rev else ''}{tail}"


def is_url(text: str) -> bool:
    """True for `<scheme>://...` (file:// included); a plain path is not a URL."""
    return bool(URL_RE.match(str(text)))


def scheme_of(url: str) -> str:
    m = URL_RE.match(url)
    return m.group(1).lower() if m else ""


def join(url: str, rel: str) -> str:
    """`<url>/<rel>` with one slash."""
    return f"{url.rstrip('/')}/{rel}"


def local_path(target: str) -> Path | None:
    """The directory a plain path or a file:// URL names; None for any other URL."""
    if not is_url(target):
        return Path(target)
    if scheme_of(target) == "file":
        parsed = urlparse(target)
        if parsed.netloc not in ("", "localhost"):
            raise RemoteError(f"{target}: a file:// URL names a path on this machine (file:///abs/path)")
        return Path(unquote(parsed.path))
    return None


def parse_hub(url: str) -> HubTarget:
    """The repo, branch and folder an hf:// URL names (dataset repos only: a shard set is a dataset)."""
    m = HUB_RE.match(url.rstrip("/"))
    if not m:
        raise RemoteError(f"{url}: a shard set on the Hub is named {HUB_FORM}")
    revision = unquote(m.group("revision")) if m.group("revision") else None
    return HubTarget(m.group("repo"), revision, (m.group("path") or "").strip("/"))


def check_backend(url: str) -> str:
    """The URL's scheme, once its fsspec backend imports; else RemoteError naming the extra to install."""
    scheme = scheme_of(url)
    if scheme not in BACKENDS:
        raise RemoteError(
            f"{url}: unsupported URL scheme {scheme!r}; shard sets are read from and pushed to "
            f"s3://, gs://, {HUB_FORM}, http(s):// (read only) or a directory"
        )
    module, extra = BACKENDS[scheme]
    try:
        fsspec.get_filesystem_class(scheme)
    except (ImportError, ValueError) as e:  # fsspec: ImportError for a known backend that is not installed
        fix = f"pip install 'tokenizer-pipeline[{extra}]'" if extra else f"pip install {module}"
        raise RemoteError(f"{url}: {scheme}:// needs {module}, which is not installed: {fix}") from e
    return scheme


def filesystem(url: str) -> tuple[AbstractFileSystem, str]:
    """The fsspec filesystem of `url` (a fresh instance: no listing cached by an earlier one) and the set's root in it."""
    check_backend(url)
    fs, root = fsspec.core.url_to_fs(url, skip_instance_cache=True)
    return fs, root.rstrip("/")
