"""What to encode: MusicCaps CSV rows, or your own tracks cut into planned segments (key, split, window, caption).

musiccaps.py                     the MusicCaps CSV -> `ClipRow`s, one per clip, every row checked up front
audiocraft.py / audiofolder.py   read a layout into `Track`s (track.py), refusing paths that leave it
captions.py                      captions from metadata, audiocraft-compatible (field or template)
track_ids.py                     safe, unique, deterministic track ids (the sample-key prefix)
segmenting.py / splits.py        a track's segment windows from its header; its split from a hash of its id
plan.py                          Tracks -> `SegmentItem`s, the unit the run room plans shards with, decodes, encodes
                                 and records
"""
