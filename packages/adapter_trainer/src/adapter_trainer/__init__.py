"""adapter_trainer: train a Mixture-of-Transformers adapter (frozen Llama 3.2 + frozen MusicGen decoder) from token
shards alone; the shard format (docs/shard-format.md) is the whole interface. docs/architecture.md lists the rooms.

The public API below is what notebooks and other tools import; every name loads on first use. `MoTAdapter` loads an
exported adapter and samples codes (`MoTAdapter.from_pretrained(DIR).generate(texts)`; generation/api.py).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# OpenMP threads that spin while they wait stall a CPU run for seconds whenever another process holds a core (a
# DataLoader or decode worker, a second job): torch's CPU threads wait passively unless the environment says
# otherwise. It applies only when this package is imported before torch (every `python -m` command is).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# name -> module it lives in; loaded on first use, so `python -m adapter_trainer.<command>` imports only what that
# command needs (the training names pull in torch + transformers, the config names Hydra).
_PUBLIC = {
    "ConfigError": "adapter_trainer.config",
    "MoTAdapter": "adapter_trainer.generation.api",
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
