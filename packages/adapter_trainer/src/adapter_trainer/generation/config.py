"""Schema of `python -m adapter_trainer.generate`: the training config plus a `generate` section.

A module of its own (not generate.py) so the dataclasses always live in an importable module: Hydra/OmegaConf
resolve their annotations through `sys.modules[cls.__module__]`, which is not the script when run as __main__.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional

from hydra.core.config_store import ConfigStore

from adapter_trainer.config import ConfigError, TrainConfig

CAPTION_SOURCES = ("eval", "file", "texts")
GENERATE_SCHEMA_NAME = "adapter_trainer_generate_schema"


@dataclass
class GenerateConfig:
    checkpoint: str = "latest"  # "latest" (newest under trainer.output_dir/checkpoints) or a step-XXXXXX dir
    captions: str = "eval"  # eval (data.eval_split's captions, in order) | file (captions_file) | texts (texts)
    captions_file: Optional[str] = None  # one caption per line, for captions=file
    texts: List[str] = field(default_factory=list)  # for captions=texts
    # clips to generate: 0 = every caption once (eval: the whole eval split, which the probe needs: its power grows
    # with the clip count); N = eval: the first N eval clips, file/texts: cycles through the captions
    n: int = 0
    seconds: float = 5.0  # stop after this much audio (frames = seconds * codec frame_rate), or at AUDIO_END
    batch_size: int = 8  # captions per forward (CFG doubles the rows)
    temperature: float = 1.0  # <= 0 = greedy
    top_k: int = 250  # MusicGen's default; 0 = off
    top_p: float = 0.0  # nucleus mass; 0 = off
    cfg_scale: float = 3.0  # classifier-free guidance (MusicGen's default); 1.0 = off
    # cfg_scale != 1 is refused for a checkpoint trained with data.caption_dropout=0 (untrained empty caption)
    allow_untrained_uncond: bool = False
    seed: int = 0  # clip i draws from its own generator seeded by (seed, i): reruns give the same codes
    # null = <trainer.output_dir>/generated (with generate.adapter: outputs/<folder name>/generated)
    out_dir: Optional[str] = None
    overwrite: bool = False  # replace a non-empty out_dir
    # a folder of `python -m adapter_trainer.export`: sample from it alone (no experiment, run dir or shards); the model,
    # token layout and codec come from its adapter_config.json, sampling keys not given from its generation_config.json
    adapter: Optional[str] = None
    adapter_llm: Optional[str] = None  # with adapter: a local dir for its base LLM (null = the recorded id or path)
    adapter_audio_lm: Optional[str] = None  # with adapter: a local dir for its base audio LM
    check_base_weights: bool = True  # with adapter: refuse base towers whose weights hash to other values than recorded


@dataclass
class GenerateRunConfig(TrainConfig):
    generate: GenerateConfig = field(default_factory=GenerateConfig)


ConfigStore.instance().store(name=GENERATE_SCHEMA_NAME, node=GenerateRunConfig)


def validate_generate(g: GenerateConfig) -> None:
    """Value checks OmegaConf cannot express; ConfigError names the key and the fix."""
    if g.captions not in CAPTION_SOURCES:
        raise ConfigError(f"generate.captions={g.captions!r}; choose one of {', '.join(CAPTION_SOURCES)}")
    if g.captions == "file" and not g.captions_file:
        raise ConfigError("generate.captions=file needs generate.captions_file=path/to/captions.txt")
    if g.captions == "texts" and not g.texts:
        raise ConfigError("generate.captions=texts needs generate.texts='[\"a calm piano melody\"]'")
    if g.n < 0:
        raise ConfigError(f"generate.n={g.n} must be >= 0 (0 = every caption once: the whole eval split for eval)")
    if g.batch_size < 1:
        raise ConfigError(f"generate.batch_size={g.batch_size} must be >= 1")
    for key in ("seconds", "temperature", "cfg_scale"):  # nan passes every comparison below
        if not math.isfinite(getattr(g, key)):
            raise ConfigError(f"generate.{key}={getattr(g, key)} must be a finite number")
    if g.seconds <= 0:
        raise ConfigError(f"generate.seconds={g.seconds} must be > 0")
    if g.adapter and g.captions == "eval":
        raise ConfigError(
            "generate.adapter samples without the training shards: use generate.captions=texts 'generate.texts=[...]' "
            "or generate.captions=file generate.captions_file=captions.txt"
        )
    if (g.adapter_llm or g.adapter_audio_lm) and not g.adapter:
        raise ConfigError(
            "generate.adapter_llm / generate.adapter_audio_lm need generate.adapter=DIR; else use model.*"
        )
    if g.top_k < 0 or not 0.0 <= g.top_p <= 1.0:
        raise ConfigError(f"generate.top_k={g.top_k} must be >= 0 and generate.top_p={g.top_p} in [0, 1]")
