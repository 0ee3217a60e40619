"""Split settings every source shares, and which split a whole track goes to when the source names none.

Split names become directories of the shard set (`<out_dir>/<name>/shard-NNNNNN.tar`), so every source checks them
(`check_split_names`) before anything is read or written: one plain path component under the sample-key rule
(never '..', '/', absolute or empty), and train != eval (ignoring letter case).

A track's split is a stable hash of its track id.

`u = int(sha256(track_id)[:16 hex], 16) / 2**64` is uniform in [0, 1); the track is eval when `u < eval_fraction`.
It depends on nothing but the id and the fraction: adding, removing or reordering other tracks never moves a track,
and all segments of a track share its split (no track leaks across splits). The id hashed is the readable one
(`track_ids.sanitised`, before collision handling; it already carries a hash of the exact path whenever the readable
part lost characters that are not ASCII): a new track whose path sanitises alike changes both tracks' keys (hash
suffixes) but never the split of the one already there.
"""

from __future__ import annotations

import hashlib
import math

from ..errors import ConfigError
from ..shards.keys import KEY_RULE, key_problem


def track_unit(track_id: str) -> float:
    """The track's position in [0, 1), from the first 64 bits of sha256(track_id)."""
    digest = hashlib.sha256(track_id.encode("utf-8")).hexdigest()
    return int(digest[:16], 16) / 2**64


def is_eval(track_id: str, eval_fraction: float) -> bool:
    return track_unit(track_id) < eval_fraction


def check_eval_fraction(eval_fraction: float) -> None:
    if not (isinstance(eval_fraction, (int, float)) and math.isfinite(eval_fraction) and 0 <= eval_fraction <= 1):
        raise ConfigError(f"split.eval_fraction={eval_fraction} must be between 0 and 1 (the share of tracks in eval)")


def check_split_names(train_name: str, eval_name: str) -> None:
    """Split names become directories of the shard set: plain names under the sample-key rule, and different.

    Raises ConfigError (exit 2, one line) naming the key; every source calls it before anything is written."""
    for key, name in (("split.train_name", train_name), ("split.eval_name", eval_name)):
        problem = key_problem(name)
        if problem:
            raise ConfigError(
                f"{key}={name!r} {problem}; a split name is a plain directory name inside out_dir (e.g. train, eval): "
                f"{KEY_RULE}"
            )
    if train_name == eval_name:
        raise ConfigError(f"split.train_name and split.eval_name must differ, both are {train_name!r}")
    if train_name.casefold() == eval_name.casefold():  # one directory on a case-insensitive file system
        raise ConfigError(
            f"split.train_name={train_name!r} and split.eval_name={eval_name!r} differ only in letter case, so they "
            "are one directory on macOS and Windows; rename one"
        )
