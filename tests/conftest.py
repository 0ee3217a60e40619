"""Shared pytest options. Heavier checks are opt-in with --run-slow (`make test-slow`), never silently skipped:
without the flag they are deselected and pytest reports them as deselected, not passed.

`models`: the tiny demo models (real Llama/MusicGen classes, `adapter_trainer.demo.models`), built once per session
for the trainer and generation tests; tests only read them."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="also run tests marked slow (full-size demo checks)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: heavier check, runs only with --run-slow (make test-slow)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    keep = [i for i in items if "slow" not in i.keywords]
    dropped = [i for i in items if "slow" in i.keywords]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from adapter_trainer.demo.models import write_demo_models

    return write_demo_models(tmp_path_factory.mktemp("models"), seed=0)
