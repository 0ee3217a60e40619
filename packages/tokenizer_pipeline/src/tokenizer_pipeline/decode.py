"""`python -m tokenizer_pipeline.decode SHARD_SET out_dir=DIR [key=value ...]`: codes -> wav files with the codec
that made them (conf/tokenizer_pipeline/decode.yaml over `codec.decode.DecodeConfig`)."""

from __future__ import annotations

import sys

from tokenizer_pipeline.codec.decode import DecodeConfig, run_decode
from tokenizer_pipeline.errors import UserError, exit_code
from tokenizer_pipeline.hydra_cli import find_conf_dir, refusal_line, undeclared_line

USAGE = (
    "usage: python -m tokenizer_pipeline.decode SHARD_SET out_dir=DIR [codec=PATH_OR_ID] [split=NAME] [limit=N] "
    "[max_seconds=S] [device=cpu|auto|cuda|mps]"
)
HELP = f"""{USAGE}

Codes of a shard set (a stage-1 set, or generated codes) -> <out_dir>/<key>.wav and decoded.json, with the codec
that made them (the manifest's codec.path_from_set or name_or_path; its weights must hash to codec.weights_sha256).
  codec=PATH_OR_ID   a copy of that codec elsewhere      split=NAME   one split only (default: every split)
  limit=N            the first N clips in shard order    max_seconds=S  only the start of each clip
  device=...         cpu (default), auto, cuda or mps
e.g. python -m tokenizer_pipeline.decode build/demo/runs/demo/generated out_dir=build/listen"""


def config_from_args(args: list[str]) -> DecodeConfig:
    """The shard set (the one argument without `=`) and Hydra's `key=value` overrides -> the typed config."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    sets = [a for a in args if "=" not in a]
    if len(sets) != 1:
        raise UserError(f"give one shard set (got {len(sets)}); {USAGE}")
    ConfigStore.instance().store(name="decode_schema", node=DecodeConfig)
    overrides = [a for a in args if "=" in a]
    try:
        with initialize_config_dir(config_dir=str(find_conf_dir()), version_base="1.3"):
            dcfg = compose(config_name="decode", overrides=overrides)
        unknown = undeclared_line(OmegaConf.to_container(dcfg), DecodeConfig, overrides, set(), USAGE)
        if unknown:  # a key added with + (Hydra refuses one given without)
            raise UserError(unknown)
        dcfg.shard_set = sets[0]  # set, not parsed: a path is never read as override syntax
        return OmegaConf.to_object(dcfg)
    except (HydraException, OmegaConfBaseException) as e:  # unknown key, bad value, out_dir missing
        line = refusal_line(overrides, DecodeConfig, set(), set(), USAGE)
        causes = [e, *([e.__cause__] if e.__cause__ else [])]  # Hydra's own line, then OmegaConf's reason
        why = " ".join(str(x).strip().splitlines()[0].split(" To append")[0] for x in causes if str(x).strip())
        raise UserError(line or f"{why or type(e).__name__}; {USAGE}") from e


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if "-h" in args or "--help" in args:
        print(HELP)
        return 0
    return exit_code(lambda: run_decode(config_from_args(args)), "tokenizer_pipeline.decode: ")


if __name__ == "__main__":
    raise SystemExit(main())
