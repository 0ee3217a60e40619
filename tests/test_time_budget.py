"""The per-test time budget (tests/time_budget.py) on generated tests, in a pytest process of their own: an over-budget
call or setup fails naming the fix, a `budget` marker with a reason lifts it, a marker without a reason is refused
at collection, and --budget-scale stretches it (0: off)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import REPO

GENERATED = """
import time

import pytest


@pytest.fixture()
def slow_fixture():
    time.sleep(0.6)


def test_quick():
    pass


def test_slow_call():
    time.sleep(0.6)


def test_slow_setup(slow_fixture):
    pass


@pytest.mark.budget(5, reason="sleeps on purpose")
def test_slow_with_budget():
    time.sleep(0.6)


def test_failing_stays_a_plain_failure():
    time.sleep(0.6)
    assert False, "its own failure"
"""


def run_pytest(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_generated.py").write_text(source, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("TEST_BUDGET_SCALE", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.time_budget", "-p", "no:cacheprovider", "-q", "-rf"]
    cmd += ["-o", "addopts=", "--rootdir", str(tmp_path), *args, str(tmp_path)]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _patched_default(seconds: float) -> str:
    return f"import tests.time_budget as tb\ntb.DEFAULT_BUDGET_S = {seconds}\n"


def test_a_test_over_its_budget_fails_naming_the_fix(tmp_path: Path) -> None:
    r = run_pytest(tmp_path, _patched_default(0.3) + GENERATED)
    out = r.stdout
    assert r.returncode == 1, out
    assert "2 failed, 2 passed, 1 error" in out, out  # an over-budget setup is an error, as any setup failure
    assert "test_slow_call: call took" in out and "over its time budget of 0.3 s" in out, out
    assert "test_slow_setup: setup took" in out, out
    assert "@pytest.mark.budget(seconds, reason='...')" in out, out
    assert "its own failure" in out  # a test that failed anyway keeps its own report


def test_the_scale_stretches_every_budget_and_zero_turns_it_off(tmp_path: Path) -> None:
    stretched = run_pytest(tmp_path, _patched_default(0.3) + GENERATED, "--budget-scale", "10")
    assert "1 failed, 4 passed" in stretched.stdout, stretched.stdout
    off = run_pytest(tmp_path, _patched_default(0.3) + GENERATED, "--budget-scale", "0")
    assert "1 failed, 4 passed" in off.stdout, off.stdout


def test_a_budget_marker_without_a_reason_is_refused_at_collection(tmp_path: Path) -> None:
    source = "import pytest\n\n@pytest.mark.budget(60)\ndef test_x():\n    pass\n"
    r = run_pytest(tmp_path, source)
    assert r.returncode != 0 and "passed" not in r.stdout.splitlines()[-1], r.stdout
    assert "reason='why this test needs more than" in r.stdout + r.stderr, r.stdout + r.stderr
