"""adapter_trainer: train a Mixture-of-Transformers adapter (frozen Llama 3.2 + frozen MusicGen decoder) from token
shards alone. It never builds an audio codec and never imports tokenizer_pipeline: the shard format
(docs/shard-format.md) is the whole interface.

Rooms (docs/architecture.md lists every module):
    config.py, errors.py   the structured config schema; the user-error base (exit 2)
    model/                 the MoT adapter, LoRA, builders (`build_mot_model`)
    data/                  shard reader, token layout, caption dropout, streamed batches
    training/              the recipe (a leaf) and its library: device, step, optim, checkpoint, distributed, logging
    generation/            KV-cached sampling with CFG, generated shard sets
    evaluation/            learning-check math, the attribute probe
    demo/                  the embedded offline default: tiny models, caption pretraining, listening page

Commands: `python -m adapter_trainer` (training), `.generate`, `.probe`, `.demo_models`, `.listen_page`,
`.listen_check`. The public API below is what notebooks and other tools import; heavy names load on first use.
"""

from __future__ import annotations

from typing import Any

from adapter_trainer.config import ConfigError, TrainConfig, to_train_config
from adapter_trainer.errors import UserError

__all__ = [
    "ConfigError",
    "TrainConfig",
    "UserError",
    "build_mot_model",
    "recipe_main",
    "run_generate",
    "to_train_config",
]

_LAZY = {  # name -> module: these pull in torch + transformers, so they load on first use
    "build_mot_model": "adapter_trainer.model.builders",
    "recipe_main": "adapter_trainer.training.recipe",
    "run_generate": "adapter_trainer.generation.generate",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'adapter_trainer' has no attribute {name!r}")
