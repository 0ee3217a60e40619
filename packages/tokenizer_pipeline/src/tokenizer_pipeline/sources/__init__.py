"""Sources of audio + captions besides the MusicCaps CSV: `source=audiocraft` and `source=audiofolder`.

audiocraft.py / audiofolder.py   read a layout into `Track`s (track.py), refusing paths that leave it
captions.py                      captions from metadata, audiocraft-compatible (field or template)
track_ids.py                     safe, unique, deterministic track ids (the sample-key prefix)
plan.py                          Tracks -> `SegmentItem`s (segmenting.py windows, splits.py split), the unit
                                 run.py plans shards with, decodes, encodes and records
"""

from .plan import SegmentItem, SourceInfo, plan_items
from .track import SourceError

__all__ = ["SegmentItem", "SourceError", "SourceInfo", "plan_items"]
