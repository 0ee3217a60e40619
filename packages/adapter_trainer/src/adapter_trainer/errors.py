"""The user-error base of adapter_trainer: a problem the user fixes in the config, the data or the checkpoint.

Every command of this package (`python -m adapter_trainer`, `.generate`, `.probe`, ...) catches `UserError`,
prints its message (which names the value or file and the fix) without a traceback and exits with
`USER_ERROR_EXIT` (2, argparse's status for a refused command line). The subclasses live with the code that
raises them: `config.ConfigError`, `data.shards.ShardFormatError`, `training.checkpoint.ResumeError`,
`evaluation.held_out.EvalOverlapError`. tokenizer_pipeline has the same contract in its own errors.py.
"""

from __future__ import annotations

USER_ERROR_EXIT = 2


class UserError(Exception):
    """Bad configuration or input that stops a command up front; `str(err)` says what to change."""
