"""The training tests run many short in-process runs on the same demo models: each loads the tokenizer once."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True, scope="module")
def _reuse_tokenizers(reused_tokenizers) -> None:
    """Every module here reuses loaded tokenizers (tests/trainer/conftest.py, `reused_tokenizers`)."""
