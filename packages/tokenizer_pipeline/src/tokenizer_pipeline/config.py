"""The stage-1 config schema: typed dataclasses that Hydra composes `conf/tokenizer_pipeline/*.yaml` onto.

`__main__.py` registers `PipelineConfig` in Hydra's ConfigStore; `run.pipeline` takes it, typed, and nothing else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

# Default tolerance between a file's duration and its CSV window: accepts packet-boundary cuts and lossy codecs'
# encoder delay, still rejects a truncated or uncut file.
DURATION_TOLERANCE_S = 0.5


@dataclass
class CodecConfig:
    # hub id (must be in the local HF cache offline) or a save_pretrained dir
    name_or_path: str = "facebook/encodec_32khz"
    device: str = "auto"  # auto (cuda > mps > cpu) | cpu | cuda | mps; under torchrun each rank uses cuda:LOCAL_RANK
    dtype: str = "float32"  # float32 | bfloat16 (explicit opt-in: faster on GPU, may change codes)
    # clips per forward pass, or auto: the per-device number of encode.AUTO_BATCH_SIZE; the number used is recorded
    # in the manifest (codes are reproducible for that number). Higher = more memory
    batch_size: Any = "auto"  # int >= 1 | auto (Any: OmegaConf has no int-or-string type)
    bandwidth_kbps: float | None = None  # null = smallest supported (2.2 kbps = 4 codebooks for encodec_32khz)
    pad_batches: bool = False  # true pads unequal lengths together (faster; may change the last frames' codes)


@dataclass
class SplitConfig:
    eval_column: str = "is_audioset_eval"  # boolean CSV column: True -> eval_name, False -> train_name
    train_name: str = "train"
    eval_name: str = "eval"
    # audiocraft / audiofolder without split folders: this fraction of TRACKS goes to eval_name, chosen by the sha256
    # of the audio file (sources/splits.py), so every segment of a track lands in one split and no track moves when
    # the collection grows, moves or is renamed. MusicCaps ignores it.
    eval_fraction: float = 0.1


@dataclass
class SourceConfig:
    """Where the audio and captions come from (`source=musiccaps|audiocraft|audiofolder`, conf/.../source/)."""

    kind: str = "musiccaps"  # musiccaps (csv + audio_dir) | audiocraft (manifest) | audiofolder (dir)
    manifest: str | None = None  # audiocraft: egs/<name>/data.jsonl or .jsonl.gz
    # audiocraft: the folder track ids are relative to (null = the root the set in out_dir recorded while it holds a
    # track, else the deepest folder holding every track), so a moved dataset keeps its keys; pin it to keep keys
    # across separate sets of a collection that grows outside today's common folder
    root: str | None = None
    dir: str | None = None  # audiofolder: audio files + metadata.csv / metadata.jsonl (optional split folders)
    caption: str = "field"  # field: the caption_column's text | template: `template` filled from the metadata
    caption_column: str = "description"  # audiocraft: description; audiofolder: caption (falls back to text)
    template: str = "{description} genre: {genre}. bpm: {bpm}. key: {key}"  # a missing field drops its label text
    # metadata fields whose values (a keyword or a list of them) become the sample's aspect_list; fields that are
    # not audiocraft's are split on commas (aspect_list "a, b" or a list literal "['a', 'b']")
    aspect_fields: list[str] = field(
        default_factory=lambda: ["keywords", "genre", "moods", "instrument", "aspect_list"]
    )


@dataclass
class SegmentConfig:
    """How full-length tracks (audiocraft, audiofolder) are cut into samples; MusicCaps windows are not cut."""

    seconds: float = 10.0  # segment length; equal-length segments batch together
    hop_seconds: float | None = None  # start-to-start distance; null = seconds (no overlap)
    min_seconds: float | None = None  # a shorter last segment is dropped (counted); null = 0.8 x seconds


@dataclass
class ShardConfig:
    max_samples: int = 256  # clips per shard-%06d.tar; ~256 x 10 s x 50 Hz x 4 int16 = ~1 MB per shard


@dataclass
class PipelineConfig:
    csv: str = "data/musiccaps/musiccaps-public.csv"  # MusicCaps metadata (relative to the launch directory)
    audio_dir: str | None = MISSING  # source=musiccaps: directory with {ytid}.<ext> files; required (see --explain)
    out_dir: str = "build/shards"  # shard set goes here
    # extensions tried for {ytid}.<ext>, in this order
    audio_ext: list[str] = field(default_factory=lambda: ["wav", "flac", "mp3", "ogg", "m4a", "opus", "webm"])
    crop_to_window: bool = False  # true: audio files are full-length videos, cut [start_s, end_s] here
    min_seconds: float = 1.0  # shorter clips are recorded as failures
    duration_tolerance_s: float = DURATION_TOLERANCE_S  # |file duration - CSV window| allowed, else duration_mismatch
    max_failure_fraction: float = 0.5  # exit non-zero above this fraction of failed rows
    overwrite: bool = False  # true: delete shards of a previous, different config in out_dir
    limit: int | None = None  # first N CSV rows only (null = all); for quick tries
    # decode+resample processes per rank; null = CPU cores / ranks on this node; 0 = in the main process
    workers: int | None = None
    prefetch: int = 4  # decoded clips each worker may hold ahead of the encoder (memory: workers x prefetch x one clip)
    # torch intra-op threads of the encoder; null = torch's default here. Recorded in the manifest: codes are
    # reproducible only with the same thread count
    threads: int | None = None
    codec: CodecConfig = field(default_factory=CodecConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    shard: ShardConfig = field(default_factory=ShardConfig)
    source: SourceConfig = field(default_factory=SourceConfig)
    segment: SegmentConfig = field(default_factory=SegmentConfig)


PATH_KEYS = ("csv", "audio_dir", "out_dir", "source.manifest", "source.root", "source.dir", "codec.name_or_path")


def expand_user(cfg: PipelineConfig) -> PipelineConfig:
    """`cfg` with a leading `~` of each path key expanded (zsh passes `out_dir=~/x` on as typed, Hydra as quoted)."""
    from dataclasses import replace

    def expanded(node: Any, dotted: str) -> Any:  # a config section, a dotted key in it
        head, _, rest = dotted.partition(".")
        value = getattr(node, head)
        if rest:
            return replace(node, **{head: expanded(value, rest)})
        if isinstance(value, str) and value.startswith("~"):
            return replace(node, **{head: os.path.expanduser(value)})
        return node

    for key in PATH_KEYS:
        cfg = expanded(cfg, key)
    return cfg


# Keys that never change a shard's bytes: left out of the manifest and of the resume fingerprint, so
# 0, 1 or 8 workers (or another prefetch depth) give the same set and can resume each other.
OUTPUT_NEUTRAL_KEYS = ("workers", "prefetch")
