"""The two packages never import each other, so each has its own retry classifier (adapter_trainer reads shard sets,
tokenizer_pipeline pushes and verifies them). They must agree on what a retry may cure: the same exceptions, raised
the way fsspec's backends raise them, classify alike in both."""

from __future__ import annotations

import aiohttp
import aiohttp.http_exceptions
import botocore.exceptions
import pytest

from adapter_trainer.data.remote import retry as trainer_retry
from tokenizer_pipeline.remote import retry as pipeline_retry


class _Response:
    def __init__(self, status: int) -> None:
        self.status_code, self.headers = status, {}


class HTTPError(Exception):  # requests / httpx / huggingface_hub style: the status on .response
    def __init__(self, status: int) -> None:
        super().__init__(f"{status} error")
        self.response = _Response(status)


def _from(outer: BaseException, inner: BaseException) -> BaseException:
    outer.__cause__ = inner
    return outer


def _client_error(status: int) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": str(status)}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject"
    )


def _aiohttp_status(status: int) -> aiohttp.ClientResponseError:
    return aiohttp.ClientResponseError(None, (), status=status, message="x")  # type: ignore[arg-type]


CASES = {
    # transient
    "aiohttp 503": (_aiohttp_status(503), True),
    "aiohttp 429": (_aiohttp_status(429), True),
    "fsspec FileNotFoundError from a 503 probe": (_from(FileNotFoundError("u"), _aiohttp_status(503)), True),
    "aiohttp cut body (status 400)": (aiohttp.ClientPayloadError("Response payload is not completed"), True),
    "aiohttp cut body from a ContentLengthError (code 400)": (
        _from(
            aiohttp.ClientPayloadError("Response payload is not completed"),
            aiohttp.http_exceptions.ContentLengthError("Not enough data to satisfy content length header"),
        ),
        True,
    ),
    "aiohttp disconnected": (aiohttp.ServerDisconnectedError(), True),
    "timeout": (TimeoutError("read timed out"), True),
    "connection reset": (ConnectionResetError(104, "reset"), True),
    "botocore 500": (_client_error(500), True),
    "s3fs OSError from a botocore 503": (_from(OSError(5, "slow down"), _client_error(503)), True),
    "hub 502": (HTTPError(502), True),
    "hub 408": (HTTPError(408), True),
    # permanent
    "aiohttp 404": (_aiohttp_status(404), False),
    "FileNotFoundError": (FileNotFoundError("missing"), False),
    "PermissionError": (PermissionError("denied"), False),
    "botocore 403": (_client_error(403), False),
    "hub 401": (HTTPError(401), False),
    "hub 400": (HTTPError(400), False),
    "ValueError": (ValueError("bad"), False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_both_packages_classify_alike(name: str) -> None:
    exc, transient = CASES[name]
    assert trainer_retry.is_transient(exc) is transient, name
    assert pipeline_retry.is_transient(exc) is transient, name
