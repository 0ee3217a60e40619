"""tokenizer_pipeline: MusicCaps CSV (or any audio + captions) -> EnCodec codes in versioned WebDataset shards.

It never imports adapter_trainer: the shard format (docs/shard-format.md) is the whole interface; docs/architecture.md
describes its rooms.

The public API below is what notebooks and other tools import; every name loads on first use.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# OpenMP threads that spin while they wait stall a CPU run for seconds whenever another process holds a core (a
# DataLoader or decode worker, a second job): torch's CPU threads wait passively unless the environment says
# otherwise. It applies only when this package is imported before torch (every `python -m` command is).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# name -> module it lives in; loaded on first use, so `python -m tokenizer_pipeline[.<command>]` imports only what
# that command needs (decode_codes pulls in torch + transformers' EnCodec).
_PUBLIC = {
    "DecodeError": "tokenizer_pipeline.codec.decode",
    "UserError": "tokenizer_pipeline.errors",
    "decode_codes": "tokenizer_pipeline.codec.decode_api",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'tokenizer_pipeline' has no attribute {name!r}")
