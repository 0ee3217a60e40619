"""`python -m tokenizer_pipeline [--explain] [hydra overrides]`: Hydra parsing only; the run itself is `run.pipeline`.

Under torchrun every rank parses the same overrides; only rank 0 prints, and every rank writes a configuration
error's `error:` line to torchrun's per-worker error file (`TORCHELASTIC_ERROR_FILE`) so torchrun's report quotes it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from .config import PipelineConfig, expand_user
from .errors import USER_ERROR_EXIT, UserError
from .hydra_cli import config_groups, find_conf_dir, refusals_in_one_line, shell_word, undeclared_line
from .run.pipeline import EXPLAIN, RunStopped, run_pipeline

ConfigStore.instance().store(name="shards_schema", node=PipelineConfig)
KEYS_HINT = "python -m tokenizer_pipeline audio_dir=DIR --cfg job, docs/configuration.md"


@hydra.main(config_path=str(find_conf_dir()), config_name="shards", version_base="1.3")
def _hydra_main(dcfg: DictConfig) -> None:
    unknown = undeclared_line(
        OmegaConf.to_container(dcfg), PipelineConfig, sys.argv[1:], config_groups(find_conf_dir()), KEYS_HINT
    )
    if unknown:  # a key added with + (Hydra refuses one given without)
        _user_error(unknown)
    try:
        cfg: PipelineConfig = expand_user(OmegaConf.to_object(dcfg))  # typed from here on
    except MissingMandatoryValue as e:
        _user_error(f"{e.full_key} is required.\n\n{EXPLAIN}")
    rank0 = os.environ.get("RANK", "0") == "0"
    signals: list[int] = []
    previous = signal.signal(signal.SIGTERM, _raise_interrupt(signals))  # a scheduler's SIGTERM ends it as Ctrl-C
    try:
        result = run_pipeline(cfg)
    except UserError as e:
        # PipelineError, CsvError, ConfigError: a problem the user fixes; the message names the fix, no traceback
        _user_error(str(e))
    except (RunStopped, KeyboardInterrupt) as e:  # the lock is released and the decode workers closed by now
        signum = signals[0] if signals else signal.SIGINT
        if rank0:
            print(_stopped_line(e, signum), file=sys.stderr)
        _exit(128 + signum)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if rank0:
        print(result.message, file=sys.stderr if result.exit_code else sys.stdout)
    _exit(result.exit_code)


def _raise_interrupt(signals: list[int]) -> Callable[[int, object], None]:
    """A SIGTERM handler that records the signal and raises KeyboardInterrupt, so the run stops as on Ctrl-C."""

    def handler(signum: int, frame: object) -> None:
        signals.append(signum)
        raise KeyboardInterrupt

    return handler


def continue_command() -> str:
    """The command line that continues this run: its own, less any `overwrite=` (which would delete what is kept),
    quoted for bash and zsh; under torchrun the torchrun launch."""
    world, per_node = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = f"--nnodes={world // per_node} " if world > per_node else ""
    launcher = f"torchrun {nodes}--nproc_per_node={per_node} -m" if world > 1 else "python -m"
    args = [a for a in sys.argv[1:] if a.partition("=")[0].lstrip("+~") != "overwrite"]
    return " ".join([f"{launcher} tokenizer_pipeline", *(shell_word(a) for a in args)])


def _stopped_line(stop: BaseException, signum: int) -> str:
    """The one line a run stopped by Ctrl-C or SIGTERM ends with: what is kept, and the command that continues."""
    how = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    rank = "rank 0: " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
    if not isinstance(stop, RunStopped):
        what, then = "before encoding started", "starts it again"
    elif stop.kept == stop.total:
        what, then = f"all {stop.total} shards are complete in {stop.out_dir}, the manifest not yet", "writes it"
    else:
        what, then = f"{stop.kept} of {stop.total} shards are complete and kept in {stop.out_dir}", "encodes the rest"
    return f"tokenizer_pipeline: stopped ({how}): {rank}{what}; the same command {then}: {continue_command()}"


def _exit(code: int) -> None:
    """Exit with `code`. Under torchrun (process group destroyed, every file written) `os._exit` after flushing skips
    the interpreter's teardown, where a C++ thread left by torch.distributed can abort a finished rank (SIGABRT)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code:
        raise SystemExit(code)


def _user_error(message: str) -> None:
    """Print `error: <message>` (rank 0 only under torchrun), hand it to torchrun, exit 2."""
    if os.environ.get("RANK", "0") == "0":
        print(f"error: {message}", file=sys.stderr)
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file and not os.path.exists(error_file):
        # torch.distributed.elastic's error-file format: a str message (shown as is) and an int timestamp
        with open(error_file, "w", encoding="utf-8") as f:
            json.dump({"message": f"error: {message}", "timestamp": int(time.time())}, f, allow_nan=False)
    _exit(USER_ERROR_EXIT)


def main(argv: list[str] | None = None) -> None:
    """Entry point; `--explain` is handled before Hydra parses argv, Hydra's refusal of an override in one line."""
    args = sys.argv[1:] if argv is None else argv
    if "--explain" in args:
        print(EXPLAIN)
        raise SystemExit(2)
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    with refusals_in_one_line(
        "tokenizer_pipeline", PipelineConfig, find_conf_dir(), "shards", KEYS_HINT, USER_ERROR_EXIT
    ):
        _hydra_main()


def config_from_overrides(overrides: list[str]) -> PipelineConfig:
    """Compose the typed config as the CLI would (for tests and notebooks)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(find_conf_dir()), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="shards", overrides=overrides))


if __name__ == "__main__":
    main()
