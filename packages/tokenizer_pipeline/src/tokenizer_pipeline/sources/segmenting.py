"""Full-length tracks -> fixed-length segments, planned from the file's header (frames, sample rate) alone.

Segment i covers samples `[i * hop, i * hop + length)`; the first segment that would run past the end is the last one,
kept shorter when it holds at least `min_seconds` (audiocraft's `min_segment_ratio`: default 0.8 x seconds), else
dropped and counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError

MIN_SEGMENT_RATIO = 0.8  # default min_seconds / seconds (audiocraft's min_segment_ratio)


@dataclass(frozen=True)
class Segmentation:
    """The resolved `segment.*` settings (recorded in the manifest's `segmentation` object)."""

    seconds: float
    hop_seconds: float
    min_seconds: float

    @classmethod
    def from_config(cls, seconds: float, hop_seconds: float | None, min_seconds: float | None) -> Segmentation:
        """Fill the defaults (hop = seconds, min = 0.8 x seconds) and check the values; ConfigError names the key."""
        hop = seconds if hop_seconds is None else hop_seconds
        low = MIN_SEGMENT_RATIO * seconds if min_seconds is None else min_seconds
        for key, value in (("segment.seconds", seconds), ("segment.hop_seconds", hop)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(f"{key}={value} must be a finite number of seconds > 0")
        if not (math.isfinite(low) and 0 <= low <= seconds):
            raise ConfigError(f"segment.min_seconds={low} must be between 0 and segment.seconds={seconds}")
        return cls(float(seconds), float(hop), float(low))


@dataclass(frozen=True)
class Window:
    """One segment: samples [start, stop) of the file at its own rate `sample_rate`."""

    index: int  # segment index within the track, from 0
    start: int
    stop: int
    sample_rate: int

    @property
    def start_s(self) -> float:
        return self.start / self.sample_rate

    @property
    def end_s(self) -> float:
        return self.stop / self.sample_rate


def plan_windows(n_frames: int, sample_rate: int, seg: Segmentation) -> tuple[list[Window], int]:
    """The segments of a file with `n_frames` samples at `sample_rate`, and how many short ones were dropped (0 or 1)."""
    length = max(1, round(seg.seconds * sample_rate))
    hop = max(1, round(seg.hop_seconds * sample_rate))
    min_frames = seg.min_seconds * sample_rate
    windows: list[Window] = []
    start = 0
    while start + length <= n_frames:  # full segments
        windows.append(Window(len(windows), start, start + length, sample_rate))
        start += hop
    if start < n_frames or not windows:  # the tail, or a track shorter than one segment
        if n_frames - start >= min_frames and n_frames > start:
            windows.append(Window(len(windows), start, n_frames, sample_rate))
        else:
            return windows, 1
    return windows, 0
