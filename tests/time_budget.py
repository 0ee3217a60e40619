"""A CPU budget per test, so the default suite stays cheap, and a stall watchdog, so a hung test fails instead of
hiding in the suite's total. Neither depends on how busy the machine is.

- Cost: a test whose setup or call phase spends more than its budget in CPU seconds fails, naming its CPU, its
  wall time, the budget and the two ways out (make it cheaper, or give it a larger budget with a reason). What is
  counted: user + system CPU of the test's process (`RUSAGE_SELF`: all its threads, so a server thread it talks to
  counts; xdist runs one test at a time per worker), of its children it waited for (`RUSAGE_CHILDREN`: a finished
  subprocess, a joined DataLoader worker, torchrun's ranks through torchrun), and of its descendants still alive
  (read from /proc: their own CPU and that of the children they waited for). A process that leaves the tree
  without being waited for (reparented to init) is not counted. Linux; elsewhere only the first two count.
- Stall: a phase (setup, call or teardown) still running at `STALL_FACTOR` times its budget in wall seconds, or
  whose process and descendants spent less than `IDLE_CPU_S` CPU seconds in `IDLE_S` seconds (a lock that never
  opens, a download that never ends), is failed by a watchdog thread: it names the test, the phase, where the
  test's thread waits and the processes it waits on. The test's thread gets the failure as an exception (a
  signal interrupts a blocking wait); `GRACE_S` later, if the phase still runs, its descendants are killed; as a
  last resort the worker prints the failure and every thread's stack to stderr and exits (xdist then reports the
  test as crashed).
- `@pytest.mark.budget(seconds, reason="...")` gives one test (or a module, via `pytestmark`) a larger budget than
  `DEFAULT_BUDGET_S`; the reason is required, so every costly test says why it is costly.
- `--budget-scale X` (or `TEST_BUDGET_SCALE=X`) multiplies every budget (and so the stall's wall limit);
  `--budget-scale 0` turns the verdicts and the watchdog off. The closing summary lists the `SLOWEST` phases by
  CPU seconds beside pytest's `--durations` (wall), whatever the scale.

Loaded by tests/conftest.py (`pytest_plugins`); tests/test_time_budget.py runs it on generated tests.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import resource
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DEFAULT_BUDGET_S = 30.0
STALL_FACTOR = 10.0
IDLE_S = 60.0
IDLE_CPU_S = 1.0  # less CPU than this in IDLE_S is none: the watchdog's own polls, torchrun's agent polling its ranks
GRACE_S = 15.0  # after the failure is raised: how long the phase may take to end before its descendants are killed
POLL_S = 1.0
SLOWEST = 15
STALL_SIGNAL = signal.SIGUSR2
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_CPU = pytest.StashKey[dict]()
# bound now: tests monkeypatch the modules' own (a fake clock, a no-op sleep, a fake getrusage or getpid)
_getrusage, _monotonic, _sleep, _getpid = resource.getrusage, time.monotonic, time.sleep, os.getpid


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--budget-scale",
        type=float,
        default=float(os.environ.get("TEST_BUDGET_SCALE", "1")),
        help="multiply every test's CPU budget and stall limit (default 1, or TEST_BUDGET_SCALE; 0 turns them off)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"budget(seconds, reason): this test's setup and call may each spend up to `seconds` CPU seconds "
        f"(default {DEFAULT_BUDGET_S:g}); the reason says why it needs more",
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Checks every marker, then runs the modules with the largest budgets first, each module's tests together and
    in order: xdist's workers then end on cheap tests instead of one waiting for the other's long last test."""
    weight: dict[str, float] = {}
    for item in items:  # a malformed marker is a collection error, not a surprise at the end of a long test
        weight[item.location[0]] = max(weight.get(item.location[0], 0.0), budget_of(item))
    items.sort(key=lambda item: -weight[item.location[0]])  # stable: the same order in every worker


def budget_of(item: pytest.Item) -> float:
    """The test's budget in CPU seconds (unscaled): its closest `budget` marker, or DEFAULT_BUDGET_S."""
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


def descendants(pid: int) -> dict[int, float]:
    """Every live descendant of `pid` -> its CPU seconds: its own and its waited-for children's (utime, stime,
    cutime, cstime: fields 14-17 of proc(5)). Empty where /proc is not there."""
    found: dict[int, float] = {}
    todo = [pid]
    while todo:
        for task in _listdir(Path(f"/proc/{todo.pop()}/task")):
            for child in _read(task / "children").split():
                fields = _read(Path(f"/proc/{child}/stat")).rsplit(")", 1)[-1].split()
                if len(fields) > 14 and int(child) not in found:
                    found[int(child)] = sum(int(f) for f in fields[11:15]) / _TICKS
                    todo.append(int(child))
    return found


def _listdir(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:  # the process ended meanwhile
        return []


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # the process ended meanwhile
        return ""


def _rusage_s(who: int) -> float:
    r = _getrusage(who)
    return r.ru_utime + r.ru_stime


@dataclass
class Phase:
    """One phase of one test, measured from its start (see the module docstring for what counts)."""

    nodeid: str
    when: str
    wall_limit_s: float  # 0: no watchdog
    start: float = field(default_factory=_monotonic)
    self0: float = field(default_factory=lambda: _rusage_s(resource.RUSAGE_SELF))
    children0: float = field(default_factory=lambda: _rusage_s(resource.RUSAGE_CHILDREN))
    live0: dict[int, float] = field(default_factory=lambda: descendants(_getpid()))
    stall: str | None = None  # the failure the watchdog raised in this phase
    ended: threading.Event = field(default_factory=threading.Event)

    def cpu_s(self) -> float:
        live = descendants(_getpid())
        return (
            _rusage_s(resource.RUSAGE_SELF) - self.self0
            + _rusage_s(resource.RUSAGE_CHILDREN) - self.children0
            + sum(cpu - self.live0.get(pid, 0.0) for pid, cpu in live.items())
            - sum(cpu for pid, cpu in self.live0.items() if pid not in live)  # waited for since: in children
        )  # fmt: skip


class Watchdog:
    """A daemon thread of the test process that fails the phase it watches when it stalls (module docstring). No
    lock: `phase` is set and cleared by the test's thread alone, and the signal handler runs on that thread."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.phase: Phase | None = None
        self.main = threading.main_thread().ident
        signal.signal(STALL_SIGNAL, self._raise)
        threading.Thread(target=self._watch, name="time-budget-watchdog", daemon=True).start()

    def begin(self, phase: Phase) -> None:
        self.phase = phase

    def end(self, phase: Phase) -> None:
        self.phase = None
        phase.ended.set()

    def _raise(self, signum: int, frame) -> None:
        phase = self.phase
        if phase is not None and phase.stall is not None:
            pytest.fail(phase.stall, pytrace=True)

    def _watch(self) -> None:
        mark: tuple[Phase | None, float, float] = (None, 0.0, 0.0)  # (phase, its CPU, when it got there)
        while True:
            _sleep(POLL_S)
            phase = self.phase
            if phase is None or phase.wall_limit_s <= 0:
                continue
            now, cpu = _monotonic(), phase.cpu_s()
            if mark[0] is not phase or cpu - mark[1] >= IDLE_CPU_S:
                mark = (phase, cpu, now)
            wall = now - phase.start
            if wall >= phase.wall_limit_s:
                self._fail(phase, f"ran {wall:.0f} s wall, {STALL_FACTOR:g} x its budget, spending {cpu:.1f} CPU s")
            elif now - mark[2] >= IDLE_S:
                self._fail(phase, f"spent {cpu - mark[1]:.2f} CPU s in the last {now - mark[2]:.0f} s")

    def _fail(self, phase: Phase, why: str) -> None:
        frame = sys._current_frames().get(self.main)
        where = f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}" if frame else "?"
        live = descendants(_getpid())
        waits = "".join(f"\n  pid {pid}: {_read(Path(f'/proc/{pid}/cmdline')).replace(chr(0), ' ').strip()[:200]}"
                        for pid in live)  # fmt: skip
        phase.stall = (
            f"{phase.nodeid}: {phase.when} stalled: {why}. Its thread waits at {where}; the processes it waits on: "
            f"{len(live) or 'none'}{waits}\nA test that waits for minutes on purpose needs a larger "
            f"@pytest.mark.budget(seconds, reason='...') or --budget-scale (TEST_BUDGET_SCALE)."
        )
        signal.pthread_kill(self.main, STALL_SIGNAL)
        if phase.ended.wait(GRACE_S):
            return
        for pid in live:
            with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                os.kill(pid, signal.SIGKILL)
        if phase.ended.wait(GRACE_S):
            return
        capture = self.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.suspend_global_capture()  # stderr is the terminal's again (xdist: the controller's)
        sys.__stderr__.write(f"\n{phase.stall}\nThe test did not end on its failure; its stacks:\n")
        faulthandler.dump_traceback(sys.__stderr__, all_threads=True)
        sys.__stderr__.flush()
        os._exit(3)


_watchdog: Watchdog | None = None


def _measured(item: pytest.Item, when: str):
    global _watchdog
    scale = item.config.getoption("--budget-scale")
    budget = (budget_of(item) if when != "teardown" else DEFAULT_BUDGET_S) * scale
    if scale > 0 and _watchdog is None:
        _watchdog = Watchdog(item.config)
    phase = Phase(item.nodeid, when, budget * STALL_FACTOR)
    if _watchdog is not None:
        _watchdog.begin(phase)
    try:
        return (yield)
    finally:
        if _watchdog is not None:
            _watchdog.end(phase)  # first: no stall failure is raised once the phase is left
        item.stash.setdefault(_CPU, {})[when] = phase.cpu_s()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    return (yield from _measured(item, "setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    return (yield from _measured(item, "call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    return (yield from _measured(item, "teardown"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    report.cpu_s = item.stash.get(_CPU, {}).get(call.when)  # travels to xdist's controller with the report
    scale = item.config.getoption("--budget-scale")
    if call.when not in ("setup", "call") or not report.passed or scale <= 0 or report.cpu_s is None:
        return report
    budget = budget_of(item) * scale
    if report.cpu_s > budget:
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid}: {call.when} spent {report.cpu_s:.1f} CPU s ({report.duration:.1f} s wall), over its "
            f"budget of {budget:.1f} CPU s. Make it cheaper (shared fixtures, fewer steps, smaller tensors), or "
            f"give it a larger budget with @pytest.mark.budget(seconds, reason='...')."
        )
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    cpu = getattr(report, "cpu_s", None)
    if cpu is not None:
        _costs.append((cpu, report.duration, report.when, report.nodeid))


_costs: list[tuple[float, float, str, str]] = []


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The SLOWEST phases by CPU seconds (pytest's --durations lists them by wall seconds)."""
    if not _costs:
        return
    terminalreporter.write_sep("=", f"slowest {SLOWEST} CPU durations")
    for cpu, wall, when, nodeid in sorted(_costs, reverse=True)[:SLOWEST]:
        terminalreporter.write_line(f"{cpu:8.2f}s cpu {wall:8.2f}s wall {when:<8} {nodeid}")
