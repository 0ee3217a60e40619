"""`python -m tokenizer_pipeline [--explain] [hydra overrides]`: Hydra parsing only; the run itself is `run.pipeline`.

Under torchrun every rank parses the same overrides; only rank 0 prints, and every rank writes a configuration
error's `error:` line to torchrun's per-worker error file (`TORCHELASTIC_ERROR_FILE`) so torchrun's report quotes it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from .config import PipelineConfig
from .errors import USER_ERROR_EXIT, UserError
from .hydra_cli import config_groups, find_conf_dir, refusals_in_one_line, undeclared_line
from .run.pipeline import EXPLAIN, run_pipeline

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
        cfg: PipelineConfig = OmegaConf.to_object(dcfg)  # typed from here on
    except MissingMandatoryValue as e:
        _user_error(f"{e.full_key} is required.\n\n{EXPLAIN}")
    rank0 = os.environ.get("RANK", "0") == "0"
    try:
        result = run_pipeline(cfg)
    except UserError as e:
        # PipelineError, CsvError, ConfigError: a problem the user fixes; the message names the fix, no traceback
        _user_error(str(e))
    if rank0:
        print(result.message, file=sys.stderr if result.exit_code else sys.stdout)
    _exit(result.exit_code)


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
