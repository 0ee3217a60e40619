"""Retries of one transfer: capped exponential backoff with full jitter, a bounded number of tries.

Transient: timeouts, refused or dropped connections, short bodies, HTTP 5xx and 429 (and 408); a Retry-After header
is honoured (capped at `Policy.retry_after_cap_s`). Never retried: 401, 403, 404 and every other 4xx, nor a missing
file or a refused permission: a retry cannot fix them. fsspec's backends raise their own types (aiohttp's, botocore's
through s3fs, huggingface_hub's), so the status is read from the exception chain, not from one class. After the last
try, or at once for a permanent error: `RemoteError` naming the file, the URL and the last status, in one line.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TypeVar

from ..errors import UserError
from .urls import RemoteError

T = TypeVar("T")
NEVER_RETRIED = frozenset({401, 403, 404})
# parts of exception class names that mean the connection failed or a body ended early: aiohttp's
# ClientConnectionError / ClientPayloadError / ContentLengthError / ServerDisconnectedError, http.client's
# IncompleteRead, requests' and httpx's ConnectionError / ConnectError / ReadError / RemoteProtocolError /
# ChunkedEncodingError, botocore's EndpointConnectionError / ReadTimeoutError
TRANSIENT_NAMES = ("Timeout", "Connect", "Payload", "ContentLength", "Disconnected", "IncompleteRead", "Chunked",
                   "RemoteProtocol", "ReadError", "WriteError", "ShortRead")  # fmt: skip


@dataclass(frozen=True)
class Policy:
    """How often and how long to retry one transfer."""

    tries: int = 6  # attempts in all
    base_s: float = 1.0  # the first wait is uniform(0, base_s), doubling each try
    cap_s: float = 60.0  # no backoff wait is longer
    retry_after_cap_s: float = 300.0  # a server's Retry-After is honoured up to this


DEFAULT = Policy()


class ShortReadError(OSError):
    """A transfer ended with fewer bytes than expected: transient."""


def _chain(e: BaseException) -> list[BaseException]:
    out, seen = [], set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        out.append(cur)
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return out


def http_status(e: BaseException) -> int | None:
    """The HTTP status an exception (or one it was raised from) carries, if any."""
    for x in _chain(e):
        for attr in ("status", "status_code", "code"):
            v = getattr(x, attr, None)
            if isinstance(v, int) and 100 <= v < 600:
                return v
        resp = getattr(x, "response", None)
        v = getattr(resp, "status_code", None)
        if isinstance(v, int):
            return v
        if isinstance(resp, dict):  # botocore ClientError
            v = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(v, int):
                return v
    return None


def retry_after_s(e: BaseException) -> float | None:
    """Seconds a Retry-After header in the chain asks for (delta-seconds or an HTTP date; never negative): from
    aiohttp's / requests' headers or botocore's ResponseMetadata."""
    for x in _chain(e):
        resp = getattr(x, "response", None)
        if isinstance(resp, dict):  # botocore ClientError
            headers = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        else:
            headers = getattr(x, "headers", None) or getattr(resp, "headers", None)
        try:
            value = (headers.get("Retry-After") or headers.get("retry-after")) if headers else None
        except AttributeError:
            continue
        if value is None:
            continue
        try:
            return max(0.0, float(value))
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(str(value))
        except (TypeError, ValueError):
            return None
        return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())
    return None


def is_transient(e: BaseException) -> bool:
    """True for errors a retry may cure (see the module docstring). A failed connection or a cut body decides first:
    aiohttp's cut body carries a meaningless status 400, and fsspec's HTTP backend raises FileNotFoundError from a 503
    on its size probe. Then the status."""
    chain = _chain(e)
    if any(isinstance(x, (TimeoutError, ConnectionError)) for x in chain) or any(
        any(n in type(x).__name__ for n in TRANSIENT_NAMES) for x in chain if not isinstance(x, UserError)
    ):
        return True
    status = http_status(e)
    return status is not None and (status in (408, 425, 429) or status >= 500)


def describe(e: BaseException) -> str:
    """The last status (or error type) for a one-line message."""
    status = http_status(e)
    if status is not None and is_transient(e) and not (status in (408, 425, 429) or status >= 500):
        status = None  # a cut body's status 400 (aiohttp) says nothing
    text = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    head = f"HTTP {status}" if status is not None else type(e).__name__
    return f"{head}: {text}" if text else head


def _permanent_hint(e: BaseException) -> str:
    status = http_status(e)
    if status in (401, 403) or any(isinstance(x, PermissionError) for x in _chain(e)):
        return "check the credentials and that they may write/read there"
    if status == 404 or any(isinstance(x, FileNotFoundError) for x in _chain(e)):
        return "check the URL (bucket, repo, revision)"
    return "not retried: a retry cannot fix it"


def with_retries(
    fn: Callable[[], T],
    *,
    what: str,
    url: str,
    policy: Policy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """fn() with up to `policy.tries` attempts, waiting uniform(0, min(cap, base * 2**attempt)) between them, or the
    server's Retry-After. Raises RemoteError naming `what`, `url` and the last status."""
    policy = policy or DEFAULT
    for attempt in range(policy.tries):
        try:
            return fn()
        except UserError:  # RemoteError from a nested call, or a problem of the set itself: already one line
            raise
        except Exception as e:  # classified below: a permanent error leaves at once, as one line
            if not is_transient(e) or http_status(e) in NEVER_RETRIED:
                raise RemoteError(f"{what}: {url}: {describe(e)}; {_permanent_hint(e)}") from e
            if attempt == policy.tries - 1:
                raise RemoteError(
                    f"{what}: {url}: failed {policy.tries} times, last {describe(e)}; the server or the network is "
                    f"failing: run the command again later"
                ) from e
            wait = retry_after_s(e)
            if wait is not None:
                sleep(min(wait, policy.retry_after_cap_s))
            else:
                sleep(random.uniform(0, min(policy.cap_s, policy.base_s * 2**attempt)))
    raise AssertionError("unreachable")
