"""Shared trainer-test fixtures.

- The shard-index cache (adapter_trainer.data.split_index.default_index_cache) stays out of the user's home.
- `models` (tests/conftest.py): the tiny demo models, built once per session and shared with tests/trainer/generation.
- `model_dirs`: the tiny Llama (no tokenizer) and MusicGen decoder saved as checkpoints, for the MoT model tests.
- `one_thread`: one intra-op thread for a module's tiny matmuls (`pytestmark = pytest.mark.usefixtures("one_thread")`).
- `shards`: a small synthetic shard set (8 train, 4 eval clips of 12-20 frames). A test module that needs another
  set defines its own `shards` fixture, which takes precedence over this one.
- `step2_ckpt`: the checkpoint of a 2-step demo-preset run on the module's `shards` (tests.trainer.helpers.make_cfg).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _index_cache_in_tmp(tmp_path_factory: pytest.TempPathFactory):
    mp = pytest.MonkeyPatch()
    mp.setenv("ADAPTER_TRAINER_INDEX_CACHE", str(tmp_path_factory.mktemp("shard-index-cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.contract.shard_fixture import write_synthetic_set

    return write_synthetic_set(tmp_path_factory.mktemp("shards") / "set", n_train=8, n_eval=4, frames=(12, 20))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matmuls: one intra-op thread is several times faster than two on a shared 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from adapter_trainer.demo.models import write_llm, write_musicgen

    root = tmp_path_factory.mktemp("mot_models")
    return {"llm": write_llm(root, seed=0, with_tokenizer=False), "musicgen": write_musicgen(root, seed=0)}


@pytest.fixture(scope="module")
def step2_ckpt(models, shards, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from adapter_trainer.training.recipe import recipe_main
    from tests.trainer.helpers import make_cfg

    out = tmp_path_factory.mktemp("ckpt")
    recipe_main(make_cfg(models, shards, out, "trainer.max_steps=2", "trainer.ckpt_every=2"))
    return out / "checkpoints" / "step-000002"
