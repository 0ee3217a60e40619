"""Shared trainer-test fixtures.

- `models` (tests/conftest.py): the tiny demo models, built once per session and shared with tests/trainer/generation.
- `model_dirs`: the tiny Llama (no tokenizer) and MusicGen decoder saved as checkpoints, for the MoT model tests.
- `one_thread`: one intra-op thread for a module's tiny matmuls (`pytestmark = pytest.mark.usefixtures("one_thread")`).
- `shards`: a small synthetic shard set (8 train, 4 eval clips of 12-20 frames). A test module that needs another
  set defines its own `shards` fixture, which takes precedence over this one.
- `step2_ckpt`: the checkpoint of a 2-step demo-preset run on the module's `shards` (tests.trainer.helpers.make_cfg).
- `reused_tokenizers`: in-process runs of a module load each model dir's tokenizer once per session
  (`pytestmark = pytest.mark.usefixtures("reused_tokenizers")`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

_TOKENIZERS: dict[tuple, Any] = {}  # (dir, its files' names, sizes and mtimes) -> the tokenizer loaded from it


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.contract.shard_fixture import write_synthetic_set

    return write_synthetic_set(tmp_path_factory.mktemp("shards") / "set", n_train=8, n_eval=4, frames=(12, 20))


@pytest.fixture(scope="module")
def one_thread(request: pytest.FixtureRequest):
    """Tiny matmuls: one intra-op thread is several times faster than two on a shared 2-core box. An explicit
    `--torch-threads N` wins (the suite's check that no verdict depends on the thread count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.config.getoption("--torch-threads") or 1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def reused_tokenizers():
    """`builders.load_text_tokenizer` loads a local dir's tokenizer once per session: the demo's Llama 3 tokenizer
    (128,256 ids) takes ~2 s to load, as long as the rest of a 2-step run. The code under test never changes a
    tokenizer; the key holds the dir's file sizes and mtimes, so a rewritten dir loads again, and a path that is no
    dir (a hub id, a missing dir) goes to the real loader and its errors. Subprocesses load their own."""
    from adapter_trainer.model import builders

    load = builders.load_text_tokenizer

    def load_once(name_or_path):
        path = Path(name_or_path)
        if not path.is_dir():
            return load(name_or_path)
        files = tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in path.iterdir() if f.is_file()))
        key = (str(path.resolve()), files)
        if key not in _TOKENIZERS:
            _TOKENIZERS[key] = load(name_or_path)
        return _TOKENIZERS[key]

    mp = pytest.MonkeyPatch()
    mp.setattr(builders, "load_text_tokenizer", load_once)
    yield
    mp.undo()


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
