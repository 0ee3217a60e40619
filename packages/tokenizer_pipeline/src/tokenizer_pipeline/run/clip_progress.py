"""Stage 1's progress, a clip at a time: a tqdm bar (clips, audio-s/s, ETA) on a terminal; on a log file or a pipe,
where a bar's carriage returns pile up into one line, a plain line every `interval_s` seconds and one at the end."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

LINE_EVERY_S = 30.0  # a non-terminal's progress line interval


class ClipProgress:
    """`update(audio_s)` per clip taken by the encoder; `close()` once. Shown only where `show` (rank 0)."""

    def __init__(
        self, total: int, desc: str, show: bool, stream: TextIO | None = None, interval_s: float | None = None
    ) -> None:
        self.total, self.desc = total, desc
        self.interval_s = LINE_EVERY_S if interval_s is None else interval_s
        self.stream = stream if stream is not None else sys.stderr
        self.done, self.audio_s = 0, 0.0
        self.t0 = self.last_line = time.monotonic()
        on_terminal = self.stream.isatty()
        self.bar = tqdm(total=total, unit="clip", desc=desc, disable=not (show and on_terminal), file=self.stream,
                        dynamic_ncols=True)  # fmt: skip
        self.lines = show and not on_terminal

    def rate(self) -> float:
        """Audio seconds encoded per wall second so far."""
        return self.audio_s / max(time.monotonic() - self.t0, 1e-9)

    def update(self, audio_s: float) -> None:
        self.done += 1
        self.audio_s += audio_s
        self.bar.update(1)
        self.bar.set_postfix_str(f"{self.rate():.1f} audio-s/s", refresh=False)
        if self.lines and time.monotonic() - self.last_line >= self.interval_s:
            self._line()

    def _line(self) -> None:
        self.last_line = time.monotonic()
        left = self.total - self.done
        eta = left * (self.last_line - self.t0) / self.done if self.done else float("nan")
        print(
            f"{self.desc}: {self.done}/{self.total} clips ({self.done / max(self.total, 1):.0%}), "
            f"{self.rate():.1f} audio-s/s, {eta:.0f} s left",
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        self.bar.close()
        if self.lines and self.done:
            self._line()
