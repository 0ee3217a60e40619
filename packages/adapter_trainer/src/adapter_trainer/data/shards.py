"""Read shard sets written per docs/shard-format.md: manifest checks at startup, then a safe sample reader.

Safety: samples are read with `wds.WebDataset(urls, shardshuffle=False)` WITHOUT `.decode()`. WebDataset's
default decoders unpickle `.pyd`/`.pickle` members, so a planted member would run code. Here each sample
must hold exactly `codes.npy` (decoded with `np.load(..., allow_pickle=False)`) and `json` (`json.loads`);
anything else is an error naming the shard and the member. Raw tar member names are also checked up front
(WebDataset silently skips names without a dot, so they would otherwise go unnoticed).

Memory: the recipe never holds a split's codes. `build_index` scans only the tar HEADERS (each member's name,
size and `offset_data`; no payload is read) and keeps a `SplitIndex` of ~40 bytes per clip in numpy arrays;
`ClipReader.read(i)` then seeks to one clip's two members and decodes them with the same checks. DataLoader
workers read, crop, tokenize and collate (adapter_trainer.data.streaming). `load_split` (everything into memory) stays
for tools and the contract tests.

Why random access by member offsets rather than shard-level shuffling with a shuffle buffer: the recipe's
order is a seeded permutation of ALL clips per epoch, so resume is one integer and 1 process x batch 8 sees
exactly the examples of 2 ranks x batch 4 (each rank reads its own slice of each global batch, whatever the
number of shards: no nodesplitter, no hang with fewer shards than ranks x workers). A shuffle buffer would
change the order (and the learning curve) with the buffer size, the number of shards per rank and the
workers, and makes exact resume a buffer snapshot. The cost is one seek per clip, which on local disk
(page cache or SSD) is far below a training step (see trainer_data_wait_fraction in docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import webdataset as wds

from adapter_trainer.data.sample_keys import KEY_RULE, key_problem, shard_path_problem
from adapter_trainer.errors import UserError

FORMAT_NAME = "musiccaps-encodec-shards"
# 2 adds codec identity fields, 3 optional sample/manifest fields (sources, segments, `weight`): a newer set's
# samples keep every field version 1 has, and fields the trainer does not know are ignored
SUPPORTED_VERSIONS = (1, 2, 3)
CODES_MEMBER = "codes.npy"
JSON_MEMBER = "json"
ALLOWED_MEMBERS = frozenset({CODES_MEMBER, JSON_MEMBER})


class ShardFormatError(UserError, ValueError):
    """A shard set breaks docs/shard-format.md or does not fit the model; the message names the file and fix."""


@dataclass(frozen=True)
class ShardEntry:
    """One tar of a split, as the manifest lists it (tokenizer_pipeline.shards.manifest.ShardEntry has the same fields)."""

    path: str  # relative to the shard-set directory, e.g. "train/shard-000000.tar" (the manifest's value)
    n_samples: int  # samples (clips) in the tar
    bytes: int  # tar file size
    sha256: str  # of the tar file's bytes
    tar: Path  # root / path: the file this process reads


@dataclass(frozen=True)
class ShardSet:
    """One shard-set directory, as promised by its manifest.json."""

    root: Path
    manifest_path: Path
    manifest_sha256: str  # sha256 of manifest.json's bytes: the data identity stored in checkpoints
    format_version: int
    n_codebooks: int  # K
    codebook_size: int  # C
    frame_rate: float  # code frames per second
    splits: dict[str, tuple[ShardEntry, ...]]


@dataclass(frozen=True)
class Clip:
    key: str  # ytid
    caption: str
    aspects: tuple[str, ...]  # the CSV's aspect_list
    codes: np.ndarray  # [T, K] int16, raw codes 0..C-1


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _require(manifest: dict, dotted: str, where: Path) -> object:
    node: object = manifest
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ShardFormatError(
                f"{where}: missing field '{dotted}' (docs/shard-format.md); regenerate the set with "
                f"`python -m tokenizer_pipeline` and check it with `python -m tokenizer_pipeline.verify {where.parent}`"
            )
        node = node[part]
    return node


def read_manifest(root: str | Path) -> ShardSet:
    """Parse and check `<root>/manifest.json` (format name and version). Raises ShardFormatError."""
    root = Path(root).expanduser().resolve()
    mpath = root / "manifest.json"
    if not mpath.is_file():
        raise ShardFormatError(
            f"{mpath} not found: {root} is not a complete shard set (the manifest is written last). "
            f"Create it with `python -m tokenizer_pipeline out_dir={root}` (or `make demo-shards`) "
            f"or point data.shards at an existing set"
        )
    raw = mpath.read_bytes()
    try:
        manifest = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ShardFormatError(f"{mpath}: not valid JSON ({e}); regenerate the shard set") from e
    fmt = _require(manifest, "format", mpath)
    if fmt != FORMAT_NAME:
        raise ShardFormatError(
            f"{mpath}: format={fmt!r}, expected {FORMAT_NAME!r}; data.shards must list "
            f"directories written by tokenizer_pipeline"
        )
    version = _require(manifest, "format_version", mpath)
    if version not in SUPPORTED_VERSIONS:
        raise ShardFormatError(
            f"{mpath}: format_version={version!r} is not supported by this adapter_trainer "
            f"(supported: {', '.join(map(str, SUPPORTED_VERSIONS))}); regenerate the set with a matching "
            f"tokenizer_pipeline or upgrade adapter_trainer"
        )
    splits: dict[str, tuple[ShardEntry, ...]] = {}
    for name, split in dict(_require(manifest, "splits", mpath)).items():  # type: ignore[arg-type]
        entries = []
        for s in split.get("shards", []):
            rel = Path(s["path"])
            problem = shard_path_problem(root, s["path"])
            if problem:
                raise ShardFormatError(
                    f"{mpath}: shard path {s['path']!r} {problem}; refusing the set (docs/shard-format.md)"
                )
            entries.append(
                ShardEntry(str(s["path"]), int(s["n_samples"]), int(s["bytes"]), str(s["sha256"]), root / rel)
            )
        splits[name] = tuple(entries)
    return ShardSet(
        root=root,
        manifest_path=mpath,
        manifest_sha256=hashlib.sha256(raw).hexdigest(),
        format_version=int(version),  # type: ignore[arg-type]
        n_codebooks=int(_require(manifest, "codec.n_codebooks", mpath)),  # type: ignore[arg-type]
        codebook_size=int(_require(manifest, "codec.codebook_size", mpath)),  # type: ignore[arg-type]
        frame_rate=float(_require(manifest, "codec.frame_rate", mpath)),  # type: ignore[arg-type]
        splits=splits,
    )


def check_compatible(
    sets: list[ShardSet], *, model_n_codebooks: int, model_codebook_size: int, audio_lm: str = "the audio LM"
) -> None:
    """Refuse sets that disagree with each other or with the audio LM (n_codebooks, codebook_size, frame_rate)."""
    if not sets:
        raise ShardFormatError("no shard sets given; set data.shards=[path/to/shard-set]")
    first = sets[0]
    for other in sets[1:]:
        for attr in ("n_codebooks", "codebook_size", "frame_rate"):
            a, b = getattr(first, attr), getattr(other, attr)
            if a != b:
                raise ShardFormatError(
                    f"shard sets disagree on codec.{attr}: {a} in {first.manifest_path} but {b} in "
                    f"{other.manifest_path}. Codes from different codecs cannot be mixed; list only sets made "
                    f"with the same codec in data.shards"
                )
    for attr, want in (("n_codebooks", model_n_codebooks), ("codebook_size", model_codebook_size)):
        have = getattr(first, attr)
        if have != want:
            raise ShardFormatError(
                f"shards have codec.{attr}={have} ({', '.join(str(s.manifest_path) for s in sets)}) but the "
                f"audio LM {audio_lm} expects {want}. Re-encode the audio with the codec that matches the "
                f"MusicGen model (e.g. facebook/encodec_32khz for facebook/musicgen-small), or set "
                f"model.audio_lm to a decoder with {attr}={have}"
            )


def verify_files(shard_set: ShardSet, split: str, *, sha256: bool = False) -> None:
    """Every shard listed for `split` exists with the listed size (and sha256 if asked)."""
    if split not in shard_set.splits:
        raise ShardFormatError(
            f"{shard_set.manifest_path}: no split {split!r} (has: {', '.join(sorted(shard_set.splits)) or 'none'}); "
            f"set data.train_split / data.eval_split"
        )
    for entry in shard_set.splits[split]:
        if not entry.tar.is_file():
            raise ShardFormatError(
                f"{entry.tar} is listed in {shard_set.manifest_path} but missing; regenerate or re-copy the shard set"
            )
        size = entry.tar.stat().st_size
        if size != entry.bytes:
            raise ShardFormatError(
                f"{entry.tar}: {size} bytes, but {shard_set.manifest_path} lists {entry.bytes}; "
                f"the file is truncated or replaced; regenerate or re-copy the shard set"
            )
        if sha256 and sha256_file(entry.tar) != entry.sha256:
            raise ShardFormatError(
                f"{entry.tar}: sha256 differs from {shard_set.manifest_path}; the file is "
                f"corrupt or replaced; regenerate or re-copy the shard set"
            )


_MEMBER_RE = re.compile(r"^(?P<key>[^./][^./]*)\.(?P<member>.+)$")


def _check_key(key: str, path: Path | str, member: str) -> None:
    """The contract's key rule (`sample_keys`); ShardFormatError naming the shard and the member."""
    problem = key_problem(key)
    if problem:
        raise ShardFormatError(
            f"{path}: member {member!r}: sample key {problem} ({KEY_RULE}; docs/shard-format.md). Refusing the "
            "shard without decoding it; regenerate it with tokenizer_pipeline"
        )


def _check_tar_members(path: Path) -> None:
    """Every tar member is a regular file named `<key>.codes.npy` or `<key>.json` (headers only, no payload read)."""
    with tarfile.open(path, "r") as tar:
        for m in tar.getmembers():
            match = _MEMBER_RE.match(m.name)
            if not m.isfile() or match is None or match["member"] not in ALLOWED_MEMBERS:
                raise ShardFormatError(
                    f"{path}: unexpected tar member {m.name!r} (allowed per sample: <key>.codes.npy, <key>.json; "
                    f"docs/shard-format.md). Refusing the shard without decoding it; regenerate it with tokenizer_pipeline"
                )
            _check_key(match["key"], path, m.name)


def _decode_sample(sample: dict, url: str, n_codebooks: int, codebook_size: int) -> Clip:
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
        _check_tar_members(entry.tar)
        url = str(entry.tar)
        # No .decode(): samples stay raw bytes; only _decode_sample turns them into arrays / dicts.
        ds = wds.WebDataset([url], shardshuffle=False, empty_check=False)
        n = 0
        for sample in ds:
            yield _decode_sample(sample, url, shard_set.n_codebooks, shard_set.codebook_size)
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


def open_shard_sets(
    paths: list[str], *, model_n_codebooks: int, model_codebook_size: int, audio_lm: str = "the audio LM"
) -> list[ShardSet]:
    """read_manifest for every path + check_compatible; the startup check the recipe runs."""
    sets = [read_manifest(p) for p in paths]
    check_compatible(
        sets, model_n_codebooks=model_n_codebooks, model_codebook_size=model_codebook_size, audio_lm=audio_lm
    )
    return sets


# ------------------------------------------------------------------------------------------- streaming index
@dataclass(frozen=True)
class SplitIndex:
    """Where each clip of one split lives, across shard sets (in data.shards order, shard order, tar order).

    Numpy arrays only (no per-clip Python objects): ~40 bytes per clip with 11-character ytids, so a million
    clips cost ~40 MB per rank, not the ~5 GB of keeping the codes.
    """

    shard_paths: tuple[str, ...]  # tar paths; `shard` below indexes into this
    shard: np.ndarray  # [N] int32
    codes_offset: np.ndarray  # [N] int64 byte offset of <key>.codes.npy's payload in its tar
    codes_size: np.ndarray  # [N] int32 payload bytes
    json_offset: np.ndarray  # [N] int64
    json_size: np.ndarray  # [N] int32
    keys: np.ndarray  # [N] fixed-width bytes (ytid, ASCII)
    n_codebooks: int  # K, for the decode checks
    codebook_size: int  # C

    def __len__(self) -> int:
        return int(self.shard.shape[0])

    def key(self, i: int) -> str:
        return self.keys[i].decode("ascii")

    def nbytes(self) -> int:
        """Resident bytes of the per-clip arrays (the part that grows with the corpus)."""
        return sum(
            a.nbytes
            for a in (self.shard, self.codes_offset, self.codes_size, self.json_offset, self.json_size, self.keys)
        )


_SCAN_FIELDS = ("keys", "codes_offset", "codes_size", "json_offset", "json_size")


def scan_shard(path: Path) -> dict[str, np.ndarray]:
    """Tar headers only -> {keys, codes_offset, codes_size, json_offset, json_size} ([n] arrays, tar order).

    Every member must be a regular file `<key>.codes.npy` / `<key>.json`, and every key must have both.
    `tarfile` seeks over payloads when iterating a seekable file, so only 512-byte header blocks are read.
    """
    found: dict[str, dict[str, tuple[int, int]]] = {}
    with tarfile.open(path, "r:") as tar:  # "r:" = uncompressed tar: offsets are file offsets
        for m in tar:
            match = _MEMBER_RE.match(m.name)
            if not m.isfile() or match is None or match["member"] not in ALLOWED_MEMBERS:
                raise ShardFormatError(
                    f"{path}: unexpected tar member {m.name!r} (allowed per sample: <key>.codes.npy, <key>.json; "
                    f"docs/shard-format.md). Refusing the shard without decoding it; regenerate it with tokenizer_pipeline"
                )
            _check_key(match["key"], path, m.name)
            members = found.setdefault(match["key"], {})
            if match["member"] in members:
                raise ShardFormatError(f"{path}: member {m.name!r} appears twice; regenerate the shard")
            members[match["member"]] = (m.offset_data, m.size)
    for key, members in found.items():
        if set(members) != ALLOWED_MEMBERS:
            raise ShardFormatError(
                f"{path}: sample {key!r} has members {sorted(members)}, expected both {key}.codes.npy and "
                f"{key}.json (docs/shard-format.md); regenerate the shard"
            )
        if not key.isascii():
            raise ShardFormatError(f"{path}: sample key {key!r} is not ASCII; MusicCaps keys are ytids")
    vals = list(found.values())
    return {
        "keys": np.array([k.encode("ascii") for k in found], dtype=np.bytes_) if found else np.zeros(0, "S1"),
        "codes_offset": np.array([v[CODES_MEMBER][0] for v in vals], dtype=np.int64),
        "codes_size": np.array([v[CODES_MEMBER][1] for v in vals], dtype=np.int32),
        "json_offset": np.array([v[JSON_MEMBER][0] for v in vals], dtype=np.int64),
        "json_size": np.array([v[JSON_MEMBER][1] for v in vals], dtype=np.int32),
    }


def default_index_cache() -> Path | None:
    """Where per-shard header scans are cached: $ADAPTER_TRAINER_INDEX_CACHE ("" = off), else
    $XDG_CACHE_HOME/adapter_trainer/shard-index (~/.cache/... by default)."""
    import os

    env = os.environ.get("ADAPTER_TRAINER_INDEX_CACHE")
    if env is not None:
        return Path(env).expanduser() if env else None
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "adapter_trainer" / "shard-index"


def _scan_cached(entry: ShardEntry, cache: Path | None) -> dict[str, np.ndarray]:
    """scan_shard, cached under `cache` by the shard's manifest sha256 + size (the shard's content identity).

    The header scan costs ~0.1-0.3 ms per member in Python's tarfile (seconds for 100k clips); the cache
    makes a restart cost one small .npz read per shard. Written atomically (temp + rename), so concurrent
    ranks on one node can share it.
    """
    if cache is None:
        return scan_shard(entry.tar)
    f = cache / f"{entry.sha256}-{entry.bytes}.npz"
    if f.is_file():
        try:
            with np.load(f, allow_pickle=False) as z:
                return {k: z[k] for k in _SCAN_FIELDS}
        except (OSError, ValueError, KeyError) as e:
            raise ShardFormatError(
                f"{f}: unreadable shard-index cache entry for {entry.tar} ({e}); delete the "
                f"file (it is rebuilt from the tar headers) or set ADAPTER_TRAINER_INDEX_CACHE=''"
            ) from e
    scan = scan_shard(entry.tar)
    import os

    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".{f.name}.{os.getpid()}.tmp.npz"
    np.savez(tmp, **scan)
    os.replace(tmp, f)
    return scan


def build_index(
    sets: list[ShardSet], split: str, *, max_clips: int = 0, sha256: bool = False, cache: Path | None | str = "default"
) -> SplitIndex:
    """Index `split` across `sets` from tar headers (no payload read); max_clips > 0 keeps the first N clips.

    Same checks as `load_split` that do not need the payload: files match the manifest (size, and sha256 if
    asked), member names, sample counts, keys unique across sets. Payload checks run when a clip is read.
    cache: a directory for per-shard scans, None for no cache, "default" for `default_index_cache()`.
    """
    cache_dir = default_index_cache() if cache == "default" else (Path(cache) if cache is not None else None)
    paths: list[str] = []
    parts: list[dict[str, np.ndarray]] = []
    n = 0
    for s in sets:
        verify_files(s, split, sha256=sha256)
        for entry in s.splits[split]:
            if max_clips and n >= max_clips:
                break
            scan = _scan_cached(entry, cache_dir)
            if len(scan["keys"]) != entry.n_samples:
                raise ShardFormatError(
                    f"{entry.tar}: {len(scan['keys'])} samples, but {s.manifest_path} lists "
                    f"{entry.n_samples}; regenerate the shard set"
                )
            if max_clips:
                scan = {k: v[: max_clips - n] for k, v in scan.items()}
            scan["shard"] = np.full(len(scan["keys"]), len(paths), dtype=np.int32)
            paths.append(str(entry.tar))
            parts.append(scan)
            n += len(scan["keys"])
    cols = {
        k: np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, np.int64) for k in (*_SCAN_FIELDS, "shard")
    }
    if parts:
        uniq, counts = np.unique(cols["keys"], return_counts=True)
        if (counts > 1).any():
            dup = uniq[counts > 1][0].decode("ascii")
            where = sorted({paths[int(i)] for i in cols["shard"][cols["keys"] == uniq[counts > 1][0]]})
            raise ShardFormatError(
                f"sample key {dup!r} appears more than once ({', '.join(where)}); keys must be "
                f"unique across data.shards (the same set listed twice?)"
            )
    return SplitIndex(
        shard_paths=tuple(paths),
        shard=cols["shard"].astype(np.int32),
        codes_offset=cols["codes_offset"],
        codes_size=cols["codes_size"],
        json_offset=cols["json_offset"],
        json_size=cols["json_size"],
        keys=cols["keys"] if parts else np.zeros(0, "S1"),
        n_codebooks=sets[0].n_codebooks,
        codebook_size=sets[0].codebook_size,
    )


class ClipReader:
    """Random access to indexed clips: seek + read two members, decode with the same checks as `iter_clips`.

    Keeps a few tar files open per process (a forked DataLoader worker opens its own: handles are per pid).
    """

    def __init__(self, index: SplitIndex, max_open: int = 16) -> None:
        self.index = index
        self.max_open = max_open
        self._pid = -1
        self._files: dict[int, object] = {}

    def _file(self, shard: int):
        import os

        if self._pid != os.getpid():  # forked: the parent's handles share a file position; open our own
            self._files, self._pid = {}, os.getpid()
        f = self._files.get(shard)
        if f is None:
            if len(self._files) >= self.max_open:
                self._files.pop(next(iter(self._files))).close()  # type: ignore[attr-defined]
            # an LRU of open handles kept across reads (closed on eviction and in close()): no `with` block
            f = self._files[shard] = open(self.index.shard_paths[shard], "rb")  # noqa: SIM115
        return f

    def read(self, i: int) -> Clip:
        ix = self.index
        shard = int(ix.shard[i])
        f = self._file(shard)
        f.seek(int(ix.codes_offset[i]))  # type: ignore[attr-defined]
        codes = f.read(int(ix.codes_size[i]))  # type: ignore[attr-defined]
        f.seek(int(ix.json_offset[i]))  # type: ignore[attr-defined]
        meta = f.read(int(ix.json_size[i]))  # type: ignore[attr-defined]
        sample = {"__key__": ix.key(i), CODES_MEMBER: codes, JSON_MEMBER: meta}
        return _decode_sample(sample, ix.shard_paths[shard], ix.n_codebooks, ix.codebook_size)

    def read_text_fields(self, i: int) -> tuple[str, tuple[str, ...]]:
        """(caption, aspects) of clip i from its json member alone: its codes are neither read nor decoded. Checks
        what the json can show without the codes (ytid, caption, aspect_list); `read` checks the rest."""
        ix = self.index
        shard = int(ix.shard[i])
        key, url = ix.key(i), ix.shard_paths[shard]
        f = self._file(shard)
        f.seek(int(ix.json_offset[i]))  # type: ignore[attr-defined]
        raw = f.read(int(ix.json_size[i]))  # type: ignore[attr-defined]
        try:
            meta = json.loads(raw.decode("utf-8"))
        except ValueError as e:  # JSON and Unicode errors
            raise ShardFormatError(f"{url}: sample {key!r} json does not decode: {e}") from e
        if (
            not isinstance(meta, dict)
            or meta.get("ytid") != key
            or not isinstance(meta.get("caption"), str)
            or not isinstance(meta.get("aspect_list"), list)
        ):
            raise ShardFormatError(
                f"{url}: sample {key!r} json disagrees with the sample (ytid / caption / aspect_list); regenerate the shard"
            )
        return meta["caption"], tuple(str(a) for a in meta["aspect_list"])

    def close(self) -> None:
        for f in self._files.values():
            f.close()  # type: ignore[attr-defined]
        self._files = {}

    def __getstate__(self) -> dict:  # picklable for spawn-started workers: no open files travel
        return {"index": self.index, "max_open": self.max_open, "_pid": -1, "_files": {}}
