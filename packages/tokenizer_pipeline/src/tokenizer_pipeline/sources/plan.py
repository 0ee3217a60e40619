"""Tracks of any source -> `SegmentItem`s, the planned unit of work (one sample, or one track-level failure).

Per track, in source order: its own problems (`bad_path`, `bad_metadata`), the caption (none: `no_caption`), the
file's header (the windows come from it, not from a declared duration), the same audio named again
(`duplicate_audio`), then the split (the layout's, the one an existing set gives it, else by the audio's sha256).
Failure items use the track id as key, segments `<track id>_<segment index>`; too-short tracks and tails are
`SourceInfo.dropped` lines that occupy no shard slot and do not count toward max_failure_fraction.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ..audio.read_audio import ClipFailure, audio_header
from ..config import PipelineConfig
from ..shards.manifest import FailureRecord, dumps_strict
from .audiocraft import audiocraft_tracks
from .audiofolder import read_audiofolder
from .captions import aspects_of, caption_of, check_caption_mode
from .duplicates import duplicates
from .segmenting import Segmentation, plan_windows
from .splits import KeptSplits, audio_is_eval, audio_sha256, check_eval_fraction, is_eval
from .track import SourceError, Track, shown
from .track_ids import duplicate_path, sanitised, track_ids

KINDS = ("musiccaps", "audiocraft", "audiofolder")
MAX_CAPTION_CHARS = 4096  # MusicCaps' longest caption is 756; a longer one is a metadata error, never truncated
MAX_METADATA_BYTES = 65536  # the metadata is copied into every segment's json


@dataclass(frozen=True)
class SegmentItem:
    """One planned sample of a track (or the track's failure, when `failure` is set)."""

    ytid: str  # the sample key: <track id>_<segment index>; the track id alone for a track-level failure
    split: str  # the configured train_name / eval_name
    csv_row: int  # 1-based line of the manifest / metadata file naming the track
    source_kind: str  # audiocraft | audiofolder
    track_id: str
    source_path: str  # as the source gives it
    source_file: str  # relative to the source's root (track_ids.py)
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
    n_dropped_short: int  # last segments (or whole tracks) shorter than min_seconds: the two counts below
    n_duration_disagreements: int  # manifest duration vs header beyond duration_tolerance_s (the header was used)
    track_failures: int = 0  # tracks that gave no segment plan (no caption, missing or unreadable file)
    n_dropped_short_tracks: int = 0  # whole tracks shorter than min_seconds (no segment)
    n_dropped_tails: int = 0  # last segments shorter than min_seconds
    dropped: list[FailureRecord] = field(default_factory=list)  # one short_track / short_tail line each
    notes: list[str] = field(default_factory=list)
    root: str | None = None  # audiocraft: the folder track ids are relative to (source.root, kept, or the common one)
    split_rule: str = "audio_sha256"  # the manifest's source.split_rule: audio_sha256, or folders (audiofolder)


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
    if src.root is not None and src.kind != "audiocraft":
        raise ConfigError(
            f"source.root={src.root!r} is for source=audiocraft only (audiofolder ids are relative to source.dir); "
            "remove it"
        )
    check_caption_mode(src.caption, src.template)
    check_eval_fraction(cfg.split.eval_fraction)


def read_tracks(
    cfg: PipelineConfig, kept_root: Path | None = None
) -> tuple[list[Track], Path, list[Path], Path | None]:
    """The source's tracks, its path, the files their metadata listing came from, and the audiocraft id root
    (`kept_root`: the one an existing set in out_dir recorded, kept while it holds a track)."""
    if cfg.source.kind == "audiocraft":
        manifest = Path(str(cfg.source.manifest))
        root = None if cfg.source.root is None else Path(str(cfg.source.root))
        tracks, id_root = audiocraft_tracks(manifest, root, kept_root)
        return tracks, manifest, [manifest], id_root
    folder = Path(str(cfg.source.dir))
    tracks, files = read_audiofolder(folder)
    return tracks, folder, files, None


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


def _ids(tracks: list[Track]) -> list[str]:
    """Track ids from each track's source_file; a path named again gets the id of its pseudo-path
    `duplicate_path` ('<stem>-dup<line>'), in the same collision set as every real path, so its key never equals
    another and a repeated line never changes the first track's id."""
    seen: set[str] = set()
    paths = []
    for t in tracks:
        paths.append(duplicate_path(t.source_file, t.line) if t.source_file in seen else t.source_file)
        seen.add(t.source_file)
    return track_ids(paths)


def _metadata_problem(caption: str | None, metadata_json: str, where: str) -> str | None:
    """Why the caption or metadata is too large to copy into every segment's json (a bad_metadata failure)."""
    if caption is not None and len(caption) > MAX_CAPTION_CHARS:
        return (f"{where}: the caption has {len(caption)} characters, more than {MAX_CAPTION_CHARS} (it is stored in "
                "every segment's json); shorten it")  # fmt: skip
    size = len(metadata_json.encode("utf-8"))
    if size > MAX_METADATA_BYTES:
        return (f"{where}: the metadata is {size} bytes of JSON, more than {MAX_METADATA_BYTES} (it is copied into "
                "every segment's json); shorten its fields")  # fmt: skip
    return None


def _dropped(track: Track, key: str, split: str, reason: str, detail: str) -> FailureRecord:
    return FailureRecord(ytid=key, csv_row=track.line, split=split, reason=reason, detail=detail)


def _audio_hash(track: Track) -> str | None:
    """sha256 of the track's file (its split), or None when there is no file to read."""
    if track.problem is not None:
        return None
    try:
        return audio_sha256(track.audio_path) if track.audio_path.is_file() else None
    except OSError:  # unreadable: the header read says why
        return None


def _splits(tracks: list[Track], cfg: PipelineConfig, kept: KeptSplits | None) -> tuple[list[str], dict[int, str]]:
    """Each track's split name (module docstring, step 4), and the audio sha256 of the tracks split by it."""
    named = {"train": cfg.split.train_name, "eval": cfg.split.eval_name}
    hashes = {i: h for i, t in enumerate(tracks) if t.split is None and (h := _audio_hash(t)) is not None}
    splits = []
    for i, t in enumerate(tracks):
        sha = hashes.get(i)
        held = None if t.split or kept is None else kept.of(sha, t.source_file)
        if t.split:
            splits.append(named[t.split])
        elif held in named.values():
            splits.append(str(held))
        elif sha is not None:
            splits.append(named["eval" if audio_is_eval(sha, cfg.split.eval_fraction) else "train"])
        else:  # no audio to hash: a failure line's label only (no sample)
            splits.append(named["eval" if is_eval(sanitised(t.source_file), cfg.split.eval_fraction) else "train"])
    return splits, hashes


def plan_items(
    cfg: PipelineConfig, kept_root: Path | None = None, kept_splits: KeptSplits | None = None
) -> tuple[list[SegmentItem], SourceInfo]:
    """Every planned item of the source in track order (segments in time order), and the source's summary.
    `kept_root`, `kept_splits`: what an existing set in out_dir fixes when the source is encoded into it again."""
    check_source_config(cfg)
    seg = Segmentation.from_config(cfg.segment.seconds, cfg.segment.hop_seconds, cfg.segment.min_seconds)
    tracks, where, files, id_root = read_tracks(cfg, kept_root)
    tracks = tracks if cfg.limit is None else tracks[: cfg.limit]
    if not tracks:
        raise SourceError(f"{where}: names no tracks; nothing to encode")
    kind, src = cfg.source.kind, cfg.source
    fallback = "text" if kind == "audiofolder" and src.caption_column == "caption" else None
    check_caption_column(tracks, src.caption, src.caption_column, fallback, where)
    ids = _ids(tracks)
    splits, hashes = _splits(tracks, cfg, kept_splits)
    checked = [_checked(track, cfg, fallback, where) for track in tracks]
    repeats = duplicates(tracks, [i for i, c in enumerate(checked) if c.failure is None], hashes.get)
    items: list[SegmentItem] = []
    dropped: list[FailureRecord] = []
    n_short_tracks = n_tails = n_disagree = n_failed = 0
    for i, (track, tid, split, (base, failure, header)) in enumerate(zip(tracks, ids, splits, checked)):
        if i in repeats:  # the copy kept (repeats[i]) passed every check above: it is the one encoded
            first = tracks[repeats[i]]
            split = splits[repeats[i]]  # with the audio it repeats: the same audio in one split only
            failure = ("duplicate_audio", f"the same audio as line {first.line} ({first.source_file}), which is "
                       "encoded in its place; remove one of the two")  # fmt: skip
        if failure is not None:
            items.append(_failure_item(track, tid, split, kind, base, *failure))
            n_failed += 1
            continue
        n_frames, sr = header
        if (
            track.declared_duration_s is not None
            and abs(track.declared_duration_s - n_frames / sr) > cfg.duration_tolerance_s
        ):
            n_disagree += 1
        windows, n_drop = plan_windows(n_frames, sr, seg)
        if n_drop and not windows:
            n_short_tracks += 1
            detail = (f"track {track.source_file}: {n_frames / sr:.3f} s, shorter than segment.min_seconds="
                      f"{seg.min_seconds}: no segment (lower segment.min_seconds to keep it)")  # fmt: skip
            dropped.append(_dropped(track, tid, split, "short_track", detail))
        elif n_drop:
            n_tails += 1
            start = len(windows) * max(1, round(seg.hop_seconds * sr)) / sr  # where plan_windows stopped
            detail = (f"segment {len(windows)} [{start:.3f}, {n_frames / sr:.3f}] s of {track.source_file}: shorter "
                      f"than segment.min_seconds={seg.min_seconds}, dropped (lower segment.min_seconds to keep it)")  # fmt: skip
            dropped.append(_dropped(track, f"{tid}_{len(windows)}", split, "short_tail", detail))
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
        n_dropped_short=n_short_tracks + n_tails, n_duration_disagreements=n_disagree, track_failures=n_failed,
        n_dropped_short_tracks=n_short_tracks, n_dropped_tails=n_tails, dropped=dropped,
        root=None if id_root is None else str(id_root),
        split_rule="folders" if any(t.split for t in tracks) else "audio_sha256",
    )  # fmt: skip
    return items, info


class _Checked(NamedTuple):
    base: dict  # the SegmentItem fields taken from the metadata
    failure: tuple[str, str] | None  # the track's failure before duplicates are known
    header: tuple[int, int]  # (frames, sample rate) when there is no failure


def _checked(track: Track, cfg: PipelineConfig, fallback: str | None, where: Path) -> _Checked:
    """The track's metadata fields, and its own failure (bad path, metadata, caption, header) in that order."""
    src = cfg.source
    caption = caption_of(track.metadata, src.caption, src.caption_column, src.template, fallback)
    base = {
        "caption": caption or "", "aspect_list": tuple(aspects_of(track.metadata, list(src.aspect_fields))),
        "weight": track.weight, "metadata_json": dumps_strict(track.metadata),
    }  # fmt: skip
    if track.problem is not None:
        return _Checked(base, track.problem, (0, 0))
    if track.metadata_error is not None:  # its own sidecar is unusable: no caption to trust
        return _Checked(base, ("bad_metadata", track.metadata_error), (0, 0))
    too_big = _metadata_problem(caption, base["metadata_json"], track.metadata_file or str(where))
    if too_big is not None:
        return _Checked(base, ("bad_metadata", too_big), (0, 0))
    if caption is None and track.audio_path.is_file():  # a missing file is missing_audio
        how = f"template {src.template!r}" if src.caption == "template" else f"field {src.caption_column!r}"
        return _Checked(base, ("no_caption", f"{how} is empty ({track.metadata_file or 'no metadata file'})"), (0, 0))
    try:
        return _Checked(base, None, audio_header(track.audio_path))
    except ClipFailure as e:
        return _Checked(base, (e.reason, _header_detail(e, src.kind, track)), (0, 0))


def _header_detail(e: ClipFailure, kind: str, track: Track) -> str:
    """The header read's failure detail; a missing relative audiocraft path says where it was looked for."""
    detail = f"{e.detail} ({shown(str(e.path))})"
    if e.reason == "missing_audio" and kind == "audiocraft" and not Path(track.source_path).is_absolute():
        detail += (
            f"; a relative path is read from the directory you launch from ({Path.cwd()}), as audiocraft reads it: "
            "launch from the folder the manifest's paths are relative to, or make them absolute"
        )
    return detail
