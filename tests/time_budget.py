"""A time budget per test, so the default suite stays fast: a test whose setup or call phase runs longer than its
budget fails, naming its time, the budget and the two ways out (make it cheaper, or give it a larger budget with a
reason). A stalled test (a process waiting on a lock, a download that never ends) fails the same way instead of
hiding in the suite's total.

- The budget is `DEFAULT_BUDGET_S` wall seconds for each phase (setup: the fixtures a test is the first to build,
  such as a shared trained run; call: the test itself). Wall, not CPU: a stall spends no CPU.
- `@pytest.mark.budget(seconds, reason="...")` gives one test (or a module, via `pytestmark`) a larger budget; the
  reason is required, so every long test says why it is long.
- `--budget-scale X` (or `TEST_BUDGET_SCALE=X`) multiplies every budget: for a slower machine, or a run that
  oversubscribes the cores on purpose (`make test TORCH_THREADS=2`). `--budget-scale 0` turns the guard off.

Loaded by tests/conftest.py (`pytest_plugins`); tests/test_time_budget.py runs it on generated tests.
"""

from __future__ import annotations

import os

import pytest

DEFAULT_BUDGET_S = 30.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--budget-scale",
        type=float,
        default=float(os.environ.get("TEST_BUDGET_SCALE", "1")),
        help="multiply every test's time budget (default 1, or TEST_BUDGET_SCALE; 0 turns the guard off)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"budget(seconds, reason): this test's setup and call may each take up to `seconds` wall seconds "
        f"(default {DEFAULT_BUDGET_S:g}); the reason says why it needs more",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        budget_of(item)  # a malformed marker is a collection error, not a surprise at the end of a long test


def budget_of(item: pytest.Item) -> float:
    """The test's budget in seconds (unscaled): its closest `budget` marker, or DEFAULT_BUDGET_S."""
    marker = item.get_closest_marker("budget")
    if marker is None:
        return DEFAULT_BUDGET_S
    seconds = marker.args[0] if marker.args else marker.kwargs.get("seconds")
    reason = marker.kwargs.get("reason", "")
    if not isinstance(seconds, (int, float)) or seconds <= 0 or not str(reason).strip():
        raise pytest.UsageError(
            f"{item.nodeid}: write @pytest.mark.budget(SECONDS, reason='why this test needs more than "
            f"{DEFAULT_BUDGET_S:g} s'), got args={marker.args} kwargs={marker.kwargs}"
        )
    return float(seconds)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    scale = item.config.getoption("--budget-scale")
    if call.when not in ("setup", "call") or not report.passed or scale <= 0:
        return
    budget = budget_of(item) * scale
    if report.duration > budget:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid}: {call.when} took {report.duration:.1f} s, over its time budget of {budget:.1f} s. "
            f"Make it cheaper (shared fixtures, fewer steps, smaller tensors), or give it a larger budget with "
            f"@pytest.mark.budget(seconds, reason='...'); on a slower machine run with --budget-scale "
            f"(TEST_BUDGET_SCALE)."
        )
