"""What to encode: MusicCaps CSV rows, or your own tracks cut into planned segments (key, split, window, caption).

musiccaps.py                     the MusicCaps CSV -> `ClipRow`s, one per clip, every row checked up front
audiocraft.py / audiofolder.py   read a layout into `Track`s (track.py), refusing paths that leave it
captions.py                      captions from metadata, audiocraft-compatible (field or template)
track_ids.py                     safe, unique, deterministic track ids (the sample-key prefix), relative to a root
duplicates.py                    the same audio named twice (path or content): only the first is encoded
segmenting.py / splits.py        a track's segment windows from its header; split names checked; its split from the
                                 sha256 of its audio file
plan.py                          Tracks -> `SegmentItem`s, the unit the run room plans shards with, decodes, encodes
                                 and records
"""
