"""The samples inside a shard's tars: member names, the key rule, and the safe sample decoder.

WebDataset is read WITHOUT `.decode()` (its default decoders unpickle `.pyd`/`.pickle` members): a sample holds
exactly `codes.npy` (`np.load(allow_pickle=False)`) and `json`, anything else is an error naming the shard and
member. Tar member names are checked up front (WebDataset silently skips names without a dot). `load_split` reads a
split into memory (tools, contract tests); training reads one clip at a time (`clip_reader`) with the same decoder.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import webdataset as wds

from adapter_trainer.data.sample_keys import KEY_RULE, key_problem
from adapter_trainer.data.shards import ShardFormatError, ShardSet, open_tar, verify_files

CODES_MEMBER = "codes.npy"
JSON_MEMBER = "json"
ALLOWED_MEMBERS = frozenset({CODES_MEMBER, JSON_MEMBER})


@dataclass(frozen=True)
class Clip:
    key: str  # ytid
    caption: str
    aspects: tuple[str, ...]  # the CSV's aspect_list
    codes: np.ndarray  # [T, K] int16, raw codes 0..C-1


_MEMBER_RE = re.compile(r"^(?P<key>[^./][^./]*)\.(?P<member>.+)$")


def _check_key(key: str, path: Path | str, member: str) -> None:
    """The contract's key rule (`sample_keys`); ShardFormatError naming the shard and the member."""
    problem = key_problem(key)
    if problem:
        raise ShardFormatError(
            f"{path}: member {member!r}: sample key {problem} ({KEY_RULE}; docs/shard-format.md). Refusing the "
            "shard without decoding it; regenerate it with tokenizer_pipeline"
        )


def check_member(m: tarfile.TarInfo, path: Path | str) -> tuple[str, str]:
    """(key, member) of a regular file `<key>.codes.npy` or `<key>.json` whose key follows the key rule."""
    match = _MEMBER_RE.match(m.name)
    if not m.isfile() or match is None or match["member"] not in ALLOWED_MEMBERS:
        raise ShardFormatError(
            f"{path}: unexpected tar member {m.name!r} (allowed per sample: <key>.codes.npy, <key>.json; "
            f"docs/shard-format.md). Refusing the shard without decoding it; regenerate it with tokenizer_pipeline"
        )
    _check_key(match["key"], path, m.name)
    return match["key"], match["member"]


def _check_tar_members(path: Path | str, fileobj: BinaryIO) -> None:
    """Every tar member is a regular file named `<key>.codes.npy` or `<key>.json` (headers only, no payload read)."""
    with tarfile.open(None, "r", fileobj=fileobj) as tar:
        for m in tar.getmembers():
            check_member(m, path)


def decode_sample(sample: dict, url: str, n_codebooks: int, codebook_size: int) -> Clip:
    """Raw members ({"__key__", "codes.npy", "json"} bytes) -> Clip: no pickles, int16 codes [T > 0, K] inside the
    codebook, a json that agrees with them; else ShardFormatError naming the sample."""
    key = sample["__key__"]
    _check_key(key, url, f"{key}.{CODES_MEMBER}")
    members = {k for k in sample if not k.startswith("__")}
    if members != ALLOWED_MEMBERS:
        extra = sorted(members - ALLOWED_MEMBERS)
        missing = sorted(ALLOWED_MEMBERS - members)
        raise ShardFormatError(
            f"{url}: sample {key!r} has unexpected members {extra} / missing {missing}; each sample holds exactly "
            f"{key}.codes.npy and {key}.json (docs/shard-format.md). Nothing was decoded; regenerate the shard"
        )
    try:
        codes = np.load(io.BytesIO(sample[CODES_MEMBER]), allow_pickle=False)
        meta = json.loads(sample[JSON_MEMBER].decode("utf-8"))
    except ValueError as e:  # np.load refusing pickles and JSON/Unicode errors are all ValueErrors
        raise ShardFormatError(f"{url}: sample {key!r} does not decode safely: {e}") from e
    if codes.dtype != np.int16 or codes.ndim != 2 or codes.shape[1] != n_codebooks or codes.shape[0] == 0:
        raise ShardFormatError(
            f"{url}: sample {key!r} codes.npy is {codes.dtype} {list(codes.shape)}, expected int16 [T>0, {n_codebooks}]"
        )
    if int(codes.min()) < 0 or int(codes.max()) >= codebook_size:
        raise ShardFormatError(
            f"{url}: sample {key!r} has codes outside 0..{codebook_size - 1} "
            f"(min {int(codes.min())}, max {int(codes.max())})"
        )
    if (
        not isinstance(meta, dict)
        or meta.get("ytid") != key
        or meta.get("n_frames") != codes.shape[0]
        or not isinstance(meta.get("caption"), str)
        or not isinstance(meta.get("aspect_list"), list)
    ):
        raise ShardFormatError(
            f"{url}: sample {key!r} json disagrees with the sample (ytid / n_frames / caption / "
            f"aspect_list); regenerate the shard"
        )
    aspects = tuple(str(a) for a in meta["aspect_list"])
    return Clip(key=key, caption=meta["caption"], aspects=aspects, codes=codes)  # codes: [T, K] int16


def iter_clips(shard_set: ShardSet, split: str) -> Iterator[Clip]:
    """Yield the split's clips in shard order, decoding only codes.npy and json. Raises ShardFormatError."""
    entries = shard_set.splits.get(split, ())
    for entry in entries:
        url = entry.location
        with open_tar(entry) as held:
            _check_tar_members(url, held)
            ds = wds.WebDataset([str(entry.tar)], shardshuffle=False, empty_check=False)
            n = 0
            for sample in ds:
                yield decode_sample(sample, url, shard_set.n_codebooks, shard_set.codebook_size)
                n += 1
        if n != entry.n_samples:
            raise ShardFormatError(
                f"{url}: {n} samples, but {shard_set.manifest_path} lists {entry.n_samples}; regenerate the shard set"
            )


def load_split(sets: list[ShardSet], split: str, *, max_clips: int = 0, sha256: bool = False) -> list[Clip]:
    """All clips of `split` across `sets` (in data.shards order), into memory; max_clips > 0 keeps the first N."""
    clips: list[Clip] = []
    seen: dict[str, Path] = {}
    for s in sets:
        verify_files(s, split, sha256=sha256)
        for clip in iter_clips(s, split):
            if clip.key in seen:
                raise ShardFormatError(
                    f"sample key {clip.key!r} appears in {seen[clip.key]} and {s.manifest_path}; "
                    f"keys must be unique across data.shards (the same set listed twice?)"
                )
            seen[clip.key] = s.manifest_path
            clips.append(clip)
            if max_clips and len(clips) >= max_clips:
                return clips
    return clips
