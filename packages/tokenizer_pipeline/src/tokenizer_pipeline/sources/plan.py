"""Tracks of any source -> `SegmentItem`s, the planned unit of work (one sample, or one track-level failure).

A planned item = source file + window + metadata + key + split. Per track, in source order:
  1. caption from the metadata (captions.py); none -> one `no_caption` item for the track (no audio is read),
     unless the file is missing (then step 2's missing_audio: a missing file has no sidecar either)
  2. the file's header (frames, sample rate); unreadable or missing -> one item carrying that failure
  3. windows from the header (segmenting.py; the manifest's `duration` is not trusted: when it disagrees with the
     header by more than duration_tolerance_s the header wins and the disagreement is counted)
  4. split: the layout's (audiofolder split folders) or the hash of the track id before collision handling
     (splits.py; equal to the track id unless another path sanitises alike, so a new colliding track never moves it)
Track-level failure items use the track id as their key; segment items `<track id>_<segment index>`. Track ids
never end in `_<digits>` (track_ids.py), so no key can equal another.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..audio.read_audio import ClipFailure, audio_header
from ..config import PipelineConfig
from ..shards.manifest import dumps_strict
from .audiocraft import read_audiocraft
from .audiofolder import read_audiofolder
from .captions import aspects_of, caption_of, check_caption_mode
from .segmenting import Segmentation, plan_windows
from .splits import check_eval_fraction, is_eval
from .track import SourceError, Track
from .track_ids import sanitised, track_ids

KINDS = ("musiccaps", "audiocraft", "audiofolder")


@dataclass(frozen=True)
class SegmentItem:
    """One planned sample of a track (or the track's failure, when `failure` is set)."""

    ytid: str  # the sample key: <track id>_<segment index>; the track id alone for a track-level failure
    split: str  # the configured train_name / eval_name
    csv_row: int  # 1-based line of the manifest / metadata file naming the track
    source_kind: str  # audiocraft | audiofolder
    track_id: str
    source_path: str  # as the source gives it
    source_file: str  # relative to the source's folder (or the absolute path given)
    audio_path: str  # the file read
    start_s: float  # the segment's window in the track, seconds (0, 0 for a track-level failure)
    end_s: float
    segment_index: int | None  # None for a track-level failure
    caption: str
    aspect_list: tuple[str, ...]
    weight: float
    metadata_json: str  # every metadata field the source gave, as canonical JSON (decoded into the sample)
    failure: tuple[str, str] | None = None  # (reason, detail) known before decoding

    @property
    def input_digest(self) -> str:
        """sha256 of what the sample's json takes from the source besides the audio (resume redoes on change)."""
        blob = dumps_strict([self.caption, list(self.aspect_list), self.weight, self.metadata_json, self.source_path])
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class SourceInfo:
    """What the manifest's `source` and `segmentation` objects record about a non-MusicCaps source."""

    kind: str
    path: str  # the manifest file / the audiofolder directory, as given
    sha256: str  # of the manifest file; audiofolder: of its metadata file(s) (see metadata_sha256)
    metadata_files: list[str]  # audiofolder: relative to the folder; audiocraft: [the manifest's name]
    segmentation: Segmentation
    n_tracks: int
    n_segments: int  # planned segment samples (before decode/encode failures)
    n_dropped_short: int  # last segments (or whole tracks) shorter than min_seconds
    n_duration_disagreements: int  # manifest duration vs header beyond duration_tolerance_s (the header was used)
    track_failures: int = 0  # tracks that gave no segment plan (no caption, missing or unreadable file)
    notes: list[str] = field(default_factory=list)


def metadata_sha256(files: list[Path], root: Path) -> str:
    """sha256 of one file; for several, of the lines '<sha256>  <relative path>' (sha256sum's format), sorted."""
    from ..shards.write_shards import sha256_file

    if len(files) == 1:
        return sha256_file(files[0])
    lines = sorted(f"{sha256_file(f)}  {f.relative_to(root).as_posix()}\n" for f in files)
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


def check_source_config(cfg: PipelineConfig) -> None:
    """Source settings no run can use; ConfigError / SourceError names the key."""
    from ..errors import ConfigError

    src = cfg.source
    if src.kind not in KINDS:
        raise ConfigError(
            f"source.kind={src.kind!r} is not one of {KINDS}; pick source=musiccaps|audiocraft|audiofolder"
        )
    if src.kind == "audiocraft" and not src.manifest:
        raise ConfigError("source=audiocraft needs source.manifest=<egs/<name>/data.jsonl>")
    if src.kind == "audiofolder" and not src.dir:
        raise ConfigError("source=audiofolder needs source.dir=<folder with metadata.csv or metadata.jsonl>")
    check_caption_mode(src.caption, src.template)
    check_eval_fraction(cfg.split.eval_fraction)


def read_tracks(cfg: PipelineConfig) -> tuple[list[Track], Path, list[Path]]:
    """The source's tracks, its path, and the files their metadata listing came from."""
    if cfg.source.kind == "audiocraft":
        manifest = Path(str(cfg.source.manifest))
        return read_audiocraft(manifest), manifest, [manifest]
    root = Path(str(cfg.source.dir))
    tracks, files = read_audiofolder(root)
    return tracks, root, files


def check_caption_column(tracks: list[Track], mode: str, column: str, fallback: str | None, where: Path) -> None:
    """caption=field with a column that no track's metadata has (tracks without metadata aside) is a setting to fix,
    not a no_caption failure per track. Raises ConfigError naming the columns there are."""
    from ..errors import ConfigError

    with_meta = [t.metadata for t in tracks if t.metadata]
    if mode != "field" or not with_meta or any(column in m or (fallback and fallback in m) for m in with_meta):
        return
    columns = sorted({k for m in with_meta for k in m})
    shown = columns if len(columns) <= 20 else [*columns[:20], "..."]
    raise ConfigError(
        f"source.caption_column={column!r} is in no track's metadata ({where}; fields: {shown}); set "
        "source.caption_column=<the caption's field>, or source.caption=template"
    )


def _failure_item(track: Track, tid: str, split: str, kind: str, base: dict, reason: str, detail: str) -> SegmentItem:
    return SegmentItem(
        ytid=tid, split=split, csv_row=track.line, source_kind=kind, track_id=tid, source_path=track.source_path,
        source_file=track.source_file, audio_path=str(track.audio_path), start_s=0.0, end_s=0.0, segment_index=None,
        failure=(reason, detail), **base,
    )  # fmt: skip


def plan_items(cfg: PipelineConfig) -> tuple[list[SegmentItem], SourceInfo]:
    """Every planned item of the source in track order (segments in time order), and the source's summary."""
    check_source_config(cfg)
    seg = Segmentation.from_config(cfg.segment.seconds, cfg.segment.hop_seconds, cfg.segment.min_seconds)
    tracks, where, files = read_tracks(cfg)
    tracks = tracks if cfg.limit is None else tracks[: cfg.limit]
    if not tracks:
        raise SourceError(f"{where}: names no tracks; nothing to encode")
    kind, src = cfg.source.kind, cfg.source
    fallback = "text" if kind == "audiofolder" and src.caption_column == "caption" else None
    check_caption_column(tracks, src.caption, src.caption_column, fallback, where)
    items: list[SegmentItem] = []
    n_dropped = n_disagree = n_failed = 0
    for track, tid in zip(tracks, track_ids([t.source_file for t in tracks])):
        named = {"train": cfg.split.train_name, "eval": cfg.split.eval_name}
        split = (
            named[track.split]
            if track.split
            else named["eval" if is_eval(sanitised(track.source_file), cfg.split.eval_fraction) else "train"]
        )
        caption = caption_of(track.metadata, src.caption, src.caption_column, src.template, fallback)
        base = {
            "caption": caption or "", "aspect_list": tuple(aspects_of(track.metadata, list(src.aspect_fields))),
            "weight": track.weight, "metadata_json": dumps_strict(track.metadata),
        }  # fmt: skip
        if track.metadata_error is not None:  # its own sidecar / info_path is unusable: no caption to trust
            items.append(_failure_item(track, tid, split, kind, base, "bad_metadata", track.metadata_error))
            n_failed += 1
            continue
        if caption is None and track.audio_path.is_file():  # a missing file is missing_audio (its sidecar is too)
            how = f"template {src.template!r}" if src.caption == "template" else f"field {src.caption_column!r}"
            meta = track.metadata_file or "no metadata file"
            items.append(_failure_item(track, tid, split, kind, base, "no_caption", f"{how} is empty ({meta})"))
            n_failed += 1
            continue
        try:
            n_frames, sr = audio_header(track.audio_path)
        except ClipFailure as e:
            detail = f"{e.detail} ({e.path})"
            if e.reason == "missing_audio" and kind == "audiocraft" and not Path(track.source_path).is_absolute():
                detail += (
                    "; a relative path is read from the manifest's folder, while audiocraft's own manifests (e.g. "
                    "egs/example/data.jsonl) name paths relative to the directory you launch from: make them absolute"
                )
            items.append(_failure_item(track, tid, split, kind, base, e.reason, detail))
            n_failed += 1
            continue
        if (
            track.declared_duration_s is not None
            and abs(track.declared_duration_s - n_frames / sr) > cfg.duration_tolerance_s
        ):
            n_disagree += 1
        windows, dropped = plan_windows(n_frames, sr, seg)
        n_dropped += dropped
        for w in windows:
            items.append(
                SegmentItem(
                    ytid=f"{tid}_{w.index}", split=split, csv_row=track.line, source_kind=kind, track_id=tid,
                    source_path=track.source_path, source_file=track.source_file, audio_path=str(track.audio_path),
                    start_s=w.start_s, end_s=w.end_s, segment_index=w.index, **base,
                )
            )  # fmt: skip
    if not items:  # every track dropped short: nothing to encode and nothing to report as a failure
        raise SourceError(
            f"{where}: none of its {len(tracks)} track(s) gives a segment: each is shorter than "
            f"segment.min_seconds={seg.min_seconds} (segment.seconds={seg.seconds}); lower segment.seconds (and "
            "segment.min_seconds) to fit your tracks"
        )
    info = SourceInfo(
        kind=kind, path=str(where), sha256=metadata_sha256(files, where if kind == "audiofolder" else where.parent),
        metadata_files=[f.relative_to(where).as_posix() if kind == "audiofolder" else f.name for f in files],
        segmentation=seg, n_tracks=len(tracks), n_segments=sum(i.failure is None for i in items),
        n_dropped_short=n_dropped, n_duration_disagreements=n_disagree, track_failures=n_failed,
    )  # fmt: skip
    return items, info


def metadata_of(item: SegmentItem) -> dict:
    return json.loads(item.metadata_json)
