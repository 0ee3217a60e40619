"""`python -m tokenizer_pipeline [hydra overrides]`: Hydra parsing only; the run itself is the `run` room.

Configs: conf/tokenizer_pipeline/shards.yaml over the `PipelineConfig` schema (config.py).
`--explain` prints how to point it at audio. Under `torchrun --nproc_per_node=N -m tokenizer_pipeline`
every rank parses the same overrides; only rank 0 prints the summary, or a configuration error's one `error:` line.
Every rank also writes that line to torchrun's per-worker error file (`TORCHELASTIC_ERROR_FILE`, the file
`torch.distributed.elastic`'s `@record` writes), so torchrun's own failure report quotes it instead of a link to its
docs; what torchrun still adds is in docs/architecture.md (errors and exit codes).
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

from .conf_dir import find_conf_dir
from .config import CodecConfig, PipelineConfig, ShardConfig, SplitConfig
from .errors import USER_ERROR_EXIT, UserError
from .overrides import check_overrides
from .run.pipeline import EXPLAIN, RunResult, run_pipeline

__all__ = [
    "CodecConfig",
    "PipelineConfig",
    "ShardConfig",
    "SplitConfig",
    "RunResult",
    "run_pipeline",
    "main",
    "config_from_overrides",
]

ConfigStore.instance().store(name="shards_schema", node=PipelineConfig)


@hydra.main(config_path=str(find_conf_dir()), config_name="shards", version_base="1.3")
def _hydra_main(dcfg: DictConfig) -> None:
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
    """Exit with `code`. Under torchrun (the process group is already destroyed, every file written and fsynced)
    the process ends with `os._exit` after flushing, skipping the interpreter's teardown: there a C++ thread left
    by torch.distributed sometimes aborted a finished rank ("terminate called without an active exception",
    SIGABRT), which turned a complete job into torchrun's exit 1."""
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
    """Entry point; `--explain` and the overrides' keys are handled before Hydra parses argv."""
    args = sys.argv[1:] if argv is None else argv
    if "--explain" in args:
        print(EXPLAIN)
        raise SystemExit(2)
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    try:  # an unknown key stops here, before Hydra composes (tokenizer_pipeline.overrides)
        sys.argv[1:] = check_overrides(
            sys.argv[1:], schema=PipelineConfig, conf_dir=find_conf_dir(), primary="shards",
            keys_hint="python -m tokenizer_pipeline audio_dir=DIR --cfg job, docs/configuration.md",
        )  # fmt: skip
    except UserError as e:
        _user_error(str(e))
    _hydra_main()


def config_from_overrides(overrides: list[str]) -> PipelineConfig:
    """Compose the typed config as the CLI would (for tests and notebooks)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(find_conf_dir()), version_base="1.3"):
        return OmegaConf.to_object(compose(config_name="shards", overrides=overrides))
