"""Fixtures for the tokenizer_pipeline tests (helpers live in tests/pipeline/helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pipeline.helpers import make_corpus, make_tiny_codec


@pytest.fixture(scope="session")
def tiny_codec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_codec(tmp_path_factory.mktemp("codec") / "tiny_encodec")


@pytest.fixture()
def corpus(tmp_path: Path) -> tuple[Path, Path, list[dict[str, str]]]:
    return make_corpus(tmp_path / "corpus")
