"""`python -m adapter_trainer.generate +experiment=demo [generate.*=...]`: sample codes from a trained adapter into a
shard set (conf/adapter_trainer/generate.yaml over `generation.config.GenerateRunConfig`; the work:
`generation.generate.run_generate`)."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from adapter_trainer.config import ConfigError, shards_as_list
from adapter_trainer.errors import USER_ERROR_EXIT, UserError
from adapter_trainer.generation.config import GenerateRunConfig
from adapter_trainer.generation.generate import run_generate, to_generate_config
from adapter_trainer.hydra_cli import config_groups, find_conf_dir, refusals_in_one_line, undeclared_line

KEYS_HINT = "python -m adapter_trainer.generate +experiment=demo --cfg job, docs/configuration.md"


@hydra.main(config_path=str(find_conf_dir()), config_name="generate", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    given = {o.split("=", 1)[0].lstrip("+~") for o in HydraConfig.get().overrides.task}
    try:
        unknown = undeclared_line(
            OmegaConf.to_container(cfg), GenerateRunConfig, sys.argv[1:], config_groups(find_conf_dir()), KEYS_HINT
        )
        if unknown:  # a key added with + (Hydra refuses one given without)
            raise ConfigError(unknown)
        run_generate(to_generate_config(cfg, given))
    except UserError as e:  # ConfigError, ShardFormatError, ResumeError: the message names the fix
        print(f"adapter_trainer.generate: error: {e}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)


def main() -> None:
    """`python -m adapter_trainer.generate [overrides]`: Hydra composes generate.yaml; its refusal of the command line
    (an unknown key, naming the likely one) is one line and exit 2."""
    sys.argv[1:] = shards_as_list(sys.argv[1:])
    with refusals_in_one_line(
        "adapter_trainer.generate", GenerateRunConfig, find_conf_dir(), "generate", KEYS_HINT, USER_ERROR_EXIT
    ):
        _hydra_main()


if __name__ == "__main__":
    main()
