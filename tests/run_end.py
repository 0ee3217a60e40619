"""A command run to its end, with every process it started checked gone afterwards.

The run's environment carries a token (`TOKEN_VAR`) that every process it starts inherits: torchrun's ranks (each
in its own session), their DataLoader workers, a forked child. After the command exits, a process of this machine
whose environment holds the token is a survivor: the test fails naming its pid and command line (after killing it).

Stalls are judged by what the run does, not by wall time alone:
- once the run has printed its final line (`end_line`, e.g. its one-line error), it has `EXIT_S` seconds to be gone
  (it needs about one when the machine is quiet);
- at any time, a run whose processes all spent no CPU for `IDLE_S` seconds is stalled (the hang this guards
  against waits at 0% CPU for ever);
- a run still going after `LIMIT_S` is stalled, whatever it does (torchrun's agent polls its ranks: a job whose
  ranks hang still spends CPU).

A process that drops the token from its environment (one started with an `env=` of its own), or whose environment
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

TOKEN_VAR = "RUN_END_TOKEN"
EXIT_S = 60.0
IDLE_S = 60.0
LIMIT_S = 900.0
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


def cpu_seconds(pids: set[int] | dict[int, str]) -> float:
    """User + system CPU seconds the processes have spent so far (the live ones)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of proc(5))
    return total / _TICKS


def _kill_all(token: str) -> dict[int, str]:
    survivors = processes_with(token)
    for pid in survivors:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return survivors


def run_to_end(
    cmd: list[str],
    *,
    env: dict[str, str],
    cwd: Path | str,
    end_line: str | None = None,
    exit_s: float = EXIT_S,
    idle_s: float = IDLE_S,
    limit_s: float = LIMIT_S,
    signal_when: tuple[Callable[[], bool], int] | None = None,
    signal_group: bool = True,
) -> Ended:
    """Run `cmd` to its end (see the module docstring); fail naming any survivor. end_line: a regex searched in each
    line of output; the first match starts the `exit_s` clock. signal_when: (condition, signal) sends that signal
    once to the command's process group (its own session: a terminal's foreground job) when condition() is true;
    with signal_group=False to the command's process alone."""
    token = uuid.uuid4().hex
    proc = subprocess.Popen(
        cmd, cwd=cwd, env={**env, TOKEN_VAR: token}, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    out: dict[str, list[str]] = {"stdout": [], "stderr": []}
    seen: list[float] = []
    pattern = re.compile(end_line) if end_line else None

    def read(name: str, stream) -> None:
        for line in stream:
            out[name].append(line)
            if pattern is not None and not seen and pattern.search(line):
                seen.append(time.monotonic())

    readers = [threading.Thread(target=read, args=(n, getattr(proc, n)), daemon=True) for n in out]
    for t in readers:
        t.start()
    start = time.monotonic()
    last_cpu, last_change = -1.0, start
    problem = None
    while proc.poll() is None:
        time.sleep(0.5)
        now = time.monotonic()
        if signal_when is not None and signal_when[0]():
            (os.killpg if signal_group else os.kill)(proc.pid, signal_when[1])
            signal_when = None
        cpu = cpu_seconds(processes_with(token))
        if cpu != last_cpu:
            last_cpu, last_change = cpu, now
        if seen and now - seen[0] > exit_s:
            problem = f"still running {exit_s:g} s after its final line"
        elif now - last_change > idle_s:
            problem = f"stalled: no process of the run spent CPU for {idle_s:g} s"
        elif now - start > limit_s:
            problem = f"stalled: still running after {limit_s:g} s"
        if problem:
            break
    exited_at = time.monotonic()
    deadline = exited_at + GONE_S
    while processes_with(token) and time.monotonic() < deadline and problem is None:
        time.sleep(0.1)
    survivors = _kill_all(token)
    if proc.poll() is None:
        proc.wait(timeout=30)
    for t in readers:
        t.join(timeout=30)
    stdout, stderr = "".join(out["stdout"]), "".join(out["stderr"])
    tail = f"\n--- stdout\n{stdout[-2000:]}\n--- stderr\n{stderr[-4000:]}"
    if problem:
        pytest.fail(f"{' '.join(cmd[:6])} ...: {problem} (killed {len(survivors)} processes){tail}")
    if survivors:
        named = "\n".join(f"  pid {pid}: {line[:300]}" for pid, line in sorted(survivors.items()))
        pytest.fail(f"the run exited ({proc.returncode}) but left {len(survivors)} process(es) behind:\n{named}{tail}")
    return Ended(proc.returncode, stdout, stderr, exited_at - seen[0] if seen else None)
