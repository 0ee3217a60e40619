"""Entry point: `python -m adapter_trainer +experiment=demo` (or the `adapter-trainer` script).

Hydra composes conf/adapter_trainer/config.yaml on top of the structured schema (adapter_trainer/config.py);
the DictConfig stops here: `to_train_config` turns it into a typed, validated TrainConfig for the recipe.
Errors a user can fix by changing the config, the data or the checkpoint (every `errors.UserError`: ConfigError,
ShardFormatError, ResumeError, EvalOverlapError) end the process with their message and exit code 2, no stack trace.
"""

from __future__ import annotations

import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from adapter_trainer.conf_dir import find_conf_dir
from adapter_trainer.config import TrainConfig, to_train_config
from adapter_trainer.errors import USER_ERROR_EXIT, UserError, one_line
from adapter_trainer.overrides import check_overrides

KEYS_HINT = "python -m adapter_trainer +experiment=demo --cfg job, docs/configuration.md"


@hydra.main(config_path=str(find_conf_dir()), config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    """Compose -> typed config -> recipe (setup, train, cleanup)."""
    try:
        typed = to_train_config(cfg)
        # Hydra's run dir is trainer.output_dir; under --multirun it is <trainer.output_dir>/<job num>, so each
        # job of a sweep gets its own checkpoints and metrics.
        typed.trainer.output_dir = HydraConfig.get().runtime.output_dir
        from adapter_trainer.training.recipe import recipe_main  # after config checks: pulls in torch + transformers

        recipe_main(typed)
    except UserError as e:
        print(f"adapter_trainer: error: {one_line(e)}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)


def main() -> None:
    """Console entry point. Under torchrun, ranks > 0 ask Hydra not to write .hydra/ or its log file: rank 0
    alone writes into the run directory (the recipe does the same for metrics, checkpoints and plots).
    The overrides are checked first (adapter_trainer.overrides): an unknown key stops here, before Hydra."""
    try:
        sys.argv[1:] = check_overrides(
            sys.argv[1:],
            schema=TrainConfig,
            conf_dir=find_conf_dir(),
            primary="config",
            keys_hint=KEYS_HINT,
            list_keys=("data.shards",),  # data.shards=DIR or data.shards=a,b: a list (README, zsh)
        )
    except UserError as e:
        print(f"adapter_trainer: error: {e}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    if int(os.environ.get("RANK", "0")) > 0:
        sys.argv += ["hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    _hydra_main()


if __name__ == "__main__":
    main()
