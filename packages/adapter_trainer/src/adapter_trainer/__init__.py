"""adapter_trainer: train a Mixture-of-Transformers adapter (frozen Llama 3.2 + frozen MusicGen decoder) from token
shards alone. It never builds an audio codec and never imports tokenizer_pipeline: the shard format
(docs/shard-format.md) is the whole interface.

Rooms (docs/architecture.md lists every module):
    config.py, errors.py   the structured config schema; the user-error base (exit 2)
    file_modes.py          safetensors files with the mode the umask gives (readable by teammates)
    model/                 the MoT adapter (layer, attention, KV cache, loss), LoRA, builders, exported folders
    data/                  shard reader, token layout, caption dropout, streamed batches
    training/              the recipe (a leaf) and its library: device, step, optim, checkpoint, distributed, logging
    generation/            KV-cached sampling with CFG, generated shard sets
    sharing/               a run's checkpoint exported as a shareable adapter folder + model card, pushed to the Hub
    evaluation/            learning-check math, the attribute probe
    demo/                  the embedded offline default: tiny models, caption pretraining, listening page

Commands: `python -m adapter_trainer` (training), `.generate`, `.export`, `.probe`, `.demo_models`, `.listen_page`,
`.listen_check`. The public API below is what notebooks and other tools import; every name loads on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> module it lives in; loaded on first use, so `python -m adapter_trainer.<command>` imports only what that
# command needs (the training names pull in torch + transformers, the config names Hydra).
_PUBLIC = {
    "ConfigError": "adapter_trainer.config",
    "TrainConfig": "adapter_trainer.config",
    "to_train_config": "adapter_trainer.config",
    "UserError": "adapter_trainer.errors",
    "build_mot_model": "adapter_trainer.model.builders",
    "load_adapter": "adapter_trainer.model.adapter_io",
    "recipe_main": "adapter_trainer.training.recipe",
    "run_generate": "adapter_trainer.generation.generate",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'adapter_trainer' has no attribute {name!r}")
