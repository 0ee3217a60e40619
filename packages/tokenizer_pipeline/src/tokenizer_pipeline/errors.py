"""The user-error base of tokenizer_pipeline: a problem the user must fix before any clip is encoded.

Every command (`python -m tokenizer_pipeline`, `.download`, `.decode`) catches `UserError` and prints its message
(which names the file/value and the fix) without a traceback, exit status `USER_ERROR_EXIT` (2, argparse's status
for a refused command line); exit 1 means the run itself ended badly (nothing encoded, too many failures, nothing
fetched). Subclasses: `ConfigError`, `InputNotFoundError` and `PipelineError` here, `sources.musiccaps.CsvError`,
`fetch.config.DownloadConfigError`, `codec.decode.DecodeError`. Per-clip problems are never `UserError`: they are
`audio.read_audio.ClipFailure`, recorded in failures.jsonl while the run goes on. adapter_trainer has the same contract
in its own errors.py.
"""

from __future__ import annotations

USER_ERROR_EXIT = 2


class UserError(Exception):
    """Bad configuration or input that stops the run up front; `str(err)` says what to change."""


class InputNotFoundError(UserError, FileNotFoundError):
    """A file or directory the user named does not exist; the message says how to make it."""


class ConfigError(UserError, ValueError):
    """A config value that cannot work (unknown option, missing codec, unusable split column)."""


class PipelineError(UserError, RuntimeError):
    """A problem with the inputs or the output directory that the user must fix; the message says how."""
