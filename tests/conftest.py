"""Shared pytest options. Heavier checks are opt-in with --run-slow (`make test-slow`), never silently skipped:
without the flag they are deselected and pytest reports them as deselected, not passed.

`--torch-threads N` (or TEST_TORCH_THREADS=N): torch's intra-op threads in every test process, and OMP_NUM_THREADS for
the processes tests start unless a test sets its own. Default: 1 in a pytest-xdist worker (`make test` runs one worker
per core), torch's own otherwise. The suite passes with 1 and with 2 (`make test TORCH_THREADS=2`): a verdict on a
float figure must not depend on the thread count. The `one_thread` fixture (tiny matmuls) follows an explicit
`--torch-threads`.

Every test has a time budget (tests/time_budget.py).

`models`: the tiny demo models (real Llama/MusicGen classes, `adapter_trainer.demo.models`), built once per session
for the trainer and generation tests; tests only read them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ("tests.time_budget",)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="also run tests marked slow (full-size demo checks)")
    threads = os.environ.get("TEST_TORCH_THREADS")
    parser.addoption(
        "--torch-threads",
        type=int,
        default=int(threads) if threads else None,
        help="torch intra-op threads for every test (default: 1 in an xdist worker, torch's own otherwise)",
    )


def torch_threads(config: pytest.Config) -> int | None:
    """The thread count the session runs with: `--torch-threads`, else 1 in an xdist worker, else None (torch's)."""
    explicit = config.getoption("--torch-threads")
    if explicit is not None:
        return explicit
    return 1 if os.environ.get("PYTEST_XDIST_WORKER") else None


def pytest_sessionstart(session: pytest.Session) -> None:
    n = torch_threads(session.config)
    if n is None:
        return
    if n < 1:
        raise pytest.UsageError(f"--torch-threads must be >= 1, got {n}")
    import torch

    torch.set_num_threads(n)
    os.environ["OMP_NUM_THREADS"] = str(n)  # processes a test starts without its own setting


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
