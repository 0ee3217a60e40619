"""source=audiocraft: an audiocraft manifest (`egs/<name>/data.jsonl` or `.jsonl.gz`) -> Tracks.

Layout, exactly as `python -m audiocraft.data.audio_dataset <folder> <manifest>` writes it (audiocraft's
`AudioMeta.to_dict()`): one JSON object per line with `path`, `duration` (s), `sample_rate`, `amplitude` (or null),
`weight` (or null) and `info_path` (or null; audiocraft's `PathInZip`, "<zip file>:<member>"). The metadata of a
track (audiocraft's `MusicInfo`: description, keywords, genre, moods, bpm, key, instrument, title, artist, name, ...)
comes from `info_path` when it is set, else from the sidecar `<audio path without extension>.json`, as
audiocraft's MusicDataset reads it. A track without metadata has no caption (a `no_caption` failure).

Paths (the rule that keeps reads where the user pointed): an absolute `path` is read as it is (audiocraft writes
absolute paths, and the manifest's author named them); a relative one resolves against the manifest's directory
and may not contain '..'. `info_path` follows the same rule. The pipeline only ever reads these files; it writes
nothing but out_dir. A line breaking the layout stops the run before any audio is read, naming the line.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zipfile
from pathlib import Path
from typing import Any

from .track import MetadataError, NotJsonConstant, SourceError, Track, check_relative, refuse_constant

FIELDS = ("path", "duration", "sample_rate", "amplitude", "weight", "info_path")  # audiocraft's AudioMeta
ZIP_SEP = ":"  # audiocraft's PathInZip.INFO_PATH_SEP


def read_lines(manifest: Path) -> list[tuple[int, str]]:
    """(line number, text) of the non-blank lines; gzip when the name ends in .gz (as audiocraft decides)."""
    if not manifest.is_file():
        raise SourceError(
            f"audiocraft manifest not found: {manifest}; write one with `python -m audiocraft.data.audio_dataset "
            "<audio folder> egs/<name>/data.jsonl` or `python -m tokenizer_pipeline.standin_corpus --layout "
            "audiocraft`, then pass source.manifest=<that file>"
        )
    try:
        raw = gzip.decompress(manifest.read_bytes()) if manifest.name.lower().endswith(".gz") else manifest.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise SourceError(f"cannot read audiocraft manifest {manifest}: {e}; it must be UTF-8 JSON lines") from e
    return [(i, line) for i, line in enumerate(text.splitlines(), start=1) if line.strip()]


def _parse_line(manifest: Path, line: int, text: str) -> dict[str, Any]:
    where = f"{manifest}:{line}"
    try:
        d = json.loads(text)
    except ValueError as e:
        raise SourceError(f"{where}: not a JSON object ({e}); fix or delete that line") from e
    if not isinstance(d, dict):
        raise SourceError(f"{where}: not a JSON object; each line is one track's AudioMeta")
    if not isinstance(d.get("path"), str) or not d["path"]:
        raise SourceError(f"{where}: 'path' is missing or not a string; each line needs the audio file's path")
    for key in ("duration", "amplitude", "weight"):
        v = d.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise SourceError(f"{where}: '{key}'={v!r} is not a finite number")
    if d.get("weight") is not None and d["weight"] <= 0:
        raise SourceError(f"{where}: 'weight'={d['weight']} must be > 0 (or null for 1.0)")
    if d.get("info_path") is not None and not isinstance(d["info_path"], str):
        raise SourceError(f"{where}: 'info_path' must be a string \"<zip>:<member>\" or null")
    return d


def _resolve(base: Path, raw: str, where: str, what: str) -> Path:
    """An absolute path as is; a relative one against `base`, without '..'."""
    p = Path(raw)
    if p.is_absolute():
        return p
    check_relative(raw, where, what)
    return base / p


def _load_json_metadata(data: bytes, where: str, origin: str) -> dict[str, Any]:
    try:
        meta = json.loads(data.decode("utf-8"), parse_constant=refuse_constant)
    except NotJsonConstant as e:
        raise MetadataError(f"{where}: metadata {origin} {e}") from e
    except ValueError as e:
        raise MetadataError(f"{where}: metadata {origin} is not UTF-8 JSON ({e}); fix or delete it") from e
    if not isinstance(meta, dict):
        raise MetadataError(f"{where}: metadata {origin} is not a JSON object")
    return meta


def read_metadata(base: Path, audio: Path, info_path: str | None, where: str) -> tuple[dict[str, Any], str | None]:
    """The track's metadata and where it came from: info_path ("<zip>:<member>", or a plain .json file), else the
    sidecar `<audio>.json`; ({}, None) when there is none."""
    if info_path:
        zip_part, sep, member = info_path.partition(ZIP_SEP)
        if sep and zip_part.lower().endswith(".zip"):
            zpath = _resolve(base, zip_part, where, "info_path")
            try:
                with zipfile.ZipFile(zpath) as zf:
                    data = zf.read(member.lstrip("/") if member.lstrip("/") in zf.namelist() else member)
            except (OSError, KeyError, zipfile.BadZipFile) as e:
                raise MetadataError(f"{where}: cannot read info_path {info_path!r}: {e}") from e
            return _load_json_metadata(data, where, info_path), info_path
        path = _resolve(base, info_path, where, "info_path")
        if not path.is_file():
            raise MetadataError(f"{where}: info_path {info_path!r} not found ({path})")
        return _load_json_metadata(path.read_bytes(), where, str(path)), info_path
    sidecar = audio.with_suffix(".json")
    if not sidecar.is_file():
        return {}, None
    return _load_json_metadata(sidecar.read_bytes(), where, str(sidecar)), sidecar.name


def _source_file(base: Path, raw: str, audio: Path) -> str:
    """The path relative to the manifest's directory when inside it, else the path as given."""
    if Path(raw).is_absolute():
        try:
            return audio.relative_to(base.resolve()).as_posix()
        except ValueError:
            return raw
    return Path(raw).as_posix()


def read_audiocraft(manifest: Path) -> list[Track]:
    """Every track of the manifest, in line order; SourceError on the first unusable line or repeated path."""
    manifest = Path(manifest)
    base = manifest.parent
    tracks: list[Track] = []
    seen: dict[str, int] = {}
    for line, text in read_lines(manifest):
        where = f"{manifest}:{line}"
        d = _parse_line(manifest, line, text)
        audio = _resolve(base, d["path"], where, "path")
        key = os.path.abspath(audio)  # one file named relative and absolute is one path (links are not followed)
        if key in seen:
            raise SourceError(f"{where}: path {d['path']!r} repeats line {seen[key]}; remove the duplicate line")
        seen[key] = line
        try:
            meta, meta_file, meta_error = *read_metadata(base, audio, d.get("info_path"), where), None
        except MetadataError as e:  # this track's problem: recorded as its failure, the other tracks go on
            meta, meta_file, meta_error = {}, None, str(e)
        tracks.append(
            Track(
                line=line, source_path=d["path"], audio_path=audio, source_file=_source_file(base, d["path"], audio),
                metadata=meta,
                weight=1.0 if d.get("weight") is None else float(d["weight"]),
                declared_duration_s=None if d.get("duration") is None else float(d["duration"]),
                metadata_file=meta_file, metadata_error=meta_error,
            )
        )  # fmt: skip
    return tracks
