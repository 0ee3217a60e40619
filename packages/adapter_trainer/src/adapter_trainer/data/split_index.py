"""The split index: where each clip of a split lives, from the set's index sidecar, or else from the tar headers.

A format-5 set lists each split's `index.safetensors` in its manifest (docs/shard-format.md#the-split-index): the
index is read from it (one small file, checked against the manifest's size and sha256 like a tar, fetched through the
shard cache for a remote set) and no tar is opened. Older sets are scanned as before, with an on-disk cache.

Memory: the recipe never holds a split's codes. `build_index` scans only the tar HEADERS (each member's name,
size and `offset_data`; no payload is read) and keeps a `SplitIndex` of ~40 bytes per clip in numpy arrays;
`ClipReader.read(i)` (adapter_trainer.data.clip_reader) then seeks to one clip's two members and decodes them with
the same checks. DataLoader workers read, crop, tokenize and collate (adapter_trainer.data.streaming).

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
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from adapter_trainer.data.remote.cache import RemoteShard, ShardCache
from adapter_trainer.data.remote.urls import join
from adapter_trainer.data.sample_keys import MAX_KEY_LEN, shard_path_problem
from adapter_trainer.data.samples import ALLOWED_MEMBERS, CODES_MEMBER, JSON_MEMBER, check_member
from adapter_trainer.data.shards import SHA256_HEX, ShardEntry, ShardFormatError, ShardSet, open_tar, verify_files


@dataclass(frozen=True)
class SplitIndex:
    """Where each clip of one split lives, across shard sets (in data.shards order, shard order, tar order).

    Numpy arrays only (no per-clip Python objects): ~40 bytes per clip with 11-character ytids, so a million
    clips cost ~40 MB per rank, not the ~5 GB of keeping the codes.
    """

    shard_paths: tuple[str, ...]  # tar paths or URLs (ShardEntry.location); `shard` below indexes into this
    shard: np.ndarray  # [N] int32
    codes_offset: np.ndarray  # [N] int64 byte offset of <key>.codes.npy's payload in its tar
    codes_size: np.ndarray  # [N] int32 payload bytes
    json_offset: np.ndarray  # [N] int64
    json_size: np.ndarray  # [N] int32
    keys: np.ndarray  # [N] fixed-width bytes (ytid, ASCII)
    n_codebooks: int  # K, for the decode checks
    codebook_size: int  # C
    # per shard: where a remote set's tar is fetched from (None: a local file); empty when every set is local
    shard_remote: tuple[RemoteShard | None, ...] = ()
    cache: ShardCache | None = None  # the remote tars' local cache (data.cache)
    # From format-5 index sidecars (None when a set of the split has none: an older set, scanned):
    weight: np.ndarray | None = None  # [N] float64 each clip's sample `weight`; NaN for the rows of an older set
    caption_digest: np.ndarray | None = None  # [N] uint64 digest of the caption (docs/shard-format.md)
    aspects_digest: np.ndarray | None = None  # [N] uint64 digest of the aspects joined with ", "
    code_counts: np.ndarray | None = None  # [K, C] int64 code counts of every clip of the split (all sets, all clips)

    def remote(self, shard: int) -> RemoteShard | None:
        return self.shard_remote[shard] if self.shard_remote else None

    def open_shard(self, shard: int) -> BinaryIO:
        """A read handle of shard `shard` (a remote one held in the cache until closed)."""
        r = self.remote(shard)
        if r is None or self.cache is None:
            return open(self.shard_paths[shard], "rb")
        return self.cache.open(r, what=f"shard {r.path or r.url}")

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


def scan_shard(path: Path | str, fileobj: BinaryIO | None = None) -> dict[str, np.ndarray]:
    """Tar headers only -> {keys, codes_offset, codes_size, json_offset, json_size} ([n] arrays, tar order).

    Every member must be a regular file `<key>.codes.npy` / `<key>.json`, and every key must have both.
    `tarfile` seeks over payloads when iterating a seekable file, so only 512-byte header blocks are read.
    """
    found: dict[str, dict[str, tuple[int, int]]] = {}
    # "r:" = uncompressed tar: offsets are file offsets
    with tarfile.open(path if fileobj is None else None, "r:", fileobj=fileobj) as tar:
        for m in tar:
            key, member = check_member(m, path)
            members = found.setdefault(key, {})
            if member in members:
                raise ShardFormatError(f"{path}: member {m.name!r} appears twice; regenerate the shard")
            members[member] = (m.offset_data, m.size)
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


def _scan_entry(entry: ShardEntry) -> dict[str, np.ndarray]:
    """scan_shard of a local tar, or of a remote one's verified cache copy (fetched if needed)."""
    with open_tar(entry) as f:
        return scan_shard(entry.location, f)


def default_index_cache() -> Path | None:
    """Where per-shard header scans are cached: $ADAPTER_TRAINER_INDEX_CACHE ("" = off), else
    $XDG_CACHE_HOME/adapter_trainer/shard-index (~/.cache/... by default)."""
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
        return _scan_entry(entry)
    f = cache / f"{entry.sha256}-{entry.bytes}.npz"
    if f.is_file():
        try:
            with np.load(f, allow_pickle=False) as z:
                return {k: z[k] for k in _SCAN_FIELDS}
        except (OSError, ValueError, KeyError) as e:
            raise ShardFormatError(
                f"{f}: unreadable shard-index cache entry for {entry.location} ({e}); delete the "
                f"file (it is rebuilt from the tar headers) or set ADAPTER_TRAINER_INDEX_CACHE=''"
            ) from e
    scan = _scan_entry(entry)
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
    remotes: list[RemoteShard | None] = []
    shard_cache: ShardCache | None = None
    parts: list[dict[str, np.ndarray]] = []
    n = 0
    indexed: list[dict[str, np.ndarray] | None] = []  # per set: its sidecar's columns (rows kept), or None
    counts_parts: list[np.ndarray] = []
    for s in sets:
        verify_files(s, split, sha256=sha256)
        side = read_set_index(s, split)
        if side is not None:
            entries = s.splits[split]
            rows = np.repeat(np.arange(len(entries)), [e.n_samples for e in entries])  # [n] shard within the set
            keep = len(rows) if not max_clips else max(0, min(len(rows), max_clips - n))
            used = int(rows[keep - 1]) + 1 if keep else 0
            part = {k: v[:keep] for k, v in side.items() if k != "code_counts"}
            part["shard"] = (len(paths) + rows[:keep]).astype(np.int32)
            for entry in entries[:used]:
                paths.append(entry.location)
                remotes.append(entry.remote)
                shard_cache = shard_cache or entry.cache
            if keep == len(rows):
                counts_parts.append(side["code_counts"])
            parts.append(part)
            indexed.append(part)
            n += keep
            continue
        indexed.append(None)
        for entry in s.splits[split]:
            if max_clips and n >= max_clips:
                break
            scan = _scan_cached(entry, cache_dir)
            if len(scan["keys"]) != entry.n_samples:
                raise ShardFormatError(
                    f"{entry.location}: {len(scan['keys'])} samples, but {s.manifest_path} lists "
                    f"{entry.n_samples}; regenerate the shard set"
                )
            if max_clips:
                scan = {k: v[: max_clips - n] for k, v in scan.items()}
            scan["shard"] = np.full(len(scan["keys"]), len(paths), dtype=np.int32)
            paths.append(entry.location)
            remotes.append(entry.remote)
            shard_cache = shard_cache or entry.cache
            parts.append(scan)
            n += len(scan["keys"])
    cols = {
        k: np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, np.int64) for k in (*_SCAN_FIELDS, "shard")
    }
    all_indexed = bool(sets) and all(x is not None for x in indexed)
    extra: dict[str, np.ndarray | None] = {"weight": None, "caption_digest": None, "aspects_digest": None}
    if any(x is not None for x in indexed):
        extra["weight"] = np.concatenate(
            [p["weight"] if "weight" in p else np.full(len(p["keys"]), np.nan) for p in parts]
        )
    if all_indexed:
        for k in ("caption_digest", "aspects_digest"):
            extra[k] = np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, np.uint64)
    code_counts = None
    if all_indexed and len(counts_parts) == len(sets):  # every clip of every set: the split's code counts
        code_counts = np.sum(counts_parts, axis=0) if counts_parts else None
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
        shard_remote=tuple(remotes) if any(r is not None for r in remotes) else (),
        cache=shard_cache,
        code_counts=code_counts,
        **extra,  # type: ignore[arg-type]
    )


INDEX_TENSORS = ("key", "codes_offset", "codes_size", "json_offset", "json_size", "weight", "caption_digest",
                 "aspects_digest", "code_counts")  # fmt: skip
_KEY_BYTES = np.zeros(256, dtype=bool)  # the bytes a key may hold (A-Z a-z 0-9 _ -), for a vectorised key check
for _c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-":
    _KEY_BYTES[_c] = True


def index_entry(s: ShardSet, split: str) -> dict | None:
    """The manifest's `splits.<split>.index` of a format-5 set; None for an older set (its tars are scanned)."""
    if s.format_version < 5:
        return None
    entry = dict(s.manifest.get("splits", {}).get(split) or {}).get("index")
    fix = "regenerate the set with python -m tokenizer_pipeline, or check it with python -m tokenizer_pipeline.verify"
    want = f"{split}/index.safetensors"
    if not isinstance(entry, dict) or entry.get("path") != want:
        raise ShardFormatError(f"{s.manifest_path}: split {split!r} lists no index {want!r} (format 5); {fix}")
    sha, size = entry.get("sha256"), entry.get("bytes")
    if not isinstance(sha, str) or not SHA256_HEX.fullmatch(sha) or not isinstance(size, int) or size < 0:
        raise ShardFormatError(f"{s.manifest_path}: split {split!r} index has sha256={sha!r}, bytes={size!r}; {fix}")
    return entry


def read_index_bytes(s: ShardSet, entry: dict) -> bytes:
    """The sidecar's bytes, checked against the manifest's size and sha256 (a remote set's: through its shard cache,
    which verifies them before use)."""
    rel = str(entry["path"])
    where = join(str(s.root), rel) if s.is_remote else str(s.root / rel)  # type: ignore[operator]
    fix = f"re-copy the set, or rewrite it with python -m tokenizer_pipeline (its manifest: {s.manifest_path})"
    if s.is_remote:
        return _remote_index_bytes(s, entry, where)
    problem = shard_path_problem(s.root, rel)  # type: ignore[arg-type]
    if problem:
        raise ShardFormatError(f"{s.manifest_path}: index path {rel!r} {problem}; refusing the set")
    try:
        data = (s.root / rel).read_bytes()  # type: ignore[operator]
    except OSError as e:
        raise ShardFormatError(f"{where}: listed in {s.manifest_path} but not readable ({e}); {fix}") from e
    if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise ShardFormatError(f"{where}: size or sha256 differs from {s.manifest_path} (corrupt or replaced); {fix}")
    return data


def _remote_index_bytes(s: ShardSet, entry: dict, where: str) -> bytes:
    """A remote set's sidecar: read from the shard cache's `indexes/` by its sha256, else fetched (retried), checked
    and kept there while data.cache.max_bytes has room (it counts against the bound like a tar). Fetched once per
    node: the ranks sharing the cache take the download lock of the sidecar's sha256, as for a tar, and the ones that
    waited read the node's copy (or fetch it themselves when there was no room to keep it)."""
    from adapter_trainer.data.remote.retry import with_retries
    from adapter_trainer.data.remote.urls import filesystem

    sha, size = entry["sha256"], entry["bytes"]
    cache = next((e.cache for entries in s.splits.values() for e in entries if e.cache is not None), None)

    def fetch() -> bytes:
        fs, path = filesystem(where)
        data = with_retries(lambda: fs.cat_file(path), what=f"index {entry['path']}", url=where,
                            tries=cache.tries if cache is not None else 5)  # fmt: skip
        if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
            raise ShardFormatError(
                f"{where}: {len(data)} bytes with another sha256 than {s.manifest_path} lists; the copy at the URL is "
                f"corrupt or was replaced after the manifest: re-push the set with python -m tokenizer_pipeline.push"
            )
        return data

    if cache is None:
        return fetch()
    keep = cache.index_path(sha)

    def kept() -> bytes | None:
        try:
            data = keep.read_bytes()
        except FileNotFoundError:  # never kept, or evicted by another process of the node
            return None
        return data if len(data) == size and hashlib.sha256(data).hexdigest() == sha else None

    data = kept()
    if data is not None:
        return data
    with cache.download_lock(sha):  # one download per node; the other ranks wait here, then read the node's copy
        data = kept()
        if data is None:
            data = fetch()
            cache.keep_index(sha, data)
    return data


def read_set_index(s: ShardSet, split: str) -> dict[str, np.ndarray] | None:
    """A format-5 set's index of `split` as build_index's columns (keys, offsets, sizes, weight, digests) plus its
    code_counts [K, C]; None for an older set. Checked: the manifest's size and sha256, every column one row per
    sample the manifest lists, keys by the key rule."""
    entry = index_entry(s, split)
    if entry is None:
        return None
    from safetensors import SafetensorError
    from safetensors.numpy import load

    rel = entry["path"]
    data = read_index_bytes(s, entry)
    where = f"{s.root}/{rel}"
    fix = "regenerate the set with python -m tokenizer_pipeline (python -m tokenizer_pipeline.verify names the problem)"
    try:
        t = load(data)
    except (SafetensorError, ValueError) as e:
        raise ShardFormatError(f"{where}: not a readable index ({e}); {fix}") from e
    n = sum(e.n_samples for e in s.splits[split])
    missing = [k for k in INDEX_TENSORS if k not in t]
    if missing:
        raise ShardFormatError(f"{where}: index lacks {missing}; {fix}")
    key = t["key"]
    bad_shape = [k for k in INDEX_TENSORS[1:-1] if t[k].shape != (n,)]
    if key.dtype != np.uint8 or key.ndim != 2 or key.shape[0] != n or not 1 <= key.shape[1] <= MAX_KEY_LEN or bad_shape:
        raise ShardFormatError(
            f"{where}: index columns do not hold one row per sample of the {n} {s.manifest_path} lists for split "
            f"{split!r} ({', '.join(bad_shape) or 'key'}); {fix}"
        )
    if t["code_counts"].shape != (s.n_codebooks, s.codebook_size):
        raise ShardFormatError(f"{where}: code_counts has shape {t['code_counts'].shape}, expected "
                               f"({s.n_codebooks}, {s.codebook_size}); {fix}")  # fmt: skip
    # the key rule on every key at once: allowed bytes, then zero padding only, never empty
    filled = key != 0
    if n and (
        not (_KEY_BYTES[key] | ~filled).all()
        or not filled[:, 0].all()
        or (np.diff(filled.astype(np.int8), axis=1) > 0).any()
    ):
        raise ShardFormatError(f"{where}: an index key breaks the key rule (1-{MAX_KEY_LEN} of A-Z a-z 0-9 _ -); {fix}")
    return {
        "keys": np.ascontiguousarray(key).view(f"S{key.shape[1]}").reshape(n),
        "codes_offset": t["codes_offset"].astype(np.int64),
        "codes_size": t["codes_size"].astype(np.int32),
        "json_offset": t["json_offset"].astype(np.int64),
        "json_size": t["json_size"].astype(np.int32),
        "weight": t["weight"].astype(np.float64),
        "caption_digest": t["caption_digest"].astype(np.uint64),
        "aspects_digest": t["aspects_digest"].astype(np.uint64),
        "code_counts": t["code_counts"].astype(np.int64),
    }
