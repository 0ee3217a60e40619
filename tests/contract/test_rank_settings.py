"""Both stages read torchrun's environment alike: with LOCAL_WORLD_SIZE unset (a launcher that sets none), each
counts every rank as on this node, so they size their workers alike."""

from __future__ import annotations

import pytest

from adapter_trainer.training.distributed import local_world_size as trainer_local_world_size
from tokenizer_pipeline.run.ranks import local_world_size as pipeline_local_world_size


@pytest.mark.parametrize("env, world, want", [({}, 4, 4), ({"LOCAL_WORLD_SIZE": "2"}, 4, 2), ({}, 1, 1)])
def test_both_stages_agree_on_ranks_per_node(env, world, want, monkeypatch) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert trainer_local_world_size(world) == pipeline_local_world_size(world) == want
