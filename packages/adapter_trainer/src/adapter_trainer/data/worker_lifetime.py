"""DataLoader workers end with the loop that started them, on every way out of it.

Training workers ignore SIGINT and SIGTERM (the training process decides: training.interrupt), so multiprocessing's
exit (SIGTERM, then join for ever) would not end them. Instead: `closing_workers` shuts the iterator down when the
loop is left (torch's shutdown, then SIGKILL for a worker still alive; left by an exception, SIGKILL at once and only
this process's side closed, since torch's shutdown takes locks a killed worker may hold); an exit hook does the same
for any iterator still alive; and `end_with_parent()` asks Linux to SIGKILL a worker whose parent dies. DataLoader
has no public close: this uses its iterator's `_workers`, `_shutdown_workers` and `_remove_worker_pids`.
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
# live iterators -> the pid that started them (a forked child inherits this table and must not kill them)
_live: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def start_workers(loader: Iterable[T]) -> Iterator[T]:
    """`iter(loader)`, remembered for the exit hook; workers of an `iter` that raised are killed first."""
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
    """End an iterator's workers now: torch's shutdown then SIGKILL for those alive, or (at_once) SIGKILL then this
    process's side closed. Every worker is dead when it returns or raises."""
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
    """After a kill: stop the pin-memory thread, close the queues without joining their feeders, and mark the
    iterator shut down so its `__del__` skips torch's shutdown."""
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
    """`with closing_workers(start_workers(loader)) as batches:` the workers end with the block."""
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
    """In a worker on Linux: SIGKILL when its parent dies (PR_SET_PDEATHSIG); elsewhere DataLoader's watchdog."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # died between the two calls: no signal will come
        os._exit(1)
