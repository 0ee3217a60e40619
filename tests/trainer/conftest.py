"""Trainer tests keep the shard-index cache (adapter_trainer.shards.default_index_cache) out of the user's home."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="session")
def _index_cache_in_tmp(tmp_path_factory: pytest.TempPathFactory):
    mp = pytest.MonkeyPatch()
    mp.setenv("ADAPTER_TRAINER_INDEX_CACHE", str(tmp_path_factory.mktemp("shard-index-cache")))
    yield
    mp.undo()
