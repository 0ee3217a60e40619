"""The per-test CPU budget and stall watchdog (tests/time_budget.py) on generated tests, in a pytest process of their
own: a call, a setup or a subprocess over its CPU budget fails naming the fix, a `budget` marker with a reason lifts
it, a marker without a reason is refused at collection, --budget-scale stretches it (0: off); a stall with no CPU
and one past 10x its budget fail naming the test and what it waits on, and the session goes on; a test that waits
with little CPU, or whose wall time a busy core inflates past its budget, passes; the summary lists CPU seconds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import REPO
from tests.run_end import run_live

BURN = """
import subprocess
import sys
import time

import pytest


def burn(cpu_s):
    end = time.process_time() + cpu_s
    while time.process_time() < end:
        pass
"""

OVER_BUDGET = """
@pytest.fixture()
def busy_fixture():
    burn(0.6)


def test_quick():
    pass


def test_busy_call():
    burn(0.6)


def test_busy_setup(busy_fixture):
    pass


def test_busy_subprocess():
    subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 0.8\\nwhile time.process_time() < end: pass"], check=True)


@pytest.mark.budget(5, reason="burns on purpose")
def test_busy_with_budget():
    burn(0.6)


def test_failing_stays_a_plain_failure():
    burn(0.6)
    assert False, "its own failure"
"""

UNDER_LOAD = """
import os


def test_waits_with_little_cpu():
    time.sleep(2.0)  # 4x its budget in wall seconds, under the 10x of a stall


def test_on_a_busy_core():
    os.sched_setaffinity(0, {int(os.environ["BUSY_CORE"])})  # shares the core with 3 busy loops (not its children)
    open(os.environ["BUSY_GO"], "w").close()
    time.sleep(0.5)  # the loops see the file
    start = time.monotonic()
    burn(0.25)
    wall = time.monotonic() - start
    open(os.environ["BUSY_STOP"], "w").close()
    assert wall > 0.5  # the busy core inflated its wall time past its budget
"""

STALLS = """
@pytest.mark.budget(5, reason="waits on purpose")
def test_stalls_with_no_cpu():
    time.sleep(60)


@pytest.mark.budget(5, reason="waits on purpose")
def test_stalls_waiting_on_a_child():
    subprocess.run(["sleep", "60"])


def test_spins_past_ten_times_its_budget():
    burn(60)


def test_after_the_stalls():
    pass
"""


def run_pytest(tmp_path: Path, source: str, *args: str, env: dict[str, str] | None = None):
    (tmp_path / "test_generated.py").write_text(source, encoding="utf-8")
    env = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("TEST_BUDGET_SCALE", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.time_budget", "-p", "no:cacheprovider", "-q", "-rf"]
    cmd += ["-o", "addopts=", "--rootdir", str(tmp_path), *args, str(tmp_path)]
    return run_live(cmd, cwd=tmp_path, env=env)


def _patched(**constants: float) -> str:
    return "import tests.time_budget as tb\n" + "".join(f"tb.{k} = {v}\n" for k, v in constants.items()) + BURN


def test_a_test_over_its_cpu_budget_fails_naming_the_fix(tmp_path: Path) -> None:
    r = run_pytest(tmp_path, _patched(DEFAULT_BUDGET_S=0.3) + OVER_BUDGET)
    out = r.stdout
    assert r.returncode == 1, out
    assert "3 failed, 2 passed, 1 error" in out, out  # an over-budget setup is an error, as any setup failure
    assert "test_busy_call: call spent" in out and "over its budget of 0.3 CPU s" in out, out
    assert "test_busy_setup: setup spent" in out, out
    assert "test_busy_subprocess: call spent" in out, out  # a child's CPU counts
    assert "@pytest.mark.budget(seconds, reason='...')" in out, out
    assert "its own failure" in out  # a test that failed anyway keeps its own report


def test_the_scale_stretches_every_budget_and_zero_turns_it_off(tmp_path: Path) -> None:
    stretched = run_pytest(tmp_path, _patched(DEFAULT_BUDGET_S=0.3) + OVER_BUDGET, "--budget-scale", "10")
    assert "1 failed, 5 passed" in stretched.stdout, stretched.stdout
    off = run_pytest(tmp_path, _patched(DEFAULT_BUDGET_S=0.3) + OVER_BUDGET, "--budget-scale", "0")
    assert "1 failed, 5 passed" in off.stdout, off.stdout


def test_waiting_or_a_busy_core_does_not_fail_a_test_and_the_summary_lists_cpu(tmp_path: Path) -> None:
    core, go, stop = min(os.sched_getaffinity(0)), tmp_path / "go", tmp_path / "stop"
    spin = (f"import os, time\nos.sched_setaffinity(0, {{{core}}})\nwhile not os.path.exists({str(go)!r}): "
            f"time.sleep(0.02)\nend = time.monotonic() + 20\nwhile not os.path.exists({str(stop)!r}) and "
            f"time.monotonic() < end: pass")  # fmt: skip
    # each in a session of its own: the scheduler shares a core fairly between sessions (autogroups)
    loops = [subprocess.Popen([sys.executable, "-c", spin], start_new_session=True) for _ in range(3)]
    env = {"BUSY_CORE": str(core), "BUSY_GO": str(go), "BUSY_STOP": str(stop)}
    try:
        r = run_pytest(tmp_path, _patched(DEFAULT_BUDGET_S=0.5) + UNDER_LOAD, env=env)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    assert "2 passed" in r.stdout, r.stdout
    summary = r.stdout.split("slowest 15 CPU durations", 1)[1]
    assert "call     test_generated.py::test_on_a_busy_core" in summary, r.stdout
    assert "call     test_generated.py::test_waits_with_little_cpu" in summary, r.stdout


def test_a_stall_fails_naming_the_test_and_what_it_waits_on_and_the_session_goes_on(tmp_path: Path) -> None:
    r = run_pytest(tmp_path, _patched(DEFAULT_BUDGET_S=0.3, IDLE_S=2, IDLE_CPU_S=0.1, POLL_S=0.2, GRACE_S=5) + STALLS)
    out = r.stdout
    assert "3 failed, 1 passed" in out, out
    assert "test_stalls_with_no_cpu: call stalled: spent 0.0" in out and "in the last 2 s" in out, out
    assert "waits at " in out and "in test_stalls_with_no_cpu" in out, out
    assert "test_stalls_waiting_on_a_child: call stalled" in out and "sleep 60" in out, out  # the process it waits on
    assert "test_spins_past_ten_times_its_budget: call stalled: ran 3 s wall, 10 x its budget" in out, out


def test_a_test_that_swallows_its_stall_ends_its_worker_saying_why(tmp_path: Path) -> None:
    source = "def test_swallows():\n    while True:\n        try:\n            time.sleep(60)\n"
    source += "        except BaseException:\n            pass\n"
    r = run_pytest(tmp_path, _patched(IDLE_S=1, POLL_S=0.2, GRACE_S=0.5) + source)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "test_swallows: call stalled" in r.stderr and "did not end on its failure" in r.stderr, r.stderr
    assert "in test_swallows" in r.stderr, r.stderr  # every thread's stack


def test_a_budget_marker_without_a_reason_is_refused_at_collection(tmp_path: Path) -> None:
    source = "import pytest\n\n@pytest.mark.budget(60)\ndef test_x():\n    pass\n"
    r = run_pytest(tmp_path, source)
    assert r.returncode != 0 and "passed" not in r.stdout.splitlines()[-1], r.stdout
    assert "reason='why this test needs more than" in r.stdout + r.stderr, r.stdout + r.stderr
