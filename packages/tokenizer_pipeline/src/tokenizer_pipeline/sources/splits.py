"""Which split a whole track goes to when the source names none: a stable hash of its track id.

`u = int(sha256(track_id)[:16 hex], 16) / 2**64` is uniform in [0, 1); the track is eval when `u < eval_fraction`.
It depends on nothing but the id and the fraction: adding, removing or reordering other tracks never moves a track,
and all segments of a track share its split (no track leaks across splits). The id hashed is the readable one
(`track_ids.sanitised`, before collision handling): a new track whose path sanitises alike changes both tracks'
keys (hash suffixes) but never the split of the one already there.
"""

from __future__ import annotations

import hashlib
import math

from ..errors import ConfigError


def track_unit(track_id: str) -> float:
    """The track's position in [0, 1), from the first 64 bits of sha256(track_id)."""
    digest = hashlib.sha256(track_id.encode("utf-8")).hexdigest()
    return int(digest[:16], 16) / 2**64


def is_eval(track_id: str, eval_fraction: float) -> bool:
    return track_unit(track_id) < eval_fraction


def check_eval_fraction(eval_fraction: float) -> None:
    if not (isinstance(eval_fraction, (int, float)) and math.isfinite(eval_fraction) and 0 <= eval_fraction <= 1):
        raise ConfigError(f"split.eval_fraction={eval_fraction} must be between 0 and 1 (the share of tracks in eval)")
