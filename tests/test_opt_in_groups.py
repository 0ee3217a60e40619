"""The opt-in groups of tests/conftest.py: without its flag a group is deselected (never reported as passed) and the
summary names the command that runs it; with the flag it runs; the groups are independent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import REPO

GENERATED = """
import pytest


def test_plain():
    pass


@pytest.mark.slow
def test_full_size():
    pass


@pytest.mark.bench_smoke
def test_bench_script():
    pass
"""


def run_pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_generated.py").write_text(GENERATED, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q", "-o", "addopts="]
    cmd += ["--rootdir", str(tmp_path), *args, str(tmp_path)]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)


def test_a_group_left_out_is_deselected_and_named_with_its_command(tmp_path: Path) -> None:
    out = run_pytest(tmp_path).stdout
    assert "1 passed, 2 deselected" in out, out
    assert "1 test(s) marked slow deselected: make test-slow (or --run-slow) runs them" in out, out
    assert "1 test(s) marked bench_smoke deselected: make test-bench (or --run-bench-smoke) runs them" in out, out


def test_the_summary_names_the_groups_under_xdist_too(tmp_path: Path) -> None:
    """`make test` runs pytest-xdist workers: the controller, which collects nothing, still names what was left out."""
    out = run_pytest(tmp_path, "-n", "2").stdout
    assert "1 passed" in out and "1 test(s) marked bench_smoke deselected: make test-bench" in out, out


def test_a_test_named_by_its_node_id_runs_without_the_flag(tmp_path: Path) -> None:
    out = run_pytest(tmp_path, "-k", "bench_script or plain").stdout  # a -k selection alone does not name it
    assert "1 passed" in out and "marked bench_smoke deselected" in out, out
    (tmp_path / "test_generated.py").write_text(GENERATED, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-q", "-o", "addopts=",
           "--rootdir", str(tmp_path), f"{tmp_path / 'test_generated.py'}::test_bench_script"]  # fmt: skip
    named = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True).stdout
    assert "1 passed" in named and "deselected" not in named, named


def test_each_flag_runs_its_own_group(tmp_path: Path) -> None:
    bench = run_pytest(tmp_path, "--run-bench-smoke", "-m", "bench_smoke").stdout
    assert "1 passed, 2 deselected" in bench and "marked bench_smoke deselected" not in bench, bench
    both = run_pytest(tmp_path, "--run-bench-smoke", "--run-slow").stdout
    assert "3 passed" in both and "deselected" not in both, both
