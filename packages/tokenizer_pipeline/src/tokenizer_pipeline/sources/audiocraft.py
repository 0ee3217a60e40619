"""source=audiocraft: an audiocraft manifest (`egs/<name>/data.jsonl` or `.jsonl.gz`) -> Tracks, read as audiocraft reads it.

One AudioMeta JSON object per line (split on '\\n' only). A relative `path` is relative to the launch directory, as
audiocraft resolves it; metadata is the sidecar `<path without suffix>.json`, only its `MusicInfo` fields. Track ids
are relative to the id root (`id_root`; docs/shard-format.md, "Segment samples"). A line breaking the layout stops the
run naming the line; one track's problem (an unusable sidecar, a non-UTF-8 name) is that track's failure.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from pathlib import Path
from typing import Any

from .track import MetadataError, NotJsonConstant, SourceError, Track, finite_float, refuse_constant, shown

FIELDS = ("path", "duration", "sample_rate", "amplitude", "weight", "info_path")  # audiocraft's AudioMeta
# audiocraft 1.3.0 music_dataset.MusicInfo's own fields (AudioInfo's come from the audio, never from the sidecar)
MUSIC_INFO_FIELDS = ("title", "artist", "key", "bpm", "genre", "moods", "keywords", "description", "name", "instrument")
NOT_UTF8_FIX = (
    "the file name is not UTF-8 (audiocraft's manifest writer escapes each such byte as \\udcXX): rename the file to "
    "UTF-8 (e.g. `convmv -f latin1 -t utf8 --notest <file>`) and write the manifest again"
)


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
    lines = (line.removesuffix("\r") for line in text.split("\n"))  # not splitlines(): U+2028 is not a line end
    return [(i, line) for i, line in enumerate(lines, start=1) if line.strip()]


def _parse_line(manifest: Path, line: int, text: str) -> dict[str, Any]:
    where = f"{manifest}:{line}"
    try:
        d = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise SourceError(f"{where}: not a JSON object ({shown(str(e))[:200]}); fix or delete that line") from e
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
    return d


def resolve_path(raw: str) -> Path:
    """The file audiocraft opens: absolute as is, relative against the working directory, never normalised (a '..'
    after a symlink is the OS's to follow)."""
    return Path(raw) if os.path.isabs(raw) else Path.cwd() / raw


def id_path(raw: str) -> Path:
    """The normalised absolute path the track id is computed from ('..' and '.' removed on the text)."""
    return Path(os.path.abspath(raw))


def path_problem(raw: str, where: str) -> tuple[str, str] | None:
    """A `bad_path` failure for a path no file can have: not UTF-8, a NUL byte, or no file name ('/')."""
    if shown(raw) != raw:  # a lone surrogate: a byte of a non-UTF-8 name (or a broken escape)
        return ("bad_path", f"{where}: path '{shown(raw)}': {NOT_UTF8_FIX}")
    if "\0" in raw:
        return ("bad_path", f"{where}: path {shown(raw)!r} contains a NUL byte, which no file name can hold; fix that "
                            "line's path")  # fmt: skip
    if not id_path(raw).name or raw.endswith(("/", "/.", "/..")) or raw in (".", ".."):
        return ("bad_path", f"{where}: path {shown(raw)!r} names a folder, not an audio file; fix that line's path")
    return None


def music_info(meta: dict[str, Any]) -> dict[str, Any]:
    """The sidecar's MusicInfo fields, verbatim, in the sidecar's order (what audiocraft reads of it)."""
    return {k: v for k, v in meta.items() if k in MUSIC_INFO_FIELDS}


class _NotFinite:
    """A NaN / Infinity / too-large number, kept as a marker until the fields that are used are known."""

    def __init__(self, text: str, constant: bool) -> None:
        self.text, self.constant = text, constant


def _marked_float(text: str) -> float | _NotFinite:
    value = float(text)
    return value if math.isfinite(value) else _NotFinite(text, constant=False)


def _check_finite(value: Any) -> None:
    """Raises NotJsonConstant (refuse_constant's / finite_float's words) for the first marker inside `value`."""
    if isinstance(value, _NotFinite):
        refuse_constant(value.text) if value.constant else finite_float(value.text)
    for v in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
        _check_finite(v)


def load_json_metadata(data: bytes, where: str, origin: str, keep: tuple[str, ...] | None = None) -> dict[str, Any]:
    """A metadata file's JSON object; MetadataError (that track's failure) for anything a shard's JSON cannot hold.
    `keep`: only these fields are read (audiocraft's MusicInfo), so a field never used can never fail the track."""
    try:
        meta = json.loads(data.decode("utf-8"), parse_constant=lambda c: _NotFinite(c, constant=True),
                          parse_float=_marked_float)  # fmt: skip
        if isinstance(meta, dict) and keep is not None:
            meta = {k: v for k, v in meta.items() if k in keep}
        _check_finite(meta)
    except NotJsonConstant as e:
        raise MetadataError(f"{where}: metadata {origin} {e}") from e
    except RecursionError as e:
        raise MetadataError(f"{where}: metadata {origin} is nested too deeply to read; flatten it") from e
    except ValueError as e:
        raise MetadataError(f"{where}: metadata {origin} is not UTF-8 JSON ({e}); fix or delete it") from e
    if not isinstance(meta, dict):
        raise MetadataError(f"{where}: metadata {origin} is not a JSON object")
    return meta


def read_sidecar(audio: Path, where: str) -> tuple[dict[str, Any], str | None]:
    """The track's MusicInfo fields from `<audio without extension>.json`, and the sidecar's name; ({}, None) when
    there is none."""
    sidecar = audio.with_suffix(".json")  # path_problem already refused a path without a file name
    if not sidecar.is_file():
        return {}, None
    try:
        data = sidecar.read_bytes()
    except OSError as e:
        raise MetadataError(f"{where}: cannot read metadata {shown(str(sidecar))}: {e.strerror or e}") from e
    meta = music_info(load_json_metadata(data, where, shown(str(sidecar)), keep=MUSIC_INFO_FIELDS))
    try:
        json.dumps(meta, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError as e:  # "\ud83c" without its pair: JSON reads it, UTF-8 cannot hold it
        raise MetadataError(
            f"{where}: metadata {shown(str(sidecar))} has a lone surrogate {shown(e.object[e.start : e.end])} (which "
            "is not Unicode text: half of an escaped pair such as \\ud83c\\udfb8); fix that escape"
        ) from e
    except ValueError as e:  # a non-finite number the sample json cannot hold (the reader refuses them first)
        raise MetadataError(f"{where}: metadata {shown(str(sidecar))} cannot be stored as strict JSON: {e}") from e
    return meta, shown(sidecar.name)


def common_root(paths: list[Path]) -> Path:
    """The deepest folder holding every path (their files' common directory)."""
    return Path(os.path.commonpath([str(p.parent) for p in paths])) if paths else Path.cwd()


def _usable(raw: str, where: str) -> bool:
    """Whether a line's file counts toward the common root: it exists and its path has no problem."""
    return path_problem(raw, where) is None and resolve_path(raw).is_file()


def _relative(audio: Path, root: Path, where: str, raw: str, automatic: bool, usable: bool) -> str:
    try:
        return audio.relative_to(root).as_posix()
    except ValueError:
        if automatic and usable:  # outside a kept root (a new sibling folder): its path from that root
            return Path(os.path.relpath(audio, root)).as_posix()
        if automatic:  # a missing or bad file left out of the common root: its absolute path names it
            return audio.as_posix()
        raise SourceError(
            f"{where}: path {shown(raw)!r} is not inside source.root={root}; set source.root to a folder holding "
            "every track (or leave it unset: the tracks' common folder)"
        ) from None


def id_root(
    manifest: Path, parsed: list[tuple[int, dict[str, Any]]], root: Path | None, kept: Path | None = None
) -> Path:
    """The folder track ids are relative to: `source.root`; else `kept` (the root an existing set in out_dir recorded)
    while it holds an existing file whose path has no problem; else the deepest folder holding every such file (all
    the lines' files when none exists)."""
    if root is not None:
        return Path(os.path.abspath(root))
    usable = [id_path(d["path"]) for line, d in parsed if _usable(d["path"], f"{manifest}:{line}")]
    if kept is not None and any(p.is_relative_to(kept) for p in usable):
        return kept
    return common_root(usable or [id_path(d["path"]) for _, d in parsed])


def read_audiocraft(manifest: Path, root: Path | None = None) -> list[Track]:
    """Every track of the manifest, in line order (audiocraft_tracks without the root)."""
    return audiocraft_tracks(manifest, root)[0]


def audiocraft_tracks(
    manifest: Path, root: Path | None = None, kept_root: Path | None = None
) -> tuple[list[Track], Path]:
    """Every track of the manifest, in line order, and the id root; SourceError on the first unusable line. `root`:
    `source.root` (None: found by id_root, `kept_root` first). A repeated path is kept here (the plan records it as a
    duplicate)."""
    manifest = Path(manifest)
    parsed = [(line, _parse_line(manifest, line, text)) for line, text in read_lines(manifest)]
    automatic, root = root is None, id_root(manifest, parsed, root, kept_root)
    tracks: list[Track] = []
    for line, d in parsed:
        where, audio = f"{manifest}:{line}", resolve_path(d["path"])
        problem = path_problem(d["path"], where)
        usable = problem is None and audio.is_file()
        rel = _relative(id_path(d["path"]), root, where, d["path"], automatic or problem is not None, usable)
        rel = rel.replace("\0", "\\0")  # a NUL byte (a bad_path) shown as '\0': no source_file holds one
        meta, meta_file, meta_error = {}, None, None
        if problem is None:
            try:
                meta, meta_file = read_sidecar(audio, where)
            except MetadataError as e:  # this track's problem: recorded as its failure, the other tracks go on
                meta_error = str(e)
        tracks.append(
            Track(
                line=line, source_path=shown(d["path"]), audio_path=audio, source_file=shown(rel), metadata=meta,
                weight=1.0 if d.get("weight") is None else float(d["weight"]),
                declared_duration_s=None if d.get("duration") is None else float(d["duration"]),
                metadata_file=meta_file, metadata_error=meta_error, problem=problem,
            )
        )  # fmt: skip
    return tracks, root
