"""Shared pytest options. Heavier checks are opt-in, never silently skipped: without their flag they are deselected,
pytest reports them as deselected, not passed, and the summary names the command that runs them. A test named on
the command line by its node id (`pytest path::test`) runs without the flag.
- `slow` (--run-slow, `make test-slow`): full-size demo checks, the offline install.
- `bench_smoke` (--run-bench-smoke, `make test-bench`, which CI runs after `make test`): the smoke runs of the
  benchmark scripts that start several processes each (every case of bench_pipeline, bench_data, bench_startup, ...
  in its own interpreter); the lighter scripts' smoke runs stay in `make test`.

`--torch-threads N` (or TEST_TORCH_THREADS=N): torch's intra-op threads in every test process, and OMP_NUM_THREADS for
the processes tests start unless a test sets its own. Default: 1 in a pytest-xdist worker (`make test` runs one worker
per core), torch's own otherwise. The suite passes with 1 and with 2 (`make test TORCH_THREADS=2`): a verdict on a
float figure must not depend on the thread count. The `one_thread` fixture (tiny matmuls) follows an explicit
`--torch-threads`.

Every test has a CPU budget and a stall watchdog (tests/time_budget.py).

`models`: the tiny demo models (real Llama/MusicGen classes, `adapter_trainer.demo.models`), built once per session
for the trainer and generation tests; tests only read them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# as both packages do on import (their __init__.py): OpenMP threads wait passively, set before anything imports torch
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytest_plugins = ("tests.time_budget",)


# marker -> (its flag, what it holds, the command that runs it)
OPT_IN = {
    "slow": ("--run-slow", "heavier check: full-size demo checks, the offline install", "make test-slow"),
    "multiprocess": (
        "--run-multiprocess",
        "a run of several processes: torchrun ranks, nodes, spawned DataLoader workers",
        "make test-multiprocess",
    ),
    "bench_smoke": (
        "--run-bench-smoke",
        "smoke run of a benchmark script that starts several processes",
        "make test-bench",
    ),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    for marker, (flag, what, _) in OPT_IN.items():
        parser.addoption(flag, action="store_true", help=f"also run the tests marked {marker} ({what})")
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
    for marker, (flag, what, command) in OPT_IN.items():
        config.addinivalue_line("markers", f"{marker}: {what}; runs only with {flag} ({command})")
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_FromWorkers(config), "opt_in_from_workers")


def _named(item: pytest.Item, args: list[str]) -> bool:
    """Whether the command line names this test itself (`path::test`, `path::test[param]`): then it runs."""
    path, _, name = item.nodeid.partition("::")
    for a in args:
        a_path, sep, a_name = a.partition("::")
        same_file = sep and a_name and Path(a_path).resolve() == (item.config.rootpath / path).resolve()
        if same_file and (name == a_name or name.startswith((f"{a_name}[", f"{a_name}::"))):
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    off = [m for m, (flag, _, _) in OPT_IN.items() if not config.getoption(flag)]
    dropped = {m: [i for i in items if m in i.keywords and not _named(i, config.args)] for m in off}
    out = {id(i) for group in dropped.values() for i in group}
    if out:
        config.hook.pytest_deselected(items=[i for i in items if id(i) in out])
        items[:] = [i for i in items if id(i) not in out]
    left = {m: len(group) for m, group in dropped.items() if group}
    config.stash[_OPT_IN_LEFT] = left
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker: its controller prints the summary
        config.workeroutput["opt_in_left"] = left


_OPT_IN_LEFT = pytest.StashKey[dict]()


class _FromWorkers:
    """pytest-xdist's controller collects nothing itself: it takes the groups left out from its workers (each worker
    collects the whole suite, so any one of them has the counts)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl
    def pytest_testnodedown(self, node, error) -> None:
        left = getattr(node, "workeroutput", {}).get("opt_in_left")
        if left:
            self.config.stash[_OPT_IN_LEFT] = left


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """One line per opt-in group left out of this run: how many, and the command that runs them."""
    for marker, n in config.stash.get(_OPT_IN_LEFT, {}).items():
        flag, _, command = OPT_IN[marker]
        terminalreporter.write_line(f"{n} test(s) marked {marker} deselected: {command} (or {flag}) runs them")


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from adapter_trainer.demo.models import write_demo_models

    return write_demo_models(tmp_path_factory.mktemp("models"), seed=0)
