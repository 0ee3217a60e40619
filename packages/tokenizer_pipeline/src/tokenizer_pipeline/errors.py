"""The one user-error type: a problem the user must fix before any clip is encoded.

The CLI catches `UserError` and prints its message (which names the file/value and the fix) without a
traceback, exit status 1. Per-clip problems are never `UserError`: they are `read_audio.ClipFailure`,
recorded in failures.jsonl while the run goes on.
"""
from __future__ import annotations


class UserError(Exception):
    """Bad configuration or input that stops the run up front; `str(err)` says what to change."""


class ConfigError(UserError, ValueError):
    """A config value that cannot work (unknown option, missing codec, unusable split column)."""
