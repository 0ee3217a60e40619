"""DataLoader workers end with the loop that started them, on every way out of it.

A training batch worker ignores SIGINT and SIGTERM: a terminal's Ctrl-C and a job scheduler's SIGTERM reach every
process of the job, and the training process decides (it finishes its step and checkpoints: training.interrupt).
So the usual ways of ending a child do not end it: at exit, multiprocessing sends SIGTERM to its daemonic children
and then waits for them, for ever. What ends them instead:

- `closing_workers(batches)`: the loop's iterator is shut down when the loop is left. At its end, torch's own
  shutdown (each worker is told to leave and joined), then SIGKILL for a worker still alive (one blocked in a read
  or a download), also when that shutdown is itself interrupted; left by an exception (an error, an interrupt),
  SIGKILL at once (torch's shutdown waits 5 s for each stuck worker in turn), and then only this process's side is
  closed (torch's shutdown would take locks a killed worker may have held). Nothing a worker holds outlives it:
  its file locks are released with it and the shard cache reclaims a dead process's partial download.
- an exit hook that runs before multiprocessing's: every iterator still alive is ended the same way, at once;
- `end_with_parent()` in each worker: on Linux the kernel sends it SIGKILL when its parent dies (a parent killed by
  the OOM killer or by torchrun's SIGKILL runs no exit hook); elsewhere DataLoader's own watchdog ends an idle worker
  within seconds of its parent.

DataLoader has no public close: this module uses its iterator's `_workers` and `_shutdown_workers` (what the
iterator's `__del__` calls) and the parts of it that are this process's alone (the pin-memory thread, the queues),
and stops torch's SIGCHLD watch of workers it kills (`_remove_worker_pids`: torch would otherwise raise in this
process for a worker killed by a signal).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
JOIN_S = 5.0  # how long a killed worker, or the pin-memory thread, is waited for
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
# iterators with workers, not yet shut down -> the pid of the process that started them (a forked child inherits
# this table: its exit hook must not kill its parent's workers)
_live: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def start_workers(loader: Iterable[T]) -> Iterator[T]:
    """`iter(loader)`, remembered until `shut_down` so that the exit hook can end its workers. Workers started by
    an `iter` that raised (a Ctrl-C while they start) are killed before the exception goes on."""
    before = set(multiprocessing.active_children())
    try:
        batches = iter(loader)
    except BaseException:
        _kill([p for p in multiprocessing.active_children() if p not in before])
        raise
    if getattr(batches, "_workers", None):
        _live[batches] = os.getpid()
    return batches


def shut_down(batches: Iterator[Any], *, at_once: bool = False) -> None:
    """End an iterator's workers now. Without at_once: torch's shutdown (it also stops the pin-memory thread and
    closes the queues), then SIGKILL for those still alive, whose SIGTERM torch sent is ignored. at_once: SIGKILL
    first, then close this process's side. Whatever happens meanwhile (a second Ctrl-C in torch's joins), every
    worker is dead when it returns or raises. A no-op for an iterator without workers."""
    workers = list(getattr(batches, "_workers", ()))
    if not workers:
        return
    try:
        if not at_once:
            batches._shutdown_workers()  # type: ignore[attr-defined]  # a no-op once torch shut it down itself
    finally:
        _unwatch(batches)
        _kill(workers)
        if at_once:
            _close_own_side(batches)
        _live.pop(batches, None)


def _unwatch(batches: Iterator[Any]) -> None:
    """Stop torch's SIGCHLD watch of this iterator's workers, which raises in this process for one killed by a signal."""
    from torch.utils.data._utils import signal_handling

    if getattr(batches, "_worker_pids_set", False):
        signal_handling._remove_worker_pids(id(batches))
        batches._worker_pids_set = False  # type: ignore[attr-defined]


def _kill(workers: list[Any]) -> None:
    for w in workers:
        if w.is_alive():
            w.kill()
    for w in workers:
        w.join(timeout=JOIN_S)


def _close_own_side(batches: Any) -> None:
    """After its workers were killed: stop the pin-memory thread (a local event; it polls it) and close the queues
    without waiting on their feeder threads, and mark the iterator shut down so that its `__del__` does not run
    torch's shutdown (whose cross-process event a killed worker may have held)."""
    batches._shutdown = True
    thread = getattr(batches, "_pin_memory_thread", None)
    if thread is not None:
        batches._pin_memory_thread_done_event.set()
        thread.join(timeout=JOIN_S)
    for q in [*getattr(batches, "_index_queues", ()), getattr(batches, "_worker_result_queue", None)]:
        if q is not None:
            q.cancel_join_thread()
            q.close()


@contextlib.contextmanager
def closing_workers(batches: Iterator[T]) -> Iterator[Iterator[T]]:
    """`with closing_workers(start_workers(loader)) as batches:` the workers end when the block is left (at once when
    it is left by an exception: an error, an interrupt)."""
    try:
        yield batches
    except BaseException:
        shut_down(batches, at_once=True)
        raise
    shut_down(batches)


def _shut_down_live() -> None:
    for batches, owner in list(_live.items()):
        if owner == os.getpid():
            shut_down(batches, at_once=True)


atexit.register(_shut_down_live)


def end_with_parent() -> None:
    """In a worker, on Linux: SIGKILL when its parent dies (PR_SET_PDEATHSIG). The parent is the process that made
    the loader (fork, spawn) or a forkserver, which ends with that process. A parent already gone by the request
    ends the worker now. Elsewhere DataLoader's watchdog remains: it ends an idle worker within seconds."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # died between the two calls: no signal will come
        os._exit(1)
