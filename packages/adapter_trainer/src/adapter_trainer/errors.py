"""The user-error base of adapter_trainer: a problem the user fixes in the config, the data or the checkpoint.

Every command catches `UserError`, prints its message (which names the value or file and the fix) without a
traceback and exits with `USER_ERROR_EXIT`; the subclasses live with the code that raises them.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable

USER_ERROR_EXIT = 2
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # the errnos of a write that found its filesystem full


class UserError(Exception):
    """Bad configuration or input that stops a command up front; `str(err)` says what to change."""


class CheckpointWriteError(UserError):
    """A checkpoint could not be written (a full disk, a failed write); the temp dir is gone and the newest complete
    checkpoint is still the one trainer.resume=latest finds."""


def one_line(e: BaseException) -> str:
    """A UserError's message. One raised in a DataLoader worker reaches the training process re-made by torch as
    `type("Caught X in DataLoader worker process N.\nOriginal Traceback ...\nmodule.X: message")`: its last line,
    without the type, is the message."""
    text = str(e)
    if "Original Traceback" not in text:
        return text
    last = [ln for ln in text.strip().splitlines() if ln.strip()][-1]
    head, sep, rest = last.partition(": ")
    return rest if sep and type(e).__name__ in head else last


def run_command(prog: str, action: Callable[[], str]) -> int:
    """Print what `action` returns (if anything) and exit 0; a UserError prints `prog: error: message` and exits
    USER_ERROR_EXIT."""
    try:
        if text := action():
            print(text)
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return USER_ERROR_EXIT
    return 0
