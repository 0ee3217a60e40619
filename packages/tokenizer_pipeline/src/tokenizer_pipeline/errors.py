"""The user-error base: a problem the user must fix before any clip is encoded.

Every command prints a `UserError`'s message (which names the file/value and the fix) without a traceback and exits
`USER_ERROR_EXIT`; exit 1 means the run itself ended badly. Per-clip problems are `audio.read_audio.ClipFailure`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

USER_ERROR_EXIT = 2


class UserError(Exception):
    """Bad configuration or input that stops the run up front; `str(err)` says what to change."""


class InputNotFoundError(UserError, FileNotFoundError):
    """A file or directory the user named does not exist; the message says how to make it."""


class ConfigError(UserError, ValueError):
    """A config value that cannot work (unknown option, missing codec, unusable split column)."""


class PipelineError(UserError, RuntimeError):
    """A problem with the inputs or the output directory that the user must fix; the message says how."""


def exit_code(command: Callable[[], object], prefix: str = "") -> int:
    """`command()`'s exit code (an int it returns, else 0); a UserError is one `<prefix>error: <message>` line on
    stderr, no traceback, and USER_ERROR_EXIT."""
    try:
        code = command()
    except UserError as e:
        print(f"{prefix}error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT
    return code if isinstance(code, int) else 0
