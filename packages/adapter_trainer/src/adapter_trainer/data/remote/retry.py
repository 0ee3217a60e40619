"""Retries for remote reads: capped exponential backoff with full jitter, a bounded number of tries.

Transient: timeouts, dropped connections, bodies cut off, HTTP 429 and 5xx (Retry-After honoured, capped). Never
retried: not found, forbidden, unauthorised and other 4xx answers: they name a problem a retry cannot fix.
fsspec's backends raise their own types (aiohttp's, botocore's via s3fs, huggingface_hub's), so the status is read
from the exception chain rather than from one class. Hand-written (not tenacity, not urllib3's Retry) because the
backends differ in transport and the error must name the shard, the URL and the last status in one line.
Copied from tokenizer_pipeline/remote/retry.py; tests/test_copies.py keeps them identical.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TypeVar

from adapter_trainer.errors import UserError

T = TypeVar("T")
# parts of exception class names that mean the connection failed or a body ended early: aiohttp's
# ClientConnectionError / ClientPayloadError / ContentLengthError / ServerDisconnectedError, http.client's
# IncompleteRead, requests' and httpx's ConnectionError / ConnectError / ReadError / RemoteProtocolError /
# ChunkedEncodingError, botocore's EndpointConnectionError / ReadTimeoutError
TRANSIENT_NAMES = ("Timeout", "Connect", "Payload", "ContentLength", "Disconnected", "IncompleteRead", "Chunked",
                   "RemoteProtocol", "ReadError", "WriteError", "ShortRead")  # fmt: skip


class RemoteReadError(UserError, OSError):
    """A remote file could not be read after the allowed tries (or at once, for a permanent error)."""


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


def with_retries(
    fn: Callable[[], T],
    *,
    what: str,
    url: str,
    tries: int = 5,
    base_s: float = 0.5,
    cap_s: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """fn() with up to `tries` attempts; waits uniform(0, min(cap, base * 2**attempt)) between them (or the
    server's Retry-After, capped). Raises RemoteReadError naming `what`, `url` and the last status."""
    for attempt in range(tries):
        try:
            return fn()
        except Exception as e:  # classified below: a non-transient one leaves at once
            if isinstance(
                e, UserError
            ):  # RemoteReadError of a nested call, or a problem with the data: one line already
                raise
            if not is_transient(e):
                raise RemoteReadError(
                    f"{what}: cannot read {url} ({describe(e)}); check the URL and credentials"
                ) from e
            if attempt == tries - 1:
                raise RemoteReadError(
                    f"{what}: {url} failed {tries} times, last {describe(e)}; the server or network is failing: "
                    f"retry later or raise data.cache.retries"
                ) from e
            wait = retry_after_s(e)
            sleep(min(cap_s, wait) if wait is not None else random.uniform(0, min(cap_s, base_s * 2**attempt)))
    raise AssertionError("unreachable")
