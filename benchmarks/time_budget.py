"""A wall-clock budget for a benchmark's cases (bench_gpu.py's --budget-s): drop the largest sizes first.

The rule: cases run in increasing size within each group (e.g. training batch sizes with checkpointing off, another
group with it on). Before a case, its seconds are predicted from the cases of its group already measured: the larger
of (a) the last case scaled in proportion to size and (b) the straight line through the last two cases (fixed
overhead + seconds per unit of size). A case whose prediction exceeds what is left of the budget is dropped and
recorded (its prediction and the seconds left), so the largest sizes go first. The smallest case of a group has no
prediction and always runs: every group keeps at least one figure, and the budget can be overrun by those alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def predict_seconds(measured: list[tuple[float, float]], size: float) -> float | None:
    """Seconds for a case of `size` from the (size, seconds) of the cases measured so far (increasing sizes).

    None before any case. (a) proportional to the last case: conservative when part of it is fixed overhead;
    (b) the line through the last two: conservative when seconds grow faster than size.
    """
    if not measured:
        return None
    s1, t1 = measured[-1]
    guess = t1 * size / s1
    if len(measured) >= 2:
        s0, t0 = measured[-2]
        if s1 != s0:
            guess = max(guess, t1 + (t1 - t0) / (s1 - s0) * (size - s1))
    return guess


class Budget:
    """Runs cases while a wall-clock budget lasts; `dropped` records the cases it skipped.

    Args:
        seconds: the budget, counted from the Budget's creation (math.inf: no limit).
        clock: seconds now (time.perf_counter; a fake one in tests).
    """

    def __init__(self, seconds: float = math.inf, clock: Callable[[], float] = time.perf_counter) -> None:
        self.seconds, self.clock = seconds, clock
        self.start = clock()
        self.measured: dict[str, list[tuple[float, float]]] = {}  # group -> [(size, seconds)], increasing sizes
        self.dropped: list[dict] = []

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def run(self, group: str, size: float, fn: Callable[[], T], what: str = "") -> T | None:
        """fn() and its seconds recorded under `group`, or None (recorded in `dropped`) when the prediction from
        the group's earlier cases exceeds the seconds left."""
        predicted, left = predict_seconds(self.measured.get(group, []), size), self.left()
        if predicted is not None and predicted > left:
            what = what or f"{group} size {size}"
            self.dropped.append({"case": what, "group": group, "size": size, "predicted_s": predicted, "left_s": left})
            print(f"budget: dropped {what}: predicted {predicted:.1f} s, {left:.1f} s left")
            return None
        t0 = self.clock()
        out = fn()
        self.measured.setdefault(group, []).append((size, self.clock() - t0))
        return out

    def record(self) -> dict:
        """The JSON record: the budget, seconds used, every case's seconds and what was dropped."""
        return {
            "budget_s": None if math.isinf(self.seconds) else self.seconds,
            "elapsed_s": self.elapsed(),
            "measured": {g: [{"size": s, "seconds": t} for s, t in m] for g, m in self.measured.items()},
            "dropped": self.dropped,
        }
