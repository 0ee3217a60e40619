"""Commands run to their end under a liveness guard, not a wall-clock timeout: a busy machine slows a run down, it
does not stop it making progress.

`run_live(cmd)` runs a command (in a session of its own) capturing its output, and fails the test as stalled only
when the run has neither printed a line nor spent `IDLE_CPU_S` CPU seconds in `IDLE_S` seconds (the hangs this
guards against wait at 0% CPU for ever; a poller such as torchrun's agent, watching ranks that hang, spends less), or
when it is still going after `LIMIT_S` (a generous cap on a run that spins). A stalled run is killed, every process
of it, before the test fails naming the stall and the run's output.

`run_to_end(cmd)` is `run_live` plus a check that every process the run started is gone afterwards. The run's
environment carries a token (`TOKEN_VAR`) that every process it starts inherits: torchrun's ranks (each in its own
session), their DataLoader workers, a forked child. After the command exits, a process of this machine whose
environment holds the token is a survivor: the test fails naming its pid and command line (after killing it). A
process that drops the token from its environment (one started with an `env=` of its own), or whose environment
cannot be read, is not seen: the runs tested here start none. Linux only (/proc).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.time_budget import IDLE_CPU_S, descendants

TOKEN_VAR = "RUN_END_TOKEN"
IDLE_S = 60.0
LIMIT_S = 1800.0
POLL_S = 0.5
GONE_S = 5.0  # after the command exits: how long its processes may take to disappear (a kill in flight)
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Ended:
    """How a run ended: exit status, output, and the seconds from its final line to its exit (None: not printed)."""

    returncode: int
    stdout: str
    stderr: str
    exit_after_end_line_s: float | None


def processes_with(token: str) -> dict[int, str]:
    """pid -> command line of every live process whose environment holds `TOKEN_VAR=token` (zombies excluded)."""
    mark = f"{TOKEN_VAR}={token}".encode()
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if mark not in (d / "environ").read_bytes().split(b"\0"):
                continue
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            found[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return found


def cpu_seconds(pids) -> dict[int, float]:
    """pid -> user + system CPU seconds it spent so far, for those of `pids` still alive."""
    found = {}
    for pid in pids:
        with contextlib.suppress(OSError):  # gone meanwhile
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            found[pid] = (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime (fields 14, 15 of proc(5))
    return found


def _kill(pids) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run_live(
    cmd: list[str],
    *,
    idle_s: float = IDLE_S,
    limit_s: float = LIMIT_S,
    end_line: str | None = None,
    processes: Callable[[int], dict[int, float]] | None = None,
    signal_when: tuple[Callable[[], bool], int] | None = None,
    signal_group: bool = True,
    **popen,
) -> Ended:
    """Run `cmd` to its end (see the module docstring), as `subprocess.run(cmd, capture_output=True, text=True,
    **popen)` would, with a liveness guard instead of a timeout. end_line: a regex searched in each line of output;
    the first match is timed. processes(pid): the run's live processes -> the CPU seconds each spent so far (default:
    the command and its descendants). signal_when: (condition, signal) sends that signal once to the command's process group (its
    own session: a terminal's foreground job) when condition() is true; with signal_group=False to the command's
    process alone. A test that fails meanwhile (its own stall watchdog) kills the run first."""
    proc = subprocess.Popen(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            **popen)  # fmt: skip
    out: dict[str, list[str]] = {"stdout": [], "stderr": []}
    seen: list[float] = []
    pattern = re.compile(end_line) if end_line else None

    def read(name: str, stream) -> None:
        for line in stream:
            out[name].append(line)
            if pattern is not None and not seen and pattern.search(line):
                seen.append(time.monotonic())

    def live() -> dict[int, float]:
        return processes(proc.pid) if processes is not None else {**cpu_seconds([proc.pid]), **descendants(proc.pid)}

    readers = [threading.Thread(target=read, args=(n, getattr(proc, n)), daemon=True) for n in out]
    for t in readers:
        t.start()
    start = time.monotonic()
    used, last = 0.0, {}  # CPU the run spent (the sum of each process's increase: one that ends takes none away)
    mark = (-IDLE_CPU_S, 0, start)  # (CPU, lines of output, when the run got there)
    problem = None
    try:
        while proc.poll() is None:
            time.sleep(POLL_S)
            now, lines, cpu = time.monotonic(), len(out["stdout"]) + len(out["stderr"]), live()
            used += sum(max(0.0, c - last.get(pid, 0.0)) for pid, c in cpu.items())
            last = cpu
            if signal_when is not None and signal_when[0]():
                (os.killpg if signal_group else os.kill)(proc.pid, signal_when[1])
                signal_when = None
            if used - mark[0] >= IDLE_CPU_S or lines != mark[1]:
                mark = (used, lines, now)
            if now - mark[2] > idle_s:
                problem = f"stalled: no output and {used - mark[0]:.2f} CPU s in {now - mark[2]:.0f} s"
            elif now - start > limit_s:
                problem = f"stalled: still running after {limit_s:g} s"
            if problem:
                break
    finally:
        exited_at = time.monotonic()
        if proc.poll() is None:
            _kill([*descendants(proc.pid), proc.pid])
            proc.wait(timeout=30)
        for t in readers:
            t.join(timeout=30)
    stdout, stderr = "".join(out["stdout"]), "".join(out["stderr"])
    if problem:
        pytest.fail(f"{' '.join(cmd[:6])} ...: {problem} (killed)\n--- stdout\n{stdout[-2000:]}\n--- stderr\n"
                    f"{stderr[-4000:]}")  # fmt: skip
    return Ended(proc.returncode, stdout, stderr, exited_at - seen[0] if seen else None)


def run_to_end(cmd: list[str], *, env: dict[str, str], cwd: Path | str, **live) -> Ended:
    """`run_live(cmd, **live)` watching every process that holds the run's token, then failing naming any that
    outlived the command (module docstring)."""
    token = uuid.uuid4().hex
    try:
        ended = run_live(cmd, env={**env, TOKEN_VAR: token}, cwd=cwd, processes=lambda _: cpu_seconds(processes_with(token)),
                         **live)  # fmt: skip
        deadline = time.monotonic() + GONE_S
        while processes_with(token) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        survivors = processes_with(token)
        _kill(survivors)
    if survivors:
        named = "\n".join(f"  pid {pid}: {line[:300]}" for pid, line in sorted(survivors.items()))
        pytest.fail(f"the run exited ({ended.returncode}) but left {len(survivors)} process(es) behind:\n{named}\n"
                    f"--- stdout\n{ended.stdout[-2000:]}\n--- stderr\n{ended.stderr[-4000:]}")  # fmt: skip
    return ended
