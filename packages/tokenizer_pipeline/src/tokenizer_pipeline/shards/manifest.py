"""The shard-set contract as frozen dataclasses: `<ytid>.json` (`SampleRecord`) and `manifest.json` (`Manifest`).

See docs/shard-format.md; any change to what is written here bumps `FORMAT_VERSION`.
No timestamps anywhere: the same inputs and config give byte-identical files.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT_NAME = "musiccaps-encodec-shards"
FORMAT_VERSION = 5  # the one version written and read (docs/shard-format.md)
PACKAGE = "tokenizer_pipeline"
PACKAGE_VERSION = "0.1.0"
CODES_MEMBER = "codes.npy"  # tar member suffix: `<ytid>.codes.npy`
JSON_MEMBER = "json"  # tar member suffix: `<ytid>.json`
CODES_INFO = {"member": CODES_MEMBER, "dtype": "int16", "layout": "[T, K] frame-major"}

# Failures a rerun retries (`retryable: true` in failures.jsonl): their cause is outside the file and can go away.
# encode_error always (out of memory, a device error); missing_audio once the file exists; needs_ffmpeg once FFmpeg
# is installed. Any failure caused by running out of memory (MemoryError, torch.OutOfMemoryError) is retryable too.
# The others are final: the same bytes fail the same way, and a rerun redoes them only when the file changes.
RETRYABLE_REASONS = frozenset({"missing_audio", "needs_ffmpeg", "encode_error"})


@dataclass(frozen=True)
class SampleRecord:
    """`<ytid>.json`: the clip's CSV metadata plus what was encoded."""

    ytid: str  # sample key, no '.'
    start_s: float  # window in the source video (CSV)
    end_s: float
    audioset_positive_labels: list[str]  # CSV column split on ','
    aspect_list: list[str]  # CSV column parsed as a list literal
    caption: str  # verbatim
    author_id: int
    is_balanced_subset: bool
    is_audioset_eval: bool
    split: str  # train | eval (configurable names)
    csv_row: int  # 1-based CSV line (header is line 1)
    n_frames: int  # T == codes.npy.shape[0]
    n_codebooks: int  # K == codes.npy.shape[1]
    duration_s: float  # seconds of audio encoded (after cropping)
    source_file: str  # audio file name relative to audio_dir
    source_sha256: str  # sha256 of the audio file's bytes

    def to_json_bytes(self) -> bytes:
        return dumps_strict(asdict(self)).encode("utf-8")


@dataclass(frozen=True)
class SegmentSampleRecord:
    """`<key>.json` of a segment of a track from source=audiocraft|audiofolder.

    The fields the trainer reads are those of a MusicCaps sample (ytid, caption, aspect_list, split, n_frames, ...);
    the MusicCaps-only CSV columns are absent and the segment's provenance is added.
    """

    ytid: str  # sample key: <track_id>_<segment_index>
    start_s: float  # = segment_start_s: the window in the source track, seconds
    end_s: float
    aspect_list: list[str]  # keywords of source.aspect_fields (audiocraft: keywords, genre, moods, instrument)
    caption: str  # never empty (a track without one is a no_caption failure)
    split: str
    csv_row: int  # 1-based line of the manifest / metadata file naming the track
    n_frames: int  # T == codes.npy.shape[0]
    n_codebooks: int  # K
    duration_s: float  # seconds of audio encoded
    source_file: str  # relative to the source's root (audiocraft: source.root or the tracks' common folder)
    source_sha256: str  # sha256 of the audio file's bytes
    source_kind: str  # audiocraft | audiofolder
    track_id: str
    source_path: str  # the path as the source gives it (audiocraft `path`, audiofolder `file_name`)
    segment_index: int  # from 0, in time order
    segment_start_s: float
    segment_end_s: float
    weight: float  # audiocraft's per-track sampling weight (1.0 when null or absent); > 0
    metadata: dict[str, Any]  # every metadata field the source gave, verbatim

    def to_json_bytes(self) -> bytes:
        return dumps_strict(asdict(self)).encode("utf-8")


@dataclass(frozen=True)
class ShardEntry:
    path: str  # relative to the shard-set directory, e.g. "train/shard-000000.tar"
    n_samples: int  # samples (clips) in the tar
    bytes: int  # tar file size
    sha256: str  # of the tar file's bytes


@dataclass(frozen=True)
class SplitSummary:
    shards: list[ShardEntry]  # in shard-number order
    n_samples: int  # sum over shards
    audio_seconds: float  # sum of duration_s
    n_frames: int  # sum of n_frames
    # the split's index sidecar (shards/split_index.py): path, bytes, sha256, n_samples and the summaries
    index: dict[str, Any] | None = None


@dataclass(frozen=True)
class FailureRecord:
    """A CSV row that produced no sample; also one line of failures.jsonl."""

    ytid: str
    csv_row: int
    split: str
    reason: str  # one of audio.read_audio.REASONS: missing_audio | needs_ffmpeg | decode_error | ...
    detail: str = ""  # what happened, naming the file, e.g. "audio file not found (audio/x.wav)"
    error_type: str | None = None  # type name of the exception behind it (e.g. "LibsndfileError"), if any
    retryable: bool = False  # a rerun retries it (RETRYABLE_REASONS, or out of memory); else final


@dataclass(frozen=True)
class CodecInfo:
    name_or_path: str  # hub id or local directory given by the user
    model_class: str  # "EncodecModel"
    sampling_rate: int  # Hz the codec consumes
    frame_rate: int  # code frames per second
    n_codebooks: int  # K
    codebook_size: int  # C: codes are 0..C-1
    bandwidth_kbps: float
    weights_sha256: str  # sha256 over the weight files' bytes (sorted by name)
    dtype: str  # inference dtype: float32 (IEEE, TF32 off on CUDA), or bfloat16 by explicit option
    library_versions: dict[str, str]
    device: str | None = None  # device type that encoded: cpu | cuda | mps
    num_threads: int | None = None  # torch intra-op threads while encoding (CPU results can depend on it)
    # The codec's config.json fields that change what it computes (encode.IDENTITY_CONFIG_FIELDS)
    config: dict[str, Any] | None = None
    # The codec directory relative to the shard set's directory (None for a hub id): decode finds it from anywhere
    path_from_set: str | None = None


@dataclass(frozen=True)
class Manifest:
    codec: CodecInfo
    splits: dict[str, SplitSummary]
    totals: dict[str, Any]  # rows, encoded, failed, audio_seconds, n_frames
    failures: list[FailureRecord]
    source: dict[
        str, Any
    ]  # kind, sha256, split_rule + musiccaps: csv, csv_sha256, audio_dir | audiocraft: manifest | audiofolder: dir
    config: dict[str, Any]  # the resolved pipeline config
    segmentation: dict[str, Any] | None = None  # audiocraft / audiofolder: the segment plan (docs/shard-format.md)
    codes: dict[str, str] = field(default_factory=lambda: dict(CODES_INFO))
    created_by: dict[str, str] = field(default_factory=lambda: {"package": PACKAGE, "version": PACKAGE_VERSION})
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION

    def to_json(self) -> str:
        d = asdict(self)
        ordered = {k: d[k] for k in ("format", "format_version", "created_by", "codec", "codes", "splits",
                                     "totals", "failures", "source", "segmentation", "config")}  # fmt: skip
        return dumps_strict(ordered, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse manifest.json; raises ValueError on another format or version."""
        d = json.loads(text)
        if d.get("format") != FORMAT_NAME:
            raise ValueError(f"not a {FORMAT_NAME} manifest (format={d.get('format')!r})")
        if d.get("format_version") != FORMAT_VERSION:
            raise ValueError(other_version_line("manifest.json", d.get("format_version")))
        splits = {
            n: SplitSummary(**s | {"shards": [ShardEntry(**e) for e in s["shards"]]}) for n, s in d["splits"].items()
        }
        failures = [FailureRecord(**f) for f in d["failures"]]
        return cls(**d | {"codec": CodecInfo(**d["codec"]), "splits": splits, "failures": failures})


def other_version_line(where: object, version: object) -> str:
    """The one line for a set of another format version: what rebuilds it."""
    return (
        f"{where}: format_version {version!r}; this tokenizer_pipeline reads version {FORMAT_VERSION} only: rebuild "
        f"the set with `python -m tokenizer_pipeline out_dir=<the set> overwrite=true` (or `make shards`)"
    )


def dumps_strict(obj: Any, **kw: Any) -> str:
    """json.dumps that refuses NaN/Infinity (not JSON: other readers reject them), UTF-8 kept as is."""
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, **kw)


def library_versions() -> dict[str, str]:
    import numpy
    import soxr
    import torch
    import transformers
    import webdataset

    mods = {"torch": torch, "soxr": soxr, "transformers": transformers, "webdataset": webdataset, "numpy": numpy}
    return {name: str(getattr(m, "__version__", "unknown")) for name, m in mods.items()}


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a temp file in the same directory, fsync, then rename over `path`."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, Ctrl-C: no half-written temp file stays behind
        tmp.unlink(missing_ok=True)
        raise


def write_failures_jsonl(path: Path, failures: list[FailureRecord]) -> None:
    write_text_atomic(path, "".join(dumps_strict(asdict(f)) + "\n" for f in failures))
