"""The small encoded set the decode tests read (never write: a test that tampers copies it first)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pipeline.helpers import make_corpus, pipeline_config
from tokenizer_pipeline.run.pipeline import run_pipeline


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory, tiny_codec: Path) -> Path:
    """A 2-train, 1-eval shard set encoded with the tiny codec."""
    base = tmp_path_factory.mktemp("decode")
    csv_path, audio_dir, _ = make_corpus(base / "corpus", n_train=2, n_eval=1)
    out = base / "set"
    assert run_pipeline(pipeline_config(csv_path, audio_dir, out, tiny_codec), progress=False).exit_code == 0
    return out
